/*
 * tl_procaddr.h - which variant of a CUDA driver entry point
 * cuGetProcAddress hands out. Pure (no I/O, no globals).
 *
 * cudart and applications ask cuGetProcAddress[_v2] for a base name
 * ("cuMemAlloc") and a version; the driver returns the variant introduced
 * last at or before that version (cuMemAlloc: the v1 function for 2000,
 * cuMemAlloc_v2 from 3020 on), and with the per-thread-default-stream flag
 * the _ptsz form of that variant where one exists. cudart 11.x/12.x ask each
 * entry point with the version of the variant they were built against (e.g.
 * cuDevicePrimaryCtxRelease with 7000, which is the v1 function); other
 * callers pass their CUDA version (11000..13xxx). The table below lists, for
 * every entry point the limiter intercepts (and a few it calls), each
 * variant and the version that introduced it, as in cudaTypedefs.h; a test
 * checks it against the real libcuda (driver 535) for every version 11.0 to
 * 12.2 and both flags.
 */
#ifndef TL_PROCADDR_H
#define TL_PROCADDR_H

#include <stddef.h>

/* The newest CUDA version the table is complete for: 13.x. For versions
 * from 14.0 on, a variant the table does not know may exist. */
#define TL_PA_NEWEST 13999

/* Writes the variant name for `base` asked at `version` with `flags` into
 * out (n bytes). Returns 0, or -1 when base is not in the table, the
 * version predates its first variant, or out is too small. */
int tl_pa_resolve(const char *base, int version, unsigned long long flags, char *out, size_t n);

/* 1 if base is in the table. */
int tl_pa_known(const char *base);

/* The i-th base name of the table (for tests), NULL past the end. */
const char *tl_pa_base(int i);

#endif
