/*
 * vector_distance.c -- the distance functions behind the operators
 *   <->  l2_distance             Euclidean distance
 *   <#>  negative_inner_product  -(a . b), so that smaller means closer
 *   <=>  cosine_distance         1 - cos(a, b); NaN when a or b is zero
 *   <+>  l1_distance             taxicab distance
 * plus inner_product (a . b itself), and pgvector's index support distances
 * under pgvector's names: vector_l2_squared_distance (the sum under the
 * square root), vector_spherical_distance (angle / pi, for unit vectors).
 *
 * The definitions are pgvector's, but every sum is the canonical one of
 * knn_distance.h, so that an operator returns bit for bit what the CPU and
 * GPU engines return for the same pair: a join's distances and ORDER BY
 * a <-> b agree exactly.
 */
#include "postgres.h"

#include "fmgr.h"

#include "knn_distance.h"
#include "vector.h"
#include "vector_math.h"

PG_FUNCTION_INFO_V1(knn_vector_l2_distance);
PG_FUNCTION_INFO_V1(knn_vector_inner_product);
PG_FUNCTION_INFO_V1(knn_vector_negative_inner_product);
PG_FUNCTION_INFO_V1(knn_vector_cosine_distance);
PG_FUNCTION_INFO_V1(knn_vector_l1_distance);
PG_FUNCTION_INFO_V1(knn_vector_l2_squared_distance);
PG_FUNCTION_INFO_V1(knn_vector_spherical_distance);

Datum
knn_vector_l2_distance(PG_FUNCTION_ARGS)
{
	Vector	   *a = PG_GETARG_VECTOR_P(0);
	Vector	   *b = PG_GETARG_VECTOR_P(1);

	knn_vector_check_same_dims(a, b);
	PG_RETURN_FLOAT8(knn_l2_from_squared(knn_l2_squared(a->x, b->x, a->dim)));
}

Datum
knn_vector_inner_product(PG_FUNCTION_ARGS)
{
	Vector	   *a = PG_GETARG_VECTOR_P(0);
	Vector	   *b = PG_GETARG_VECTOR_P(1);

	knn_vector_check_same_dims(a, b);
	PG_RETURN_FLOAT8((double) knn_dot(a->x, b->x, a->dim));
}

Datum
knn_vector_negative_inner_product(PG_FUNCTION_ARGS)
{
	Vector	   *a = PG_GETARG_VECTOR_P(0);
	Vector	   *b = PG_GETARG_VECTOR_P(1);

	knn_vector_check_same_dims(a, b);
	PG_RETURN_FLOAT8(knn_ip_from_dot(knn_dot(a->x, b->x, a->dim)));
}

Datum
knn_vector_cosine_distance(PG_FUNCTION_ARGS)
{
	Vector	   *a = PG_GETARG_VECTOR_P(0);
	Vector	   *b = PG_GETARG_VECTOR_P(1);

	knn_vector_check_same_dims(a, b);
	PG_RETURN_FLOAT8(knn_cosine_from_dot(knn_dot(a->x, b->x, a->dim),
										 knn_dot(a->x, a->x, a->dim),
										 knn_dot(b->x, b->x, b->dim)));
}

Datum
knn_vector_l1_distance(PG_FUNCTION_ARGS)
{
	Vector	   *a = PG_GETARG_VECTOR_P(0);
	Vector	   *b = PG_GETARG_VECTOR_P(1);

	knn_vector_check_same_dims(a, b);
	PG_RETURN_FLOAT8(knn_l1_from_sum(knn_l1_sum(a->x, b->x, a->dim)));
}

Datum
knn_vector_l2_squared_distance(PG_FUNCTION_ARGS)
{
	Vector	   *a = PG_GETARG_VECTOR_P(0);
	Vector	   *b = PG_GETARG_VECTOR_P(1);

	knn_vector_check_same_dims(a, b);
	PG_RETURN_FLOAT8((double) knn_l2_squared(a->x, b->x, a->dim));
}

Datum
knn_vector_spherical_distance(PG_FUNCTION_ARGS)
{
	Vector	   *a = PG_GETARG_VECTOR_P(0);
	Vector	   *b = PG_GETARG_VECTOR_P(1);

	knn_vector_check_same_dims(a, b);
	PG_RETURN_FLOAT8(knn_spherical_from_dot(knn_dot(a->x, b->x, a->dim)));
}
