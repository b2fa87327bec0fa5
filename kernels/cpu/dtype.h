/* dtype.h - scalar conversions between fp32 and the KV cache's element types (kvs_dtype), rounding to
 * nearest even, header-only so the host kernels, the CUDA module and the mini engine compute the same
 * bits. fp8 e4m3 is the "fn" variant (no infinity, saturates at +-448); e5m2 is IEEE-like. */
#ifndef KVS_DTYPE_H
#define KVS_DTYPE_H

#include <stdint.h>
#include <string.h>

#include "abi/kvstrata.h"

#if defined(__CUDACC__)
#define KVS_HD static inline __host__ __device__
#else
#define KVS_HD static inline
#endif

KVS_HD uint32_t kvs_float_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

KVS_HD float kvs_bits_float(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Round the integer mantissa m right by `shift` bits (1..31), ties to even. */
KVS_HD uint32_t kvs_shift_round_even(uint32_t m, uint32_t shift) {
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return q;
}

KVS_HD uint16_t kvs_f32_to_f16(float f) {
    uint32_t x = kvs_float_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);  /* NaN */
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to infinity */
    if (ax < 0x38800000u) { /* below 2^-14: subnormal half, units of 2^-24 */
        uint32_t e = ax >> 23;
        if (e < 102u) return (uint16_t)sign; /* below 2^-25: rounds to zero */
        uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        return (uint16_t)(sign | kvs_shift_round_even(m, 126u - e));
    }
    /* Normal: rebias the exponent (127 -> 15); a carry out of the mantissa bumps the exponent. */
    return (uint16_t)(sign | kvs_shift_round_even(ax - 0x38000000u, 13u));
}

KVS_HD float kvs_f16_to_f32(uint16_t h) {
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
    uint32_t e = ((uint32_t)h >> 10) & 0x1fu;
    uint32_t m = (uint32_t)h & 0x3ffu;
    if (e == 0) {
        float v = (float)m * 0x1p-24f;
        return sign ? -v : v;
    }
    if (e == 31) return kvs_bits_float(sign | 0x7f800000u | (m << 13));
    return kvs_bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

KVS_HD uint16_t kvs_f32_to_bf16(float f) {
    uint32_t x = kvs_float_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* NaN stays NaN */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

KVS_HD float kvs_bf16_to_f32(uint16_t h) {
    return kvs_bits_float((uint32_t)h << 16);
}

/* e4m3 "fn": bias 7, no infinity, 0x7f is NaN, largest finite 448. */
KVS_HD uint8_t kvs_f32_to_e4m3(float f) {
    uint32_t x = kvs_float_bits(f);
    uint32_t sign = (x >> 24) & 0x80u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint8_t)(sign | 0x7fu);
    if (ax >= 0x43e00000u) return (uint8_t)(sign | 0x7eu); /* >= 448 (and infinity): saturate */
    if (ax < 0x3c800000u) {                                /* below 2^-6: subnormal, 2^-9 units */
        uint32_t e = ax >> 23;
        if (e < 117u) return (uint8_t)sign; /* below 2^-10: rounds to zero */
        uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        return (uint8_t)(sign | kvs_shift_round_even(m, 141u - e));
    }
    return (uint8_t)(sign | kvs_shift_round_even(ax - 0x3c000000u, 20u));
}

KVS_HD float kvs_e4m3_to_f32(uint8_t b) {
    uint32_t sign = ((uint32_t)b & 0x80u) << 24;
    uint32_t e = ((uint32_t)b >> 3) & 0xfu;
    uint32_t m = (uint32_t)b & 7u;
    if (e == 15 && m == 7) return kvs_bits_float(sign | 0x7fc00000u);
    if (e == 0) {
        float v = (float)m * 0x1p-9f;
        return sign ? -v : v;
    }
    return kvs_bits_float(sign | ((e + 120u) << 23) | (m << 20));
}

/* e5m2: bias 15 like fp16 with two mantissa bits; largest finite 57344, overflow to infinity. */
KVS_HD uint8_t kvs_f32_to_e5m2(float f) {
    uint32_t x = kvs_float_bits(f);
    uint32_t sign = (x >> 24) & 0x80u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint8_t)(sign | 0x7eu);  /* NaN */
    if (ax >= 0x47700000u) return (uint8_t)(sign | 0x7cu); /* >= 61440 rounds to infinity */
    if (ax < 0x38800000u) {                                /* below 2^-14: subnormal, 2^-16 units */
        uint32_t e = ax >> 23;
        if (e < 110u) return (uint8_t)sign; /* below 2^-17: rounds to zero */
        uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        return (uint8_t)(sign | kvs_shift_round_even(m, 134u - e));
    }
    return (uint8_t)(sign | kvs_shift_round_even(ax - 0x38000000u, 21u));
}

KVS_HD float kvs_e5m2_to_f32(uint8_t b) {
    return kvs_f16_to_f32((uint16_t)((uint16_t)b << 8));
}

/* Bytes per element; 0 for an unknown dtype. */
KVS_HD uint32_t kvs_dtype_bytes(uint32_t dtype) {
    switch (dtype) {
        case KVS_DTYPE_FP16:
        case KVS_DTYPE_BF16: return 2;
        case KVS_DTYPE_FP32: return 4;
        case KVS_DTYPE_FP8_E4M3:
        case KVS_DTYPE_FP8_E5M2: return 1;
        default: return 0;
    }
}

/* Element i of an array of dtype at p, as fp32. */
KVS_HD float kvs_dtype_load(uint32_t dtype, const void *p, uint64_t i) {
    const uint8_t *b = (const uint8_t *)p;
    uint16_t h;
    float f;
    switch (dtype) {
        case KVS_DTYPE_FP16: memcpy(&h, b + 2 * i, 2); return kvs_f16_to_f32(h);
        case KVS_DTYPE_BF16: memcpy(&h, b + 2 * i, 2); return kvs_bf16_to_f32(h);
        case KVS_DTYPE_FP32: memcpy(&f, b + 4 * i, 4); return f;
        case KVS_DTYPE_FP8_E4M3: return kvs_e4m3_to_f32(b[i]);
        case KVS_DTYPE_FP8_E5M2: return kvs_e5m2_to_f32(b[i]);
        default: return 0.0f;
    }
}

/* Store v as element i of an array of dtype at p, rounded to nearest even. */
KVS_HD void kvs_dtype_store(uint32_t dtype, void *p, uint64_t i, float v) {
    uint8_t *b = (uint8_t *)p;
    uint16_t h;
    switch (dtype) {
        case KVS_DTYPE_FP16:
            h = kvs_f32_to_f16(v);
            memcpy(b + 2 * i, &h, 2);
            break;
        case KVS_DTYPE_BF16:
            h = kvs_f32_to_bf16(v);
            memcpy(b + 2 * i, &h, 2);
            break;
        case KVS_DTYPE_FP32: memcpy(b + 4 * i, &v, 4); break;
        case KVS_DTYPE_FP8_E4M3: b[i] = kvs_f32_to_e4m3(v); break;
        case KVS_DTYPE_FP8_E5M2: b[i] = kvs_f32_to_e5m2(v); break;
        default: break;
    }
}

#endif
