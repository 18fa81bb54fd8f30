/*
 * vector.h -- the vector type's storage, identical to pgvector's so that
 * either extension can read the other's datums (and COPY BINARY files):
 * a varlena header, int16 dim, int16 unused (always 0), then dim float4.
 */
#ifndef KNN_VECTOR_H
#define KNN_VECTOR_H

#include "postgres.h"
#include "fmgr.h"

#define VECTOR_MAX_DIM 16000

typedef struct Vector
{
	int32		vl_len_;		/* varlena header (do not touch directly!) */
	int16		dim;			/* number of dimensions */
	int16		unused;			/* reserved for future use, always zero */
	float		x[FLEXIBLE_ARRAY_MEMBER];
} Vector;

#define VECTOR_SIZE(_dim)		(offsetof(Vector, x) + sizeof(float) * (_dim))
#define DatumGetVector(x)		((Vector *) PG_DETOAST_DATUM(x))
/* Every vector argument is read through knn_vector_arg: size-checked. */
#define PG_GETARG_VECTOR_P(x)	knn_vector_arg(fcinfo, (x))
#define PG_RETURN_VECTOR_P(x)	PG_RETURN_POINTER(x)

extern Vector *knn_vector_new(int dim);

/*
 * Argument n, detoasted; ERROR (XX001) when its size disagrees with its dim
 * (the elements are read by dim, so such a datum is refused before any is).
 */
extern Vector *knn_vector_arg(FunctionCallInfo fcinfo, int n);

#endif							/* KNN_VECTOR_H */
