/*
 * half_float.h -- IEEE binary16 <-> binary32, bit-exact, for the halfvec
 * type (extension/halfvec*.c) and the job layer's widening of float16 rows
 * (knn_job.cpp). Plain C and C++, no intrinsics, so that every build (and
 * every CPU) converts the same way.
 *
 * Widening is exact: every binary16 value is a binary32 value. NaN widens
 * to the quiet NaN of its sign (no payload), as pgvector's portable
 * HalfToFloat4 does; halfvec values never hold NaN or an infinity anyway.
 * Narrowing rounds to nearest, ties to even (IEEE's default, and what
 * pgvector's Float4ToHalfUnchecked and F16C's _cvtss_sh(x, 0) compute); a
 * finite value beyond binary16's range becomes an infinity, which the
 * callers reject as pgvector does ("out of range for type halfvec").
 */
#ifndef KNN_HALF_FLOAT_H
#define KNN_HALF_FLOAT_H

#include <stdint.h>
#include <string.h>

static inline float
knn_half_to_float(uint16_t h)
{
	uint32_t	sign = (uint32_t) (h & 0x8000u) << 16;
	uint32_t	exponent = (h >> 10) & 0x1Fu;
	uint32_t	mantissa = h & 0x3FFu;
	uint32_t	bits;
	float		f;

	if (exponent == 0x1F)
		bits = sign | (mantissa == 0 ? 0x7F800000u : 0x7FC00000u);
	else if (exponent != 0)
		bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
	else if (mantissa == 0)
		bits = sign;			/* a signed zero */
	else
	{
		/* Subnormal: mantissa * 2^-24; normalise so bit 10 is the leading one. */
		int			e = 127 - 15 + 1;

		while ((mantissa & 0x400u) == 0)
		{
			mantissa <<= 1;
			e--;
		}
		bits = sign | ((uint32_t) e << 23) | ((mantissa & 0x3FFu) << 13);
	}
	memcpy(&f, &bits, sizeof f);
	return f;
}

/* Rounds (m >> shift) to nearest, ties to even; 1 <= shift <= 31. */
static inline uint32_t
knn_half_round_shift(uint32_t m, int shift)
{
	uint32_t	kept = m >> shift;
	uint32_t	rest = m & ((1u << shift) - 1);
	uint32_t	halfway = 1u << (shift - 1);

	if (rest > halfway || (rest == halfway && (kept & 1u)))
		kept++;
	return kept;
}

static inline uint16_t
knn_float_to_half(float f)
{
	uint32_t	x;
	uint16_t	sign;
	uint32_t	exponent;
	uint32_t	mantissa;
	int			e;

	memcpy(&x, &f, sizeof x);
	sign = (uint16_t) ((x >> 16) & 0x8000u);
	exponent = (x >> 23) & 0xFFu;
	mantissa = x & 0x7FFFFFu;
	if (exponent == 0xFF)		/* infinity, or a quiet NaN keeping its top bits */
		return (uint16_t) (sign | 0x7C00u | (mantissa != 0 ? 0x200u | (mantissa >> 13) : 0));
	e = (int) exponent - 127 + 15;	/* the binary16 exponent field */
	if (e >= 31)
		return (uint16_t) (sign | 0x7C00u);
	if (e <= 0)
	{
		/* Subnormal (or zero) in binary16: value = m * 2^-24. */
		if (e < -10)
			return sign;		/* below half the smallest subnormal */
		return (uint16_t) (sign | knn_half_round_shift(mantissa | 0x800000u, 14 - e));
	}
	/* A carry out of the mantissa moves into the exponent (up to infinity). */
	return (uint16_t) (sign + (((uint32_t) e << 10) + knn_half_round_shift(mantissa, 13)));
}

static inline int
knn_half_is_finite(uint16_t h)
{
	return (h & 0x7C00u) != 0x7C00u;
}

#endif							/* KNN_HALF_FLOAT_H */
