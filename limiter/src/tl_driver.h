/*
 * tl_driver.h - GPUs whose memory the driver holds for this container.
 *
 * Where NVIDIA's driver partitions GPU memory per cgroup (r615 and later,
 * cgroup v2, MIG off), the node agent's createContainer hook sets the
 * container's limits in the driver (soft = its guarantee, hard = its
 * ceiling) and confirms them in a file the agent mounts read-only at
 * TL_DRIVER_PATH (written by internal/nodeagent/memlimits: change them
 * together). Its lines "device=<UUID> ..." name the GPUs the driver holds;
 * for those the limiter drops its own memory limit (the driver refuses
 * past the hard limit and reports it as the total) and keeps compute
 * pacing. No file, an empty one or one that does not parse: the limiter
 * keeps every memory limit of the limits file.
 */
#ifndef TL_DRIVER_H
#define TL_DRIVER_H

#include "tl_config.h"

#define TL_DRIVER_PATH "/etc/tessera/driver-memory"

/* Applies the confirmation file at path (text of len bytes) to a config
 * read from a limits file: the memory limit of each device it names is
 * dropped. Returns how many devices it dropped; -1 (nothing dropped) when
 * the text does not parse. Pure. */
int tl_driver_apply_text(tl_config *c, const char *text, size_t len);

/* Reads path and applies it (tl_driver_apply_text). Returns the same; 0
 * when there is no file. */
int tl_driver_apply(tl_config *c, const char *path);

#endif
