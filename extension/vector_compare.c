/*
 * vector_compare.c -- the total order of vectors behind =, <>, <, <=, >, >=
 * and the btree operator class (ORDER BY v, DISTINCT, GROUP BY, UNION,
 * btree indexes): element by element, then the shorter vector first when
 * one is a prefix of the other. This is pgvector's order (and that of
 * PostgreSQL arrays). Elements compare as floats, so -0 equals 0.
 * knn_vector_cmp, knn_vector_lt ... knn_vector_gt are defined by
 * KNN_ORDER_FUNCTIONS (order_functions.h) from compare_args.
 */
#include "postgres.h"

#include "fmgr.h"

#include "order_functions.h"
#include "vector.h"

/* -1, 0 or 1 as a sorts before, with, or after b. */
static int
compare_vectors(const Vector *a, const Vector *b)
{
	int			common = Min(a->dim, b->dim);

	for (int i = 0; i < common; i++)
	{
		if (a->x[i] < b->x[i])
			return -1;
		if (a->x[i] > b->x[i])
			return 1;
	}
	if (a->dim != b->dim)
		return a->dim < b->dim ? -1 : 1;
	return 0;
}

static int
compare_args(FunctionCallInfo fcinfo)
{
	Vector	   *a = PG_GETARG_VECTOR_P(0);
	Vector	   *b = PG_GETARG_VECTOR_P(1);
	int			result = compare_vectors(a, b);

	PG_FREE_IF_COPY(a, 0);
	PG_FREE_IF_COPY(b, 1);
	return result;
}

KNN_ORDER_FUNCTIONS(vector, compare_args)
