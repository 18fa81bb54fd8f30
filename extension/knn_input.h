/*
 * knn_input.h -- reading one value (knn_gpu's or pgvector's vector or
 * halfvec, real[], double precision[], bit) as one engine row of an element
 * type (knn_engine.h's KnnElement), with every size checked against the
 * value's actual length before anything is read.
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
	int			dim;			/* 1 .. VECTOR_MAX_DIM (bits: any positive length) */
	const void *elements;		/* dim float4, float8 or binary16, or bit bytes */
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
	KNN_VALUE_NOT_FINITE		/* NaN, an infinity, or beyond the element's range */
} KnnValueProblem;

typedef struct KnnVectorReader
{
	KnnVectorKind kind;
	KnnElement	element;		/* what copy() writes */

	/*
	 * Checks a detoasted value's layout and size and points view at its
	 * elements; anything but KNN_VALUE_OK leaves view unset.
	 */
	KnnValueProblem (*view) (struct varlena *value, KnnVectorView *view);

	/*
	 * Copies the elements as one row of `element` (knn_row_bytes(element,
	 * dim) bytes); false if one is not finite in that element type.
	 */
	bool		(*copy) (const KnnVectorView *view, void *out);
} KnnVectorReader;

/*
 * The reader of values of `kind` as rows of `element`, or NULL where the
 * kind cannot become that element: float32 from vector and the float
 * arrays; float16 from halfvec, and from vector as pgvector's implicit cast
 * vector -> halfvec rounds it; bits from bit.
 */
extern const KnnVectorReader *knn_vector_reader_for(KnnVectorKind kind, KnnElement element);

/* The element type a kind is read as when nothing else decides. */
extern KnnElement knn_vector_kind_element(KnnVectorKind kind);

/* The reader of a supported kind as its own element type; ERROR otherwise. */
extern const KnnVectorReader *knn_vector_reader(KnnVectorKind kind);

/* Bytes of one row of dim elements (knn_engine.h's layouts). */
extern Size knn_row_bytes(KnnElement element, int dim);

/* ERROR (with its SQLSTATE) for a problem of the value of "<set_name> id <id>". */
extern void knn_vector_problem_error(KnnValueProblem problem, const char *set_name,
									 int64 id) pg_attribute_noreturn();

#endif							/* KNN_INPUT_H */
