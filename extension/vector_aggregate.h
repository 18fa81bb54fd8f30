/*
 * vector_aggregate.h -- avg's state, shared by avg(vector)
 * (vector_aggregate.c) and avg(halfvec) (halfvec_aggregate.c): a float8[]
 * {n, s1, ..., sdim}, the count of values and the element sums in double
 * precision; {0} before the first value.
 */
#ifndef KNN_VECTOR_AGGREGATE_H
#define KNN_VECTOR_AGGREGATE_H

#include "postgres.h"

#include "utils/array.h"

/*
 * The state's values {n, s1, ...} after checking its shape; *dim_out is the
 * number of sums. function_name (the SQL name) is in the error.
 */
extern float8 *knn_avg_state_values(ArrayType *state, const char *function_name, int *dim_out);

/*
 * A new state: state plus one value of value_dim elements (widened to
 * double); ERROR when its dimension is not the state's, or a sum overflows.
 */
extern ArrayType *knn_avg_state_accum(ArrayType *state, const float *value, int value_dim,
									  const char *function_name);

#endif							/* KNN_VECTOR_AGGREGATE_H */
