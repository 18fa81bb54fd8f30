/*
 * sparsevec_compare.c -- the btree order of sparsevec (sparsevec_cmp and
 * the operators < <= = <> >= >), pgvector's: two values compare as their
 * dense forms would, element by element over the dimensions both have,
 * then the one with fewer dimensions first (as PostgreSQL's arrays). An
 * element stored in only one value is compared with the other's zero.
 */
#include "postgres.h"

#include "fmgr.h"

#include "sparsevec.h"

PG_FUNCTION_INFO_V1(knn_sparsevec_cmp);
PG_FUNCTION_INFO_V1(knn_sparsevec_lt);
PG_FUNCTION_INFO_V1(knn_sparsevec_le);
PG_FUNCTION_INFO_V1(knn_sparsevec_eq);
PG_FUNCTION_INFO_V1(knn_sparsevec_ne);
PG_FUNCTION_INFO_V1(knn_sparsevec_ge);
PG_FUNCTION_INFO_V1(knn_sparsevec_gt);

/* How a stored element (never zero) compares with a zero: -1 or 1. */
static inline int
sign_of(float x)
{
	return x < 0 ? -1 : 1;
}

static int
compare(const SparseVector *a, const SparseVector *b)
{
	const float *ax = SPARSEVEC_VALUES(a);
	const float *bx = SPARSEVEC_VALUES(b);
	int			common = Min(a->nnz, b->nnz);

	/*
	 * The first index where the two differ decides: the lower of two
	 * different indices is a non-zero element facing a zero; the same
	 * index compares the two values.
	 */
	for (int i = 0; i < common; i++)
	{
		if (a->indices[i] < b->indices[i])
			return sign_of(ax[i]);
		if (a->indices[i] > b->indices[i])
			return -sign_of(bx[i]);
		if (ax[i] != bx[i])
			return ax[i] < bx[i] ? -1 : 1;
	}

	/*
	 * One value has more elements: the first of them faces a zero of the
	 * other, if the other has that dimension at all.
	 */
	if (a->nnz < b->nnz && b->indices[common] < a->dim)
		return -sign_of(bx[common]);
	if (a->nnz > b->nnz && a->indices[common] < b->dim)
		return sign_of(ax[common]);

	return (a->dim > b->dim) - (a->dim < b->dim);
}

static int
compare_args(FunctionCallInfo fcinfo)
{
	SparseVector *a = knn_sparsevec_arg(fcinfo, 0);
	SparseVector *b = knn_sparsevec_arg(fcinfo, 1);
	int			result = compare(a, b);

	PG_FREE_IF_COPY(a, 0);
	PG_FREE_IF_COPY(b, 1);
	return result;
}

Datum
knn_sparsevec_cmp(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT32(compare_args(fcinfo));
}

Datum
knn_sparsevec_lt(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(compare_args(fcinfo) < 0);
}

Datum
knn_sparsevec_le(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(compare_args(fcinfo) <= 0);
}

Datum
knn_sparsevec_eq(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(compare_args(fcinfo) == 0);
}

Datum
knn_sparsevec_ne(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(compare_args(fcinfo) != 0);
}

Datum
knn_sparsevec_ge(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(compare_args(fcinfo) >= 0);
}

Datum
knn_sparsevec_gt(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(compare_args(fcinfo) > 0);
}
