/*
 * knn_gpu.h -- what the extension's files share: the GUCs, reading vectors
 * out of datums, and running an engine job from a backend.
 */
#ifndef KNN_GPU_H
#define KNN_GPU_H

#include "postgres.h"
#include "fmgr.h"
#include "utils/memutils.h"

#include "knn_engine.h"

/* ---- GUCs (knn_gpu.c) ---- */
extern int	knn_gpu_device;			/* KnnDevice: knn_gpu.device = auto|gpu|cpu */
extern int	knn_gpu_memory_limit_mb;	/* knn_gpu.gpu_memory_limit, 0 = all free */
extern int	knn_gpu_threads;			/* knn_gpu.threads, 0 = all cores */
extern bool knn_gpu_enable_knn_join;	/* knn_gpu.enable_knn_join (CustomScan) */
extern bool knn_gpu_exact_over_index;	/* knn_gpu.exact_over_index (CustomScan) */

/* ---- reading vectors (knn_input.c) ---- */

/* The column types whose values can be read as a float32 vector. */
typedef enum KnnVectorKind
{
	KNN_VECTOR_UNSUPPORTED = 0,
	KNN_VECTOR_TYPE,			/* knn_gpu's or pgvector's vector (one layout) */
	KNN_VECTOR_FLOAT4_ARRAY,	/* real[] */
	KNN_VECTOR_FLOAT8_ARRAY		/* double precision[] */
} KnnVectorKind;

extern KnnVectorKind knn_vector_kind(Oid typid);

/* Dimension of a non-null value; ERROR for a multi-dimensional or NULL-holding array. */
extern int	knn_vector_datum_dim(Datum value, KnnVectorKind kind);

/*
 * Copies a non-null value of dimension dim into out as float32; ERROR with
 * ERRCODE_DATA_EXCEPTION for NaN or Infinity. what names the row in
 * messages ("query id 7").
 */
extern void knn_vector_datum_copy(Datum value, KnnVectorKind kind, int dim,
								  float *out, const char *what);

/* A growing matrix of vectors with their ids, built row by row. */
typedef struct KnnMatrix
{
	int64		n;				/* rows so far */
	int64		capacity;
	int32		dim;			/* -1 until the first row */
	float	   *values;			/* n x dim, row-major (huge allocation) */
	int64	   *ids;
	const char *set_name;		/* "query" or "target", for messages */
	MemoryContext context;		/* where the arrays live (the caller's at init) */
} KnnMatrix;

extern void knn_matrix_init(KnnMatrix *m, const char *set_name);
/* Appends one row; ERROR on a dimension mismatch naming the id. */
extern void knn_matrix_append(KnnMatrix *m, int64 id, Datum value, KnnVectorKind kind);
/* Sorts rows by id (stable), so that row order breaks ties by id. */
extern void knn_matrix_sort_by_id(KnnMatrix *m);
extern void knn_matrix_free(KnnMatrix *m);

/* ---- running the engine (knn_run.c) ---- */

/*
 * Runs the problem on the engine the GUCs choose, polling for cancel and
 * statement_timeout every few milliseconds; ERROR (with a SQLSTATE) on
 * failure, NOTICE when the GPU was wanted but the CPU engine ran. Fills the
 * problem's device, gpu_memory_limit and n_threads from the GUCs. The stats
 * are kept for knn_gpu_last_stats().
 */
extern void knn_run_problem(KnnProblem *problem, int64 *neighbors,
							double *distances, KnnStats *stats);

/* The metric for a name (l2, cosine, ip, l1); ERROR listing the valid ones. */
extern KnnMetric knn_metric_from_name(const char *name);
extern const char *knn_metric_name(KnnMetric metric);
extern KnnMethod knn_method_from_name(const char *name);

/* JSON of the last join's KnnStats (knn_stats.c). */
extern void knn_stats_remember(const KnnStats *stats, const KnnProblem *problem);
/* Time spent reading the inputs and returning rows, measured by the caller. */
extern void knn_stats_set_sql_phases(double seconds_read, double seconds_return);
extern char *knn_stats_last_json(void);

#endif							/* KNN_GPU_H */
