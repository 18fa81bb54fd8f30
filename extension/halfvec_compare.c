/*
 * halfvec_compare.c -- the total order of halfvecs behind halfvec_cmp, =,
 * <>, <, <=, >, >= and the btree operator class halfvec_ops (ORDER BY,
 * DISTINCT, GROUP BY, btree indexes), created only with knn_gpu's own
 * halfvec (extension/sql/18_halfvec_functions.sql): pgvector's order, that
 * of vector_compare.c on the widened values -- element by element, then the
 * shorter first when one is a prefix of the other; -0 equals 0.
 * knn_halfvec_cmp, knn_halfvec_lt ... knn_halfvec_gt are defined by
 * KNN_ORDER_FUNCTIONS (order_functions.h) from compare_args.
 */
#include "postgres.h"

#include "fmgr.h"

#include "half_float.h"
#include "halfvec.h"
#include "order_functions.h"

/* -1, 0 or 1 as the halfvec arguments 0 and 1 sort before, with, after. */
static int
compare_args(FunctionCallInfo fcinfo)
{
	HalfVector *a = knn_halfvec_arg(fcinfo, 0);
	HalfVector *b = knn_halfvec_arg(fcinfo, 1);
	int			common = Min(a->dim, b->dim);
	int			result = a->dim == b->dim ? 0 : (a->dim < b->dim ? -1 : 1);

	for (int i = 0; i < common; i++)
	{
		float		x = knn_half_to_float(a->x[i]);
		float		y = knn_half_to_float(b->x[i]);

		if (x != y)
		{
			result = x < y ? -1 : 1;
			break;
		}
	}
	PG_FREE_IF_COPY(a, 0);
	PG_FREE_IF_COPY(b, 1);
	return result;
}

KNN_ORDER_FUNCTIONS(halfvec, compare_args)
