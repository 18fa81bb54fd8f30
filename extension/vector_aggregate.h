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
 * The final function's values: each sum over the count, in double, rounded
 * to float; NULL when the count is 0 (SQL's avg of no values). *dim_out is
 * their number (0 for a state without sums). The state's shape is checked
 * first; function_name (the SQL name) is in the error.
 */
extern float *knn_avg_state_means(ArrayType *state, const char *function_name, int *dim_out);

/*
 * A new state: state plus one value of value_dim elements (widened to
 * double); ERROR when its dimension is not the state's, or a sum overflows.
 */
extern ArrayType *knn_avg_state_accum(ArrayType *state, const float *value, int value_dim,
									  const char *function_name);

#endif							/* KNN_VECTOR_AGGREGATE_H */
