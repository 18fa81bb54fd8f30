/*
 * halfvec.h -- the halfvec type's storage, identical to pgvector's so that
 * either extension reads the other's datums (and COPY BINARY files): a
 * varlena header, int16 dim, int16 unused (always 0), then dim IEEE
 * binary16 values (kept as their raw bits; kernels/half_float.h converts).
 */
#ifndef KNN_HALFVEC_H
#define KNN_HALFVEC_H

#include "postgres.h"
#include "fmgr.h"

#define HALFVEC_MAX_DIM 16000

typedef struct HalfVector
{
	int32		vl_len_;		/* varlena header (do not touch directly!) */
	int16		dim;			/* number of dimensions */
	int16		unused;			/* reserved for future use, always zero */
	uint16		x[FLEXIBLE_ARRAY_MEMBER];	/* binary16 bits */
} HalfVector;

#define HALFVEC_SIZE(_dim)		(offsetof(HalfVector, x) + sizeof(uint16) * (_dim))
#define DatumGetHalfVector(x)	((HalfVector *) PG_DETOAST_DATUM(x))
/* Every halfvec argument is read through knn_halfvec_arg: size-checked. */
#define PG_GETARG_HALFVEC_P(x)	knn_halfvec_arg(fcinfo, (x))
#define PG_RETURN_HALFVEC_P(x)	PG_RETURN_POINTER(x)

/*
 * Argument n, detoasted; ERROR when its size disagrees with its dim (the
 * elements are read by dim, so such a datum is refused before any is).
 */
extern HalfVector *knn_halfvec_arg(FunctionCallInfo fcinfo, int n);

/* ERROR "different halfvec dimensions %d and %d" unless a and b agree. */
extern void knn_halfvec_check_same_dims(const HalfVector *a, const HalfVector *b);

/* A zero-filled halfvec of dim (checked) dimensions. */
extern HalfVector *knn_halfvec_new(int dim);

/* ERROR unless typmod is -1 or dim (pgvector's message). */
extern void knn_halfvec_check_typmod(int32 typmod, int dim);

/*
 * A float as binary16, rounded to nearest even; ERROR as pgvector's
 * halfvec: out of range for a finite value beyond binary16, NaN and
 * infinities not allowed.
 */
extern uint16 knn_halfvec_element(float value);

/* The values widened to float (exact), into out[dim]. */
extern void knn_halfvec_widen(const HalfVector *v, float *out);

#endif							/* KNN_HALFVEC_H */
