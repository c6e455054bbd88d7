/* tl_table.h - per-process table of live allocations: key -> (size, device). */
#ifndef TL_TABLE_H
#define TL_TABLE_H

#include <stdint.h>

enum { TL_K_PTR = 1, TL_K_HANDLE = 2, TL_K_ARRAY = 3, TL_K_MIPMAP = 4, TL_K_CTX = 5, TL_K_GEXEC = 6 };

/* Insert; returns 0, or -1 if out of memory. */
int tl_table_put(int kind, uint64_t key, uint64_t size, int dev);
/* Remove; returns 1 and fills size/dev if found, else 0. */
int tl_table_take(int kind, uint64_t key, uint64_t *size, int *dev);
/* Look up without removing; returns 1 and fills size/dev if found, else 0. */
int tl_table_get(int kind, uint64_t key, uint64_t *size, int *dev);
/* Forget everything. */
void tl_table_reset(void);
/* In a fork child: forget everything without taking the lock, which a
 * thread that no longer exists may have held at fork time. */
void tl_table_reset_after_fork(void);
/* Number of live entries (tests). */
uint64_t tl_table_count(void);

#endif
