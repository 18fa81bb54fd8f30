/*
 * sparsevec.h -- the sparsevec type's storage, identical to pgvector's so
 * that either extension reads the other's datums (a dump and restore, or a
 * later switch to pgvector, reads the same bytes): a varlena header, int32
 * dim, int32 nnz (the number of stored elements), int32 unused (always 0),
 * then nnz int32 indices (0-based, strictly ascending, each below dim),
 * then nnz float4 values (finite, never zero). The text form numbers the
 * indices from 1; the binary form is the stored fields in network order.
 */
#ifndef KNN_SPARSEVEC_H
#define KNN_SPARSEVEC_H

#include "postgres.h"
#include "fmgr.h"

#define SPARSEVEC_MAX_DIM 1000000000
#define SPARSEVEC_MAX_NNZ 16000

typedef struct SparseVector
{
	int32		vl_len_;		/* varlena header (do not touch directly!) */
	int32		dim;			/* number of dimensions */
	int32		nnz;			/* number of stored (non-zero) elements */
	int32		unused;			/* reserved for future use, always zero */
	int32		indices[FLEXIBLE_ARRAY_MEMBER];	/* then nnz float4 values */
} SparseVector;

#define SPARSEVEC_HEADER_SIZE	offsetof(SparseVector, indices)

/* The size of a value with nnz elements; nnz is at most SPARSEVEC_MAX_NNZ. */
static inline Size
SPARSEVEC_SIZE(int nnz)
{
	return SPARSEVEC_HEADER_SIZE + (Size) nnz * (sizeof(int32) + sizeof(float));
}

static inline float *
SPARSEVEC_VALUES(const SparseVector *v)
{
	return (float *) ((char *) v + SPARSEVEC_HEADER_SIZE + (Size) v->nnz * sizeof(int32));
}

/*
 * Argument n, detoasted, after checking its header against its size: dim
 * in 1..SPARSEVEC_MAX_DIM, nnz in 0..min(dim, SPARSEVEC_MAX_NNZ) and the
 * size exactly that of nnz elements, so that nothing beyond the value is
 * ever read. (Indices are not re-checked here: a reader that addresses
 * memory with them checks each one.)
 */
extern SparseVector *knn_sparsevec_arg(FunctionCallInfo fcinfo, int n);

/* A value of dim dimensions with room for nnz elements (both checked). */
extern SparseVector *knn_sparsevec_new(int dim, int nnz);

/*
 * The validity rules, with pgvector's SQLSTATEs and messages (the typmod's:
 * knn_vector_check_typmod, vector_checks.h).
 */
extern void knn_sparsevec_check_dim(int dim);
extern void knn_sparsevec_check_nnz(int nnz, int dim);
extern void knn_sparsevec_check_element(float value);

#endif							/* KNN_SPARSEVEC_H */
