/*
 * knn_progress.h -- progress of a running join, visible from other
 * sessions in the knn_gpu_progress view (joined to pg_stat_activity).
 *
 * PostgreSQL 15 gives an extension neither a progress command type nor
 * shared memory without shared_preload_libraries, so each backend keeps
 * one small file, pg_stat_tmp/knn_gpu_progress.<pid>, rewritten in place
 * (one pwrite) at each phase change and at most every 100 ms while rows
 * are counted; knn_gpu_progress_rows() reads the files of live backends.
 *
 * A join calls begin, then phase/rows/totals as it goes, then end (also
 * on the error path where it has one; a row left behind by an ERROR is
 * hidden by the view, which keeps only a row whose statement is still
 * the backend's running one; the abort of the (sub)transaction in which a
 * join began ends its row too). A join begun inside another of the same
 * statement (in its query text) leaves the row to the outer one. The file
 * of a backend that died without removing it is removed by the next
 * reader.
 */
#ifndef KNN_PROGRESS_H
#define KNN_PROGRESS_H

#include "postgres.h"

typedef enum KnnProgressPhase
{
	KNN_PROGRESS_IDLE = 0,
	KNN_PROGRESS_READING_QUERIES,
	KNN_PROGRESS_READING_TARGETS,
	KNN_PROGRESS_SORTING,		/* putting rows in key order */
	KNN_PROGRESS_ENGINE,		/* clustering, filtering, selecting */
	KNN_PROGRESS_RETURNING
} KnnProgressPhase;

/* Registers the transaction callbacks that end a row an ERROR left (_PG_init). */
extern void knn_progress_init(void);

/*
 * source: what runs the join ("knn_join", "knn_range_join", "KNN Join").
 * Callers: knn_join.c (both functions) and knn_scan_exec.c (the node).
 */
extern void knn_progress_begin(const char *source, int32 k);
extern void knn_progress_phase(KnnProgressPhase phase);

/* k once it is known (a KNN Join's LIMIT is evaluated after its outer rows). */
extern void knn_progress_k(int32 k);

/* n more rows read (reading phases) or returned (returning). */
extern void knn_progress_rows(int64 n);

/* The sizes known once the rows are read (-1: unknown). */
extern void knn_progress_totals(int64 n_queries, int64 n_targets, int64 result_rows);

/* The engine's distance computations, once it has finished. */
extern void knn_progress_work(int64 distance_computations);

extern void knn_progress_end(void);

#endif							/* KNN_PROGRESS_H */
