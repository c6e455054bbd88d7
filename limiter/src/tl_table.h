/* tl_table.h - per-process table of live objects: (kind, key) -> (size,
 * device, aux). Allocations (pointer, array, context...) map to what they
 * were charged; VMM handles keep their reference and mapping counts in aux;
 * graph execs keep their bytes and trim generation. */
#ifndef TL_TABLE_H
#define TL_TABLE_H

#include <stdint.h>

enum {
    TL_K_PTR = 1,    /* device pointer: size charged */
    TL_K_HANDLE = 2, /* VMM handle: size charged, aux = refs | maps << 32 */
    TL_K_ARRAY = 3,
    TL_K_MIPMAP = 4,
    TL_K_CTX = 5,    /* created context: size charged, aux = CUDA ordinal */
    TL_K_GEXEC = 6,  /* graph exec with alloc nodes: bytes, dev = device | trim generation */
    TL_K_APTR = 7,   /* stream-ordered allocation: size, aux = its pool */
    TL_K_LIMIT = 8,  /* context limit (key = ctx * 4 + CUlimit): bytes charged, aux = baseline */
};

/* Insert or replace; returns 0, or -1 if out of memory. */
int tl_table_put(int kind, uint64_t key, uint64_t size, int dev);
int tl_table_put_aux(int kind, uint64_t key, uint64_t size, int dev, uint64_t aux);
/* Remove; returns 1 and fills the out fields (any may be NULL) if found, else 0. */
int tl_table_take(int kind, uint64_t key, uint64_t *size, int *dev);
int tl_table_take_aux(int kind, uint64_t key, uint64_t *size, int *dev, uint64_t *aux);
/* Look up without removing; returns 1 and fills the out fields if found, else 0. */
int tl_table_get(int kind, uint64_t key, uint64_t *size, int *dev);
int tl_table_get_aux(int kind, uint64_t key, uint64_t *size, int *dev, uint64_t *aux);
/* Forget everything. */
void tl_table_reset(void);
/* In a fork child: forget everything without taking the lock, which a
 * thread that no longer exists may have held at fork time. */
void tl_table_reset_after_fork(void);
/* Number of live entries (tests). */
uint64_t tl_table_count(void);

#endif
