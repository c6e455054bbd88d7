/* tl_driver.c - GPUs whose memory the driver holds (tl_driver.h). */
#include "tl_driver.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

int tl_driver_apply_text(tl_config *c, const char *text, size_t len)
{
    if (!c->from_file || c->error)
        return 0;
    int drop[TL_MAX_DEVICES] = {0};
    const char *p = text, *end = text + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        if (le - p > 7 && !memcmp(p, "device=", 7)) {
            const char *u = p + 7, *ue = u;
            while (ue < le && *ue != ' ')
                ue++;
            char uuid[TL_UUID_STR];
            unsigned char bin[16];
            if ((size_t)(ue - u) >= sizeof(uuid))
                return -1;
            memcpy(uuid, u, (size_t)(ue - u));
            uuid[ue - u] = 0;
            if (tl_uuid_parse(uuid, bin) != 0)
                return -1;
            for (int i = 0; i < c->ndev; i++)
                if (!memcmp(c->uuid_bin[i], bin, 16))
                    drop[i] = 1;
        } else if (le > p && *p != '#' && (le - p < 7 || memcmp(p, "cgroup=", 7))) {
            return -1;
        }
        p = le + 1;
    }
    int n = 0;
    c->mem_active = 0;
    for (int i = 0; i < TL_MAX_DEVICES; i++) {
        if (drop[i] && c->mem_limit[i]) {
            c->mem_limit[i] = 0;
            n++;
        }
        if (c->mem_limit[i])
            c->mem_active = 1;
    }
    return n;
}

int tl_driver_apply(tl_config *c, const char *path)
{
    if (!c->from_file || c->error)
        return 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0)
        return 0;
    static char buf[TL_CONF_MAX_BYTES];
    size_t n = 0;
    for (;;) {
        ssize_t r = read(fd, buf + n, sizeof(buf) - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0 || (n += (size_t)r) == sizeof(buf))
            break;
    }
    close(fd);
    return tl_driver_apply_text(c, buf, n);
}
