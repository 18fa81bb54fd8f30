/*
 * order_functions.h -- the functions behind a type's btree operator class
 * and comparison operators, all from one comparison, so that each type
 * states its order once (vector_compare.c, halfvec_compare.c).
 *
 * KNN_ORDER_FUNCTIONS(type, compare) defines the V1 functions
 *   knn_<type>_cmp  (-1, 0, 1: the btree support function)
 *   knn_<type>_lt, _le, _eq, _ne, _ge, _gt  (<, <=, =, <>, >=, >)
 * where compare(fcinfo) returns -1, 0 or 1 as argument 0 sorts before,
 * with, or after argument 1.
 */
#ifndef KNN_ORDER_FUNCTIONS_H
#define KNN_ORDER_FUNCTIONS_H

#include "postgres.h"

#include "fmgr.h"

#define KNN_ORDER_FUNCTION(name, result) \
	PG_FUNCTION_INFO_V1(name); \
	Datum \
	name(PG_FUNCTION_ARGS) \
	{ \
		result; \
	}

#define KNN_ORDER_FUNCTIONS(type, compare) \
	KNN_ORDER_FUNCTION(knn_##type##_cmp, PG_RETURN_INT32(compare(fcinfo))) \
	KNN_ORDER_FUNCTION(knn_##type##_lt, PG_RETURN_BOOL(compare(fcinfo) < 0)) \
	KNN_ORDER_FUNCTION(knn_##type##_le, PG_RETURN_BOOL(compare(fcinfo) <= 0)) \
	KNN_ORDER_FUNCTION(knn_##type##_eq, PG_RETURN_BOOL(compare(fcinfo) == 0)) \
	KNN_ORDER_FUNCTION(knn_##type##_ne, PG_RETURN_BOOL(compare(fcinfo) != 0)) \
	KNN_ORDER_FUNCTION(knn_##type##_ge, PG_RETURN_BOOL(compare(fcinfo) >= 0)) \
	KNN_ORDER_FUNCTION(knn_##type##_gt, PG_RETURN_BOOL(compare(fcinfo) > 0))

#endif							/* KNN_ORDER_FUNCTIONS_H */
