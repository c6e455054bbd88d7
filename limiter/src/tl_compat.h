/*
 * tl_compat.h - included first by every source file of the library.
 *
 * The library is preloaded into containers built on any glibc from 2.17
 * (CentOS 7) on, so it must not ask for a symbol version newer than
 * GLIBC_2.17: a preload that fails to load leaves the container unlimited
 * (ld.so prints a warning and goes on). Building on a newer glibc binds
 * dlopen, pthread_create, ... to their 2.34 versions (when libdl and
 * libpthread were merged into libc), stat to 2.33 and exp to 2.29. The
 * directives below bind each to its oldest version instead, which every
 * glibc since exports; the library is linked against libdl.so.2 and
 * libpthread.so.0 so that, on a glibc before 2.34, the dl and pthread
 * symbols are found where they live then. stat/fstat and fcntl are not used
 * at all (fcntl goes through syscall()). limiter/test/check_glibc.sh checks
 * the result with objdump and readelf in `make test`.
 */
#ifndef TL_COMPAT_H
#define TL_COMPAT_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#if defined(__x86_64__)
#define TL_GLIBC_BASE "GLIBC_2.2.5"
#define TL_GLIBC_ROBUST "GLIBC_2.12"
#elif defined(__aarch64__)
#define TL_GLIBC_BASE "GLIBC_2.17"
#define TL_GLIBC_ROBUST "GLIBC_2.17"
#endif

#if defined(TL_GLIBC_BASE) && !defined(TL_NO_SYMVER)
#define TL_SYMVER(sym, ver) __asm__(".symver " #sym "," #sym "@" ver)
TL_SYMVER(dlopen, TL_GLIBC_BASE);
TL_SYMVER(dlvsym, TL_GLIBC_BASE); /* not dlsym: the library defines its own */
TL_SYMVER(dlerror, TL_GLIBC_BASE);
TL_SYMVER(dladdr, TL_GLIBC_BASE);
TL_SYMVER(pthread_create, TL_GLIBC_BASE);
TL_SYMVER(pthread_once, TL_GLIBC_BASE);
TL_SYMVER(pthread_mutexattr_init, TL_GLIBC_BASE);
TL_SYMVER(pthread_mutexattr_destroy, TL_GLIBC_BASE);
TL_SYMVER(pthread_mutexattr_setpshared, TL_GLIBC_BASE);
TL_SYMVER(pthread_mutex_timedlock, TL_GLIBC_BASE);
TL_SYMVER(pthread_mutex_trylock, TL_GLIBC_BASE);
TL_SYMVER(pthread_mutexattr_setrobust, TL_GLIBC_ROBUST);
TL_SYMVER(pthread_mutex_consistent, TL_GLIBC_ROBUST);
TL_SYMVER(pthread_attr_init, TL_GLIBC_BASE);
TL_SYMVER(pthread_attr_destroy, TL_GLIBC_BASE);
TL_SYMVER(pthread_attr_setdetachstate, TL_GLIBC_BASE);
TL_SYMVER(exp, TL_GLIBC_BASE);
#endif

#endif
