/*
 * knn_stats.h -- the record of one join: the engine's statistics plus the
 * backend's phase times. knn_stats.c alone builds it, keeps the last one
 * for knn_gpu_last_stats(), and shows it in EXPLAIN ANALYZE.
 */
#ifndef KNN_STATS_H
#define KNN_STATS_H

#include "postgres.h"

#include "commands/explain.h"
#include "portability/instr_time.h"

#include "knn_engine.h"
#include "knn_run.h"

typedef struct KnnJoinRecord
{
	int64		n_queries;
	int64		n_targets;
	int32		dim;
	int32		k;
	KnnMetric	metric;
	KnnElement	element;		/* of the rows the extension read */
	KnnStats	engine;
	double		seconds_read;	/* reading both sides' rows */
	double		seconds_sort;	/* putting rows in id order */
	double		seconds_return; /* handing rows back (0 where not measured) */
	KnnAdmissionRecord admission;	/* the GPU slot, and the wait for it */
} KnnJoinRecord;

/* Seconds from start to now: the record's phase times. */
static inline double
knn_seconds_since(instr_time start)
{
	instr_time	now;

	INSTR_TIME_SET_CURRENT(now);
	INSTR_TIME_SUBTRACT(now, start);
	return INSTR_TIME_GET_DOUBLE(now);
}

/*
 * Builds the record of a finished join into *record and keeps a copy as
 * this backend's last join. Called right after knn_run_problem: the
 * admission is that call's.
 */
extern void knn_stats_record(KnnJoinRecord *record, const KnnProblem *problem,
							 const KnnStats *engine, double seconds_read,
							 double seconds_sort, double seconds_return);

/*
 * Sets a record's seconds of handing rows back, measured after
 * knn_stats_record (knn_join's rows returned by its custom scan), in the
 * backend's last join too when that is the same join.
 */
extern void knn_stats_set_return(KnnJoinRecord *record, double seconds_return);

/* Adds one batch's engine statistics to a join's (first: the first batch's names and devices). */
extern void knn_stats_add(KnnStats *total, const KnnStats *batch, bool first);

/* EXPLAIN ANALYZE's lines for a record. */
extern void knn_stats_explain(const KnnJoinRecord *record, ExplainState *es);

#endif							/* KNN_STATS_H */
