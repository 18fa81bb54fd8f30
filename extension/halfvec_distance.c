/*
 * halfvec_distance.c -- the distance functions of knn_gpu's halfvec (the
 * operators <->, <#>, <=>, <+> on halfvec, when pgvector's type is absent,
 * and pgvector's halfvec_l2_squared_distance and halfvec_spherical_distance).
 *
 * A halfvec distance is the vector distance of the widened values
 * (kernels/half_float.h: exact), with the canonical sums of knn_distance.h,
 * so that these operators, knn_join and the KNN Join node return the same
 * float8 bit for bit (the engine widens float16 rows the same way).
 */
#include "postgres.h"

#include <math.h>

#include "fmgr.h"

#include "half_float.h"
#include "halfvec.h"
#include "knn_distance.h"

PG_FUNCTION_INFO_V1(knn_halfvec_l2_distance);
PG_FUNCTION_INFO_V1(knn_halfvec_l2_squared_distance);
PG_FUNCTION_INFO_V1(knn_halfvec_inner_product);
PG_FUNCTION_INFO_V1(knn_halfvec_negative_inner_product);
PG_FUNCTION_INFO_V1(knn_halfvec_cosine_distance);
PG_FUNCTION_INFO_V1(knn_halfvec_spherical_distance);
PG_FUNCTION_INFO_V1(knn_halfvec_l1_distance);

/* Both operands widened into palloc'd floats, dimensions checked. */
static int
widen_pair(FunctionCallInfo fcinfo, float **a, float **b)
{
	HalfVector *x = knn_halfvec_arg(fcinfo, 0);
	HalfVector *y = knn_halfvec_arg(fcinfo, 1);

	knn_halfvec_check_same_dims(x, y);
	*a = palloc(sizeof(float) * x->dim);
	*b = palloc(sizeof(float) * x->dim);
	knn_halfvec_widen(x, *a);
	knn_halfvec_widen(y, *b);
	return x->dim;
}

Datum
knn_halfvec_l2_distance(PG_FUNCTION_ARGS)
{
	float	   *a;
	float	   *b;
	int			dim = widen_pair(fcinfo, &a, &b);

	PG_RETURN_FLOAT8(knn_l2_from_squared(knn_l2_squared(a, b, dim)));
}

Datum
knn_halfvec_l2_squared_distance(PG_FUNCTION_ARGS)
{
	float	   *a;
	float	   *b;
	int			dim = widen_pair(fcinfo, &a, &b);

	PG_RETURN_FLOAT8((double) knn_l2_squared(a, b, dim));
}

Datum
knn_halfvec_inner_product(PG_FUNCTION_ARGS)
{
	float	   *a;
	float	   *b;
	int			dim = widen_pair(fcinfo, &a, &b);

	PG_RETURN_FLOAT8((double) knn_dot(a, b, dim));
}

Datum
knn_halfvec_negative_inner_product(PG_FUNCTION_ARGS)
{
	float	   *a;
	float	   *b;
	int			dim = widen_pair(fcinfo, &a, &b);

	PG_RETURN_FLOAT8(knn_ip_from_dot(knn_dot(a, b, dim)));
}

Datum
knn_halfvec_cosine_distance(PG_FUNCTION_ARGS)
{
	float	   *a;
	float	   *b;
	int			dim = widen_pair(fcinfo, &a, &b);

	PG_RETURN_FLOAT8(knn_cosine_from_dot(knn_dot(a, b, dim), knn_dot(a, a, dim),
										 knn_dot(b, b, dim)));
}

/*
 * The angle between unit vectors, over pi (pgvector's distance for spherical
 * k-means: the inputs are taken as unit vectors, the dot product clamped to
 * [-1, 1] so that rounding cannot make acos NaN).
 */
Datum
knn_halfvec_spherical_distance(PG_FUNCTION_ARGS)
{
	float	   *a;
	float	   *b;
	int			dim = widen_pair(fcinfo, &a, &b);
	double		dot = (double) knn_dot(a, b, dim);

	dot = Max(-1.0, Min(dot, 1.0));
	PG_RETURN_FLOAT8(acos(dot) / M_PI);
}

Datum
knn_halfvec_l1_distance(PG_FUNCTION_ARGS)
{
	float	   *a;
	float	   *b;
	int			dim = widen_pair(fcinfo, &a, &b);

	PG_RETURN_FLOAT8(knn_l1_from_sum(knn_l1_sum(a, b, dim)));
}
