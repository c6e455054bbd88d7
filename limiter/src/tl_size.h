/* tl_size.h - sizes the limiter estimates from descriptors. Pure. */
#ifndef TL_SIZE_H
#define TL_SIZE_H

#include <stddef.h>
#include <stdint.h>

#include "tl_cuda.h"

/* a * b, or UINT64_MAX on overflow */
uint64_t tl_sat_mul(uint64_t a, uint64_t b);
/* a + b, or UINT64_MAX on overflow */
uint64_t tl_sat_add(uint64_t a, uint64_t b);
/* Bytes per channel element of a CUarray_format; unknown (newer or block
 * compressed) formats count 4. */
uint64_t tl_format_bytes(int format);
/* width x height x depth x channels x element size (0 dimensions count 1) */
uint64_t tl_array_bytes(size_t w, size_t h, size_t d, int format, unsigned channels);
/* the levels of a mipmapped array, each halving the dimensions */
uint64_t tl_mipmap_bytes(const TL_ARRAY3D_DESCRIPTOR *a, unsigned levels);

#endif
