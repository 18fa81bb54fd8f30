/*
 * sparsevec_distance.c -- the distances and norms of knn_gpu's sparsevec
 * (the operators <->, <#>, <=>, <+> on sparsevec, l2_norm, l2_normalize),
 * with pgvector's arithmetic so that they return the same float8 bits:
 *
 * - L2, L1 and the inner product walk both index lists in ascending index
 *   order, summing in float one element at a time (an index stored in only
 *   one operand counts against zero), as pgvector's loops do; but the
 *   elements of b after a's last one are summed in the order of pgvector's
 *   vectorised last loop (add_terms_in_lanes below).
 * - cosine divides that inner product by sqrt(|a|^2 * |b|^2) in double,
 *   each squared norm a float sum in that vectorised order, clamped to
 *   [-1, 1]; a zero operand gives NaN.
 * - l2_norm and l2_normalize use vector_norm's double sum (vector_math.h),
 *   the same loop in pgvector.
 *
 * The knn_join engine does not read sparsevec (knn_catalog.c knows no
 * sparsevec type), so these are the only definitions of its distances.
 */
#include "postgres.h"

#include <math.h>

#include "fmgr.h"
#include "utils/float.h"

#include "sparsevec.h"
#include "vector_math.h"

PG_FUNCTION_INFO_V1(knn_sparsevec_l2_distance);
PG_FUNCTION_INFO_V1(knn_sparsevec_l2_squared_distance);
PG_FUNCTION_INFO_V1(knn_sparsevec_inner_product);
PG_FUNCTION_INFO_V1(knn_sparsevec_negative_inner_product);
PG_FUNCTION_INFO_V1(knn_sparsevec_cosine_distance);
PG_FUNCTION_INFO_V1(knn_sparsevec_l1_distance);
PG_FUNCTION_INFO_V1(knn_sparsevec_l2_norm);
PG_FUNCTION_INFO_V1(knn_sparsevec_l2_normalize);

/* Both arguments, checked, of one dimension count. */
static void
get_pair(FunctionCallInfo fcinfo, SparseVector **a, SparseVector **b)
{
	*a = knn_sparsevec_arg(fcinfo, 0);
	*b = knn_sparsevec_arg(fcinfo, 1);
	if ((*a)->dim != (*b)->dim)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("different sparsevec dimensions %d and %d", (*a)->dim, (*b)->dim)));
}

typedef enum
{
	SUM_SQUARED_DIFFERENCES,	/* L2 squared */
	SUM_ABSOLUTE_DIFFERENCES	/* L1 */
} DifferenceSum;

static inline float
term(float d, DifferenceSum kind)
{
	/* |0 - x| is |x| and (0 - x)^2 is x^2: no sign to keep */
	return kind == SUM_SQUARED_DIFFERENCES ? d * d : fabsf(d);
}

/*
 * sum + the terms of x[0..n-1] in the order of pgvector's reduction loops
 * as GCC vectorises them for x86-64 (SSE2, -fassociative-math): under 4
 * elements one by one; else lane k sums the terms of elements 4m + k over
 * the whole blocks of four, the lanes fold as (l0 + l2) + (l1 + l3) and
 * join sum, then the last n % 4 terms follow one by one.
 */
static float
add_terms_in_lanes(float sum, const float *x, int n, DifferenceSum kind)
{
	int			blocks_end = n >= 4 ? n - n % 4 : 0;

	if (blocks_end > 0)
	{
		float		lane[4] = {0.0f, 0.0f, 0.0f, 0.0f};

		for (int i = 0; i < blocks_end; i += 4)
			for (int k = 0; k < 4; k++)
				lane[k] += term(x[i + k], kind);
		sum += (lane[0] + lane[2]) + (lane[1] + lane[3]);
	}
	for (int i = blocks_end; i < n; i++)
		sum += term(x[i], kind);
	return sum;
}

/*
 * Sum over every index stored in a or b of f(a_i - b_i), f the square or
 * the absolute value, in float: in ascending index order up to a's last
 * element; b's elements after it (pgvector's last loop, vectorised) in
 * lanes.
 */
static float
difference_sum(const SparseVector *a, const SparseVector *b, DifferenceSum kind)
{
	const float *ax = SPARSEVEC_VALUES(a);
	const float *bx = SPARSEVEC_VALUES(b);
	float		sum = 0.0f;
	int			i = 0;
	int			j = 0;

	while (i < a->nnz)
	{
		float		d;

		if (j >= b->nnz || a->indices[i] < b->indices[j])
			d = ax[i++];
		else if (b->indices[j] < a->indices[i])
			d = bx[j++];
		else
			d = ax[i++] - bx[j++];
		sum += term(d, kind);
	}
	return add_terms_in_lanes(sum, bx + j, b->nnz - j, kind);
}

/* Sum of a_i * b_i over the indices stored in both, ascending, in float. */
static float
inner_product(const SparseVector *a, const SparseVector *b)
{
	const float *ax = SPARSEVEC_VALUES(a);
	const float *bx = SPARSEVEC_VALUES(b);
	float		sum = 0.0f;
	int			i = 0;
	int			j = 0;

	while (i < a->nnz && j < b->nnz)
	{
		if (a->indices[i] < b->indices[j])
			i++;
		else if (b->indices[j] < a->indices[i])
			j++;
		else
			sum += ax[i++] * bx[j++];
	}
	return sum;
}

Datum
knn_sparsevec_l2_distance(PG_FUNCTION_ARGS)
{
	SparseVector *a;
	SparseVector *b;

	get_pair(fcinfo, &a, &b);
	PG_RETURN_FLOAT8(sqrt((double) difference_sum(a, b, SUM_SQUARED_DIFFERENCES)));
}

Datum
knn_sparsevec_l2_squared_distance(PG_FUNCTION_ARGS)
{
	SparseVector *a;
	SparseVector *b;

	get_pair(fcinfo, &a, &b);
	PG_RETURN_FLOAT8((double) difference_sum(a, b, SUM_SQUARED_DIFFERENCES));
}

Datum
knn_sparsevec_l1_distance(PG_FUNCTION_ARGS)
{
	SparseVector *a;
	SparseVector *b;

	get_pair(fcinfo, &a, &b);
	PG_RETURN_FLOAT8((double) difference_sum(a, b, SUM_ABSOLUTE_DIFFERENCES));
}

Datum
knn_sparsevec_inner_product(PG_FUNCTION_ARGS)
{
	SparseVector *a;
	SparseVector *b;

	get_pair(fcinfo, &a, &b);
	PG_RETURN_FLOAT8((double) inner_product(a, b));
}

Datum
knn_sparsevec_negative_inner_product(PG_FUNCTION_ARGS)
{
	SparseVector *a;
	SparseVector *b;

	get_pair(fcinfo, &a, &b);
	PG_RETURN_FLOAT8((double) -inner_product(a, b));
}

Datum
knn_sparsevec_cosine_distance(PG_FUNCTION_ARGS)
{
	SparseVector *a;
	SparseVector *b;
	double		similarity;
	float		a_squares;
	float		b_squares;

	get_pair(fcinfo, &a, &b);
	similarity = inner_product(a, b);
	a_squares = add_terms_in_lanes(0.0f, SPARSEVEC_VALUES(a), a->nnz, SUM_SQUARED_DIFFERENCES);
	b_squares = add_terms_in_lanes(0.0f, SPARSEVEC_VALUES(b), b->nnz, SUM_SQUARED_DIFFERENCES);
	similarity /= sqrt((double) a_squares * (double) b_squares);
	/* rounding can leave |similarity| just above 1; NaN passes through */
	if (similarity > 1)
		similarity = 1.0;
	else if (similarity < -1)
		similarity = -1.0;
	PG_RETURN_FLOAT8(1.0 - similarity);
}

Datum
knn_sparsevec_l2_norm(PG_FUNCTION_ARGS)
{
	SparseVector *a = knn_sparsevec_arg(fcinfo, 0);

	PG_RETURN_FLOAT8(knn_float_norm(SPARSEVEC_VALUES(a), a->nnz));
}

/*
 * a / |a|, the zero vector staying zero. A quotient that underflows to
 * zero is dropped (a sparsevec stores no zero), as pgvector does.
 */
Datum
knn_sparsevec_l2_normalize(PG_FUNCTION_ARGS)
{
	SparseVector *a = knn_sparsevec_arg(fcinfo, 0);
	const float *ax = SPARSEVEC_VALUES(a);
	double		norm = knn_float_norm(ax, a->nnz);
	float	   *quotients = palloc(sizeof(float) * Max(a->nnz, 1));
	int			nnz = 0;
	SparseVector *result;
	float	   *rx;
	int			j = 0;

	if (norm > 0)
	{
		for (int i = 0; i < a->nnz; i++)
		{
			quotients[i] = (float) (ax[i] / norm);
			/* |x| <= norm, so this cannot fire; pgvector's guard, kept */
			if (isinf(quotients[i]))
				float_overflow_error();
			nnz += (quotients[i] != 0);
		}
	}
	result = knn_sparsevec_new(a->dim, nnz);
	rx = SPARSEVEC_VALUES(result);
	for (int i = 0; i < a->nnz && norm > 0; i++)
	{
		if (quotients[i] != 0)
		{
			result->indices[j] = a->indices[i];
			rx[j] = quotients[i];
			j++;
		}
	}
	pfree(quotients);
	PG_RETURN_POINTER(result);
}
