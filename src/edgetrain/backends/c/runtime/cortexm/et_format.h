/* The firmware's number formatting without newlib's printf.
 *
 * main.c prints `step <n> loss <%.9g of the float>` and the stack high-water mark. Through
 * snprintf that linked newlib's formatted output, its dtoa and bignum code and malloc (about
 * 20 KB of flash, more than the code of a model's training step). These two functions print
 * the same text: et_format_u an unsigned decimal, et_format_g9 exactly what C's "%.9g" prints
 * for a float widened to double (the host driver's text): the float's exact binary value
 * in decimal (a small base-1e9 bignum), rounded to 9 significant digits half to even, in %g's
 * fixed or exponent form with trailing zeros removed; "inf", "nan" with their sign.
 * tests/backends/c/test_firmware_format.py checks them against the host's printf. */
#ifndef ET_FORMAT_H
#define ET_FORMAT_H

#include <stdint.h>
#include <string.h>

/* 9 significant digits: a float round-trips through them */
#define ET_G_DIGITS 9
/* a float's exact value m * 2^e: m < 2^24, -149 <= e <= 104, so m * 5^149 < 10^113 and
   m * 2^104 < 10^39: 13 limbs of 9 decimal digits */
#define ET_BIG_LIMBS 13
#define ET_BIG_BASE 1000000000u

/* writes the decimal digits of v (no sign) into out; returns their count */
static int et_format_u(char *out, unsigned long v)
{
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10u);
        v /= 10u;
    } while (v);
    for (int i = 0; i < n; ++i)
        out[i] = tmp[n - 1 - i];
    out[n] = 0;
    return n;
}

/* big[0..*len) (base 1e9, least significant first) times k (2 or 5). A limb's product t is
   below 5e9 + 5 < 2^33: t / 1e9 = (t >> 9) / 1953125 (1e9 = 2^9 * 1953125) in 32 bits, and the
   remainder below 1e9 is exact modulo 2^32, so no 64-bit division (libgcc's __udivmoddi4,
   0.7 KB of flash) is linked. */
static void et_big_mul(uint32_t *big, int *len, uint32_t k)
{
    uint32_t carry = 0;
    for (int i = 0; i < *len; ++i) {
        const uint64_t t = (uint64_t)big[i] * k + carry;
        const uint32_t q = (uint32_t)(t >> 9) / (ET_BIG_BASE >> 9);
        big[i] = (uint32_t)t - q * ET_BIG_BASE;
        carry = q;
    }
    if (carry)
        big[(*len)++] = carry;
}

/* the decimal digits of m * 2^e (m > 0) into dig (no leading zero); returns their count, and
   in *shift the power of ten they are scaled by (value = digits * 10^shift) */
static int et_exact_digits(char *dig, uint32_t m, int e, int *shift)
{
    uint32_t big[ET_BIG_LIMBS];
    int len = 0;
    big[len++] = m % ET_BIG_BASE;
    if (m >= ET_BIG_BASE)
        big[len++] = m / ET_BIG_BASE;
    *shift = e < 0 ? e : 0; /* m * 2^e = m * 5^-e * 10^e */
    for (int i = 0; i < (e < 0 ? -e : e); ++i)
        et_big_mul(big, &len, e < 0 ? 5u : 2u);
    int n = et_format_u(dig, big[len - 1]);
    for (int i = len - 2; i >= 0; --i) {
        uint32_t limb = big[i];
        for (int j = 8; j >= 0; --j) {
            dig[n + j] = (char)('0' + limb % 10u);
            limb /= 10u;
        }
        n += 9;
    }
    return n;
}

/* writes "%.9g" of (double)v into out (at least 24 bytes); returns the length */
static int et_format_g9(char *out, float v)
{
    union { float f; uint32_t u; } bits = {v};
    const uint32_t biased = (bits.u >> 23) & 0xffu, frac = bits.u & 0x7fffffu;
    char *p = out;
    if (bits.u >> 31)
        *p++ = '-';
    if (biased == 0xffu) {
        memcpy(p, frac ? "nan" : "inf", 4);
        return (int)(p - out) + 3;
    }
    if (biased == 0 && frac == 0) {
        memcpy(p, "0", 2);
        return (int)(p - out) + 1;
    }
    const uint32_t m = biased ? (frac | 0x800000u) : frac;
    const int e = biased ? (int)biased - 150 : -149;
    char dig[ET_BIG_LIMBS * 9 + 1];
    int shift;
    const int n = et_exact_digits(dig, m, e, &shift);
    int x = n - 1 + shift; /* the decimal exponent of the first digit */
    if (n > ET_G_DIGITS) { /* round to ET_G_DIGITS digits, half to even on an exact tie */
        int up = dig[ET_G_DIGITS] > '5';
        if (dig[ET_G_DIGITS] == '5') {
            int rest = 0;
            for (int i = ET_G_DIGITS + 1; i < n; ++i)
                rest |= dig[i] != '0';
            up = rest || ((dig[ET_G_DIGITS - 1] - '0') & 1);
        }
        if (up) {
            int i = ET_G_DIGITS - 1;
            while (i >= 0 && dig[i] == '9')
                dig[i--] = '0';
            if (i >= 0) {
                dig[i]++;
            } else { /* 999999999 + 1: one digit more */
                dig[0] = '1';
                x += 1;
            }
        }
    }
    for (int i = n; i < ET_G_DIGITS; ++i)
        dig[i] = '0';
    int last = ET_G_DIGITS - 1; /* %g drops trailing zeros */
    while (last > 0 && dig[last] == '0')
        --last;
    if (x >= -4 && x < ET_G_DIGITS) { /* fixed notation */
        if (x >= 0) {
            for (int i = 0; i <= x; ++i)
                *p++ = dig[i];
            if (last > x) {
                *p++ = '.';
                for (int i = x + 1; i <= last; ++i)
                    *p++ = dig[i];
            }
        } else {
            *p++ = '0';
            *p++ = '.';
            for (int i = 0; i < -x - 1; ++i)
                *p++ = '0';
            for (int i = 0; i <= last; ++i)
                *p++ = dig[i];
        }
    } else { /* d.ddde[+-]XX */
        *p++ = dig[0];
        if (last > 0) {
            *p++ = '.';
            for (int i = 1; i <= last; ++i)
                *p++ = dig[i];
        }
        *p++ = 'e';
        *p++ = x < 0 ? '-' : '+';
        const unsigned ax = (unsigned)(x < 0 ? -x : x);
        if (ax < 10)
            *p++ = '0';
        p += et_format_u(p, ax);
    }
    *p = 0;
    return (int)(p - out);
}

#endif
