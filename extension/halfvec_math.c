/*
 * halfvec_math.c -- the functions that make new halfvecs from halfvecs, and
 * l2_norm, with pgvector's results and errors for the same inputs (created
 * only with knn_gpu's own halfvec: extension/sql/18_halfvec_functions.sql):
 *   +  knn_halfvec_add       element-wise sum
 *   -  knn_halfvec_sub       element-wise difference
 *   *  knn_halfvec_mul       element-wise product
 *   || knn_halfvec_concat    a's elements, then b's
 *   l2_norm                  |a|, in double precision
 *   l2_normalize             a / |a| (the zero vector stays zero)
 *   subvector(a, start, count)  elements start .. start + count - 1, 1-based
 *
 * An element result is the binary16 nearest to the single-precision result
 * of the widened operands. That is what binary16 arithmetic gives (float
 * has more than 2 * 11 + 2 significant bits, so rounding twice, to float
 * and then to half, equals rounding once), and so what pgvector computes
 * with _Float16 or with its portable conversions. A result beyond binary16's
 * range is "value out of range: overflow", a product that rounds to zero
 * from non-zero factors "value out of range: underflow" (PostgreSQL's
 * float errors, SQLSTATE 22003), as pgvector.
 */
#include "postgres.h"

#include <math.h>

#include "fmgr.h"
#include "utils/float.h"

#include "half_float.h"
#include "halfvec.h"
#include "vector_math.h"

PG_FUNCTION_INFO_V1(knn_halfvec_add);
PG_FUNCTION_INFO_V1(knn_halfvec_sub);
PG_FUNCTION_INFO_V1(knn_halfvec_mul);
PG_FUNCTION_INFO_V1(knn_halfvec_concat);
PG_FUNCTION_INFO_V1(knn_halfvec_l2_norm);
PG_FUNCTION_INFO_V1(knn_halfvec_l2_normalize);
PG_FUNCTION_INFO_V1(knn_halfvec_subvector);

typedef enum
{
	HALFVEC_ADD,
	HALFVEC_SUB,
	HALFVEC_MUL
} HalfElementOp;

static inline bool
half_is_zero(uint16 h)
{
	return (h & 0x7FFF) == 0;
}

static Datum
half_element_wise(FunctionCallInfo fcinfo, HalfElementOp op)
{
	HalfVector *a = knn_halfvec_arg(fcinfo, 0);
	HalfVector *b = knn_halfvec_arg(fcinfo, 1);
	HalfVector *result;

	knn_halfvec_check_same_dims(a, b);
	result = knn_halfvec_new(a->dim);
	for (int i = 0; i < a->dim; i++)
	{
		float		x = knn_half_to_float(a->x[i]);
		float		y = knn_half_to_float(b->x[i]);
		uint16		r;

		if (op == HALFVEC_ADD)
			r = knn_float_to_half(x + y);
		else if (op == HALFVEC_SUB)
			r = knn_float_to_half(x - y);
		else
			r = knn_float_to_half(x * y);
		/* the operands are finite, so the result is never NaN */
		if (!knn_half_is_finite(r))
			float_overflow_error();
		if (op == HALFVEC_MUL && half_is_zero(r) && !half_is_zero(a->x[i]) && !half_is_zero(b->x[i]))
			float_underflow_error();
		result->x[i] = r;
	}
	PG_FREE_IF_COPY(a, 0);
	PG_FREE_IF_COPY(b, 1);
	PG_RETURN_HALFVEC_P(result);
}

Datum
knn_halfvec_add(PG_FUNCTION_ARGS)
{
	return half_element_wise(fcinfo, HALFVEC_ADD);
}

Datum
knn_halfvec_sub(PG_FUNCTION_ARGS)
{
	return half_element_wise(fcinfo, HALFVEC_SUB);
}

Datum
knn_halfvec_mul(PG_FUNCTION_ARGS)
{
	return half_element_wise(fcinfo, HALFVEC_MUL);
}

Datum
knn_halfvec_concat(PG_FUNCTION_ARGS)
{
	HalfVector *a = knn_halfvec_arg(fcinfo, 0);
	HalfVector *b = knn_halfvec_arg(fcinfo, 1);
	/* knn_halfvec_new refuses more than HALFVEC_MAX_DIM, as pgvector */
	HalfVector *result = knn_halfvec_new(a->dim + b->dim);

	memcpy(result->x, a->x, sizeof(uint16) * a->dim);
	memcpy(result->x + a->dim, b->x, sizeof(uint16) * b->dim);
	PG_FREE_IF_COPY(a, 0);
	PG_FREE_IF_COPY(b, 1);
	PG_RETURN_HALFVEC_P(result);
}

/*
 * The squares of the widened elements summed in double precision, in
 * element order: pgvector's loop, which its packaged x86-64 build (no
 * -march) leaves scalar, as its half conversion does not vectorize there
 * (checked against that build: test/pgvector/sql/knn_pgvector_halfvec.sql).
 * No halfvec overflows it.
 */
static double
halfvec_norm_of(const HalfVector *v)
{
	double		sum = 0.0;

	for (int i = 0; i < v->dim; i++)
	{
		double		x = knn_half_to_float(v->x[i]);

		sum += x * x;
	}
	return sqrt(sum);
}

Datum
knn_halfvec_l2_norm(PG_FUNCTION_ARGS)
{
	HalfVector *a = knn_halfvec_arg(fcinfo, 0);
	double		norm = halfvec_norm_of(a);

	PG_FREE_IF_COPY(a, 0);
	PG_RETURN_FLOAT8(norm);
}

/* Each element over the norm, in double, then to float, then to half. */
Datum
knn_halfvec_l2_normalize(PG_FUNCTION_ARGS)
{
	HalfVector *a = knn_halfvec_arg(fcinfo, 0);
	HalfVector *result = knn_halfvec_new(a->dim);
	double		norm = halfvec_norm_of(a);

	if (norm > 0)
	{
		for (int i = 0; i < a->dim; i++)
		{
			result->x[i] = knn_float_to_half((float) (knn_half_to_float(a->x[i]) / norm));
			/* |x| <= norm, so this cannot fire; pgvector's guard, kept */
			if (!knn_half_is_finite(result->x[i]))
				float_overflow_error();
		}
	}
	PG_FREE_IF_COPY(a, 0);
	PG_RETURN_HALFVEC_P(result);
}

Datum
knn_halfvec_subvector(PG_FUNCTION_ARGS)
{
	HalfVector *a = knn_halfvec_arg(fcinfo, 0);
	int			first;
	int			n = knn_subvector_range(a->dim, PG_GETARG_INT32(1), PG_GETARG_INT32(2),
										"halfvec", &first);
	HalfVector *result = knn_halfvec_new(n);

	memcpy(result->x, a->x + first, sizeof(uint16) * n);
	PG_FREE_IF_COPY(a, 0);
	PG_RETURN_HALFVEC_P(result);
}
