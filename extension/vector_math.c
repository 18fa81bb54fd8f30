/*
 * vector_math.c -- the functions that make new vectors from vectors, with
 * pgvector's results and errors for the same inputs:
 *   +  knn_vector_add       element-wise sum
 *   -  knn_vector_sub       element-wise difference
 *   *  knn_vector_mul       element-wise product
 *   || knn_vector_concat    a's elements, then b's
 *   l2_normalize            a / |a| (the zero vector stays zero)
 *   subvector(a, start, count)  elements start .. start + count - 1, 1-based
 * Element results are single-precision: one that overflows to an infinity
 * is "value out of range: overflow", a product that underflows to zero
 * from non-zero factors "value out of range: underflow" (PostgreSQL's own
 * float4 errors, SQLSTATE 22003), since a vector may hold neither an
 * infinity nor, silently, a lost product.
 */
#include "postgres.h"

#include <math.h>

#include "fmgr.h"
#include "utils/float.h"

#include "vector.h"
#include "vector_math.h"

PG_FUNCTION_INFO_V1(knn_vector_add);
PG_FUNCTION_INFO_V1(knn_vector_sub);
PG_FUNCTION_INFO_V1(knn_vector_mul);
PG_FUNCTION_INFO_V1(knn_vector_concat);
PG_FUNCTION_INFO_V1(knn_vector_l2_normalize);
PG_FUNCTION_INFO_V1(knn_vector_subvector);

/*
 * Argument n, detoasted, after checking that its size is what its header
 * says: the values are read by dim, so a datum that disagrees is refused
 * before any element is touched.
 */
Vector *
knn_vector_arg(FunctionCallInfo fcinfo, int n)
{
	Vector	   *v = DatumGetVector(PG_GETARG_DATUM(n));

	if (VARSIZE_ANY(v) < offsetof(Vector, x) ||
		v->dim < 1 || v->dim > VECTOR_MAX_DIM ||
		VARSIZE_ANY(v) != VECTOR_SIZE(v->dim))
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("invalid vector value: %u bytes for its dimension count",
						(unsigned int) VARSIZE_ANY(v))));
	return v;
}

void
knn_vector_check_same_dims(const Vector *a, const Vector *b)
{
	if (a->dim != b->dim)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("different vector dimensions %d and %d", a->dim, b->dim)));
}

typedef enum
{
	VECTOR_ADD,
	VECTOR_SUB,
	VECTOR_MUL
} ElementOp;

static Datum
element_wise(FunctionCallInfo fcinfo, ElementOp op)
{
	Vector	   *a = knn_vector_arg(fcinfo, 0);
	Vector	   *b = knn_vector_arg(fcinfo, 1);
	Vector	   *result;

	knn_vector_check_same_dims(a, b);
	result = knn_vector_new(a->dim);
	for (int i = 0; i < a->dim; i++)
	{
		float		x = a->x[i];
		float		y = b->x[i];
		float		r;

		switch (op)
		{
			case VECTOR_ADD:
				r = x + y;
				break;
			case VECTOR_SUB:
				r = x - y;
				break;
			default:
				r = x * y;
				if (r == 0.0f && x != 0.0f && y != 0.0f)
					float_underflow_error();
				break;
		}
		if (isinf(r))
			float_overflow_error();
		result->x[i] = r;
	}
	PG_FREE_IF_COPY(a, 0);
	PG_FREE_IF_COPY(b, 1);
	PG_RETURN_VECTOR_P(result);
}

Datum
knn_vector_add(PG_FUNCTION_ARGS)
{
	return element_wise(fcinfo, VECTOR_ADD);
}

Datum
knn_vector_sub(PG_FUNCTION_ARGS)
{
	return element_wise(fcinfo, VECTOR_SUB);
}

Datum
knn_vector_mul(PG_FUNCTION_ARGS)
{
	return element_wise(fcinfo, VECTOR_MUL);
}

Datum
knn_vector_concat(PG_FUNCTION_ARGS)
{
	Vector	   *a = knn_vector_arg(fcinfo, 0);
	Vector	   *b = knn_vector_arg(fcinfo, 1);
	Vector	   *result;

	/* knn_vector_new refuses more than VECTOR_MAX_DIM (both are <= it) */
	result = knn_vector_new(a->dim + b->dim);
	memcpy(result->x, a->x, sizeof(float) * a->dim);
	memcpy(result->x + a->dim, b->x, sizeof(float) * b->dim);
	PG_FREE_IF_COPY(a, 0);
	PG_FREE_IF_COPY(b, 1);
	PG_RETURN_VECTOR_P(result);
}

/* a / |a| with vector_norm's norm (double precision: no float overflow). */
Datum
knn_vector_l2_normalize(PG_FUNCTION_ARGS)
{
	Vector	   *a = knn_vector_arg(fcinfo, 0);
	Vector	   *result = knn_vector_new(a->dim);
	double		norm = knn_vector_norm_of(a);

	if (norm > 0)
	{
		for (int i = 0; i < a->dim; i++)
		{
			result->x[i] = (float) (a->x[i] / norm);
			/* |x| <= norm, so this cannot fire; pgvector's guard, kept */
			if (isinf(result->x[i]))
				float_overflow_error();
		}
	}
	PG_FREE_IF_COPY(a, 0);
	PG_RETURN_VECTOR_P(result);
}

/*
 * Like substring: positions before 1 count but give no element, and the
 * result is what remains of [start, start + count) inside 1 .. dim, which
 * must be at least one element. Computed in 64 bits: start + count may
 * overflow int32. Shared with halfvec's subvector (vector_math.h).
 */
int
knn_subvector_range(int dim, int32 start, int32 count, const char *type_name, int *first)
{
	int64		from = start;
	int64		end;

	if (count < 1)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("%s must have at least 1 dimension", type_name)));
	end = Min(from + count, (int64) dim + 1);
	from = Max(from, 1);
	if (from > dim || end <= from)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("%s must have at least 1 dimension", type_name)));
	*first = (int) (from - 1);
	return (int) (end - from);
}

Datum
knn_vector_subvector(PG_FUNCTION_ARGS)
{
	Vector	   *a = knn_vector_arg(fcinfo, 0);
	int			first;
	int			n = knn_subvector_range(a->dim, PG_GETARG_INT32(1), PG_GETARG_INT32(2),
										"vector", &first);
	Vector	   *result = knn_vector_new(n);

	memcpy(result->x, a->x + first, sizeof(float) * n);
	PG_FREE_IF_COPY(a, 0);
	PG_RETURN_VECTOR_P(result);
}

/*
 * pgvector compiles its norm loop with -fassociative-math, so its sum is in
 * the order GCC's vectorizer picks. Built as packaged for x86-64 (no
 * -march, SSE2), that is: for each block of four elements, lane 0 adds
 * x0^2 + x2^2 and lane 1 adds x1^2 + x3^2; then lane 1 + lane 0; then the
 * remaining elements one by one (under four elements: all one by one).
 * Summing in that order gives the same bits as that build (checked
 * against it on random vectors of 1..40 dimensions); a pgvector built with
 * -march=native has wider lanes and may differ in the last bit. pgvector's
 * sparsevec norm (of its stored values) is the same loop, compiled alike.
 */
double
knn_float_norm(const float *x, int n)
{
	int			blocks_end = n >= 4 ? n - n % 4 : 0;
	double		lane0 = 0.0;
	double		lane1 = 0.0;
	double		sum;

	for (int i = 0; i < blocks_end; i += 4)
	{
		double		x0 = x[i],
					x1 = x[i + 1],
					x2 = x[i + 2],
					x3 = x[i + 3];

		lane0 += x0 * x0 + x2 * x2;
		lane1 += x1 * x1 + x3 * x3;
	}
	sum = lane1 + lane0;
	for (int i = blocks_end; i < n; i++)
		sum += (double) x[i] * (double) x[i];
	return sqrt(sum);
}

double
knn_vector_norm_of(const Vector *v)
{
	return knn_float_norm(v->x, v->dim);
}
