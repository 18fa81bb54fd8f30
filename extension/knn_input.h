/*
 * knn_input.h -- reading one vector value (knn_gpu's or pgvector's vector,
 * real[], double precision[]) as float32, with every size checked against
 * the value's actual length before anything is read.
 *
 * A reader is chosen once per column (knn_vector_reader), then used for
 * every row: no per-row type dispatch.
 */
#ifndef KNN_INPUT_H
#define KNN_INPUT_H

#include "postgres.h"

#include "knn_catalog.h"

/* A value's elements, checked to lie within the value. */
typedef struct KnnVectorView
{
	int			dim;			/* 1 .. VECTOR_MAX_DIM */
	const void *elements;		/* dim float4 or float8 */
} KnnVectorView;

/* What can be wrong with a value. */
typedef enum KnnValueProblem
{
	KNN_VALUE_OK = 0,
	KNN_VALUE_MALFORMED,		/* its length does not hold what its header says */
	KNN_VALUE_EMPTY,
	KNN_VALUE_TOO_LONG,			/* more than VECTOR_MAX_DIM dimensions */
	KNN_VALUE_NOT_1D,			/* a multi-dimensional array */
	KNN_VALUE_NULLS,			/* an array with NULL elements */
	KNN_VALUE_NOT_FINITE		/* NaN, an infinity, or beyond float4's range */
} KnnValueProblem;

typedef struct KnnVectorReader
{
	KnnVectorKind kind;

	/*
	 * Checks a detoasted value's layout and size and points view at its
	 * elements; anything but KNN_VALUE_OK leaves view unset.
	 */
	KnnValueProblem (*view) (struct varlena *value, KnnVectorView *view);

	/* Copies the elements as float32; false if one is not finite as float32. */
	bool		(*copy) (const KnnVectorView *view, float *out);
} KnnVectorReader;

/* The reader of a supported kind; ERROR for KNN_VECTOR_UNSUPPORTED. */
extern const KnnVectorReader *knn_vector_reader(KnnVectorKind kind);

/* ERROR (with its SQLSTATE) for a problem of the value of "<set_name> id <id>". */
extern void knn_vector_problem_error(KnnValueProblem problem, const char *set_name,
									 int64 id) pg_attribute_noreturn();

#endif							/* KNN_INPUT_H */
