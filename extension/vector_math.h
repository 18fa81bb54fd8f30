/*
 * vector_math.h -- helpers shared by the functions of vector values
 * (vector_math.c, vector_aggregate.c, vector.c's vector_norm) and, for
 * subvector, by halfvec's (halfvec_math.c).
 */
#ifndef KNN_VECTOR_MATH_H
#define KNN_VECTOR_MATH_H

#include "postgres.h"
#include "fmgr.h"

#include "vector.h"

/* ERROR "different vector dimensions %d and %d" unless a and b agree. */
extern void knn_vector_check_same_dims(const Vector *a, const Vector *b);

/*
 * knn_vector_norm_of's sum over any n floats (sparsevec's stored values).
 */
extern double knn_float_norm(const float *x, int n);

/*
 * The Euclidean norm with pgvector's arithmetic: squares summed in double
 * precision (no float vector overflows it), in the order of pgvector's
 * packaged build (see vector_math.c).
 */
extern double knn_vector_norm_of(const Vector *v);

/*
 * subvector(v, start, count) of a value of dim elements (vector or
 * halfvec): returns the result's element count and sets *first to its
 * first element (0-based); ERROR "<type_name> must have at least 1
 * dimension" when nothing remains, as pgvector.
 */
extern int	knn_subvector_range(int dim, int32 start, int32 count, const char *type_name,
								int *first);

#endif							/* KNN_VECTOR_MATH_H */
