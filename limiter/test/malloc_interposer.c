/* A test allocator that replaces malloc and its family the way tcmalloc
 * and jemalloc do when they are preloaded: every allocation of the
 * process (the limiter's own included) comes from here, never from
 * glibc. Memory is carved from mmap'd arenas with a size header; free
 * keeps nothing (the tests are short). TEST_MALLOC_MARK names a file
 * where, at exit, the number of allocations served is written, so a test
 * can tell that the library loaded and was used. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define ARENA (64UL << 20)
#define ALIGN 16

static char *arena_next, *arena_end;
static unsigned long served;
static int lock;

static void take(void)
{
    while (__atomic_exchange_n(&lock, 1, __ATOMIC_ACQUIRE))
        ;
}

static void give(void) { __atomic_store_n(&lock, 0, __ATOMIC_RELEASE); }

/* size bytes aligned to align (a power of two >= ALIGN), with the size
 * stored in the 16 bytes before the block. */
static void *carve(size_t size, size_t align)
{
    if (size > (1UL << 40)) {
        errno = ENOMEM;
        return NULL;
    }
    size_t need = size + align + ALIGN;
    take();
    if (!arena_next || (size_t)(arena_end - arena_next) < need) {
        size_t len = need > ARENA ? need : ARENA;
        void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) {
            give();
            errno = ENOMEM;
            return NULL;
        }
        arena_next = m;
        arena_end = (char *)m + len;
    }
    uintptr_t p = ((uintptr_t)arena_next + ALIGN + align - 1) & ~(uintptr_t)(align - 1);
    arena_next = (char *)p + size;
    served++;
    give();
    ((size_t *)p)[-1] = size;
    return (void *)p;
}

void *malloc(size_t size) { return carve(size, ALIGN); }
void free(void *p) { (void)p; }
void *calloc(size_t n, size_t size)
{
    if (size && n > (size_t)-1 / size) {
        errno = ENOMEM;
        return NULL;
    }
    return carve(n * size, ALIGN); /* fresh mmap'd memory is zero */
}
size_t malloc_usable_size(void *p) { return p ? ((size_t *)p)[-1] : 0; }
void *realloc(void *old, size_t size)
{
    void *p = carve(size, ALIGN);
    if (p && old) {
        size_t n = malloc_usable_size(old);
        memcpy(p, old, n < size ? n : size);
    }
    return p;
}
void *memalign(size_t align, size_t size) { return carve(size, align < ALIGN ? ALIGN : align); }
void *aligned_alloc(size_t align, size_t size) { return memalign(align, size); }
int posix_memalign(void **out, size_t align, size_t size)
{
    void *p = memalign(align, size);
    if (!p)
        return ENOMEM;
    *out = p;
    return 0;
}
void *valloc(size_t size) { return memalign(4096, size); }
void *pvalloc(size_t size) { return memalign(4096, (size + 4095) & ~4095UL); }

__attribute__((destructor)) static void mark(void)
{
    const char *path = getenv("TEST_MALLOC_MARK");
    if (!path || !*path)
        return;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, 0644);
    if (fd < 0)
        return;
    char buf[32];
    int i = sizeof buf;
    unsigned long v = served;
    buf[--i] = '\n';
    do {
        buf[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v && i > 0);
    (void)!write(fd, buf + i, sizeof buf - i);
    close(fd);
}
