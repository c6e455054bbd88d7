/* tl_size.c - see tl_size.h. */
#include "tl_compat.h"

#include "tl_size.h"

uint64_t tl_sat_mul(uint64_t a, uint64_t b)
{
    uint64_t r;
    return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}

uint64_t tl_sat_add(uint64_t a, uint64_t b)
{
    return a + b < a ? UINT64_MAX : a + b;
}

uint64_t tl_format_bytes(int f)
{
    switch (f) {
    case 0x01: case 0x08: return 1;            /* (un)signed int8 */
    case 0x02: case 0x09: case 0x10: return 2; /* (un)signed int16, half */
    case 0x03: case 0x0a: case 0x20: return 4; /* (un)signed int32, float */
    default: return 4;
    }
}

uint64_t tl_array_bytes(size_t w, size_t h, size_t d, int fmt, unsigned ch)
{
    uint64_t b = tl_sat_mul(w ? w : 1, h ? h : 1);
    b = tl_sat_mul(b, d ? d : 1);
    b = tl_sat_mul(b, ch ? ch : 1);
    return tl_sat_mul(b, tl_format_bytes(fmt));
}

uint64_t tl_mipmap_bytes(const TL_ARRAY3D_DESCRIPTOR *a, unsigned levels)
{
    uint64_t total = 0;
    size_t w = a->Width, h = a->Height, d = a->Depth;
    if (levels == 0)
        levels = 1;
    for (unsigned l = 0; l < levels && l < 64; l++) {
        total = tl_sat_add(total, tl_array_bytes(w, h, d, a->Format, a->NumChannels));
        w = w > 1 ? w / 2 : 1;
        h = h > 1 ? h / 2 : h;
        d = d > 1 ? d / 2 : d;
    }
    return total;
}
