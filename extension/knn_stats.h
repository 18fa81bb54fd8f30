/*
 * knn_stats.h -- the record of one join: the engine's statistics plus the
 * backend's phase times. knn_stats.c alone builds it, keeps the last one
 * for knn_gpu_last_stats() (with the role it ran as: knn_role_visibility.h),
 * and shows it in EXPLAIN ANALYZE.
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

/*
 * Adds one batch's engine statistics to a join's: counts and times, and
 * each GPU engine's share to the same engine's (first: the batch's as
 * they are).
 */
extern void knn_stats_add(KnnStats *total, const KnnStats *batch, bool first);

/*
 * Every engine run of one plan node in a statement (each loop's, and each
 * run of a loop that runs the engine more than once), as EXPLAIN ANALYZE
 * shows them. Counts and times are totals over the runs, as PostgreSQL
 * totals a node's buffers over its loops (not averages per loop, as its
 * rows). What describes one run (engine device, method, variant,
 * dimensions, GPU slot) is one value where the runs agree; otherwise the
 * explain lines say that they differ. Zeroed: no run.
 */
typedef struct KnnJoinTotals
{
	int64		runs;			/* records added */
	KnnJoinRecord sum;			/* counts and times summed; the last run's names */
	int64		method_runs[KNN_METHOD_BRUTE + 1];	/* runs per method that ran */
	bool		device_differs; /* some run's engine device is not the last's */
	bool		variant_differs;	/* ... its variant */
	int32		min_dim;
	int32		max_dim;
	int64		admitted;		/* runs that took a GPU slot */
	int64		queued;			/* ... after waiting for one */
	int			min_slot;		/* the slots they took */
	int			max_slot;
} KnnJoinTotals;

/* Adds one run's record to a node's totals. */
extern void knn_stats_totals_add(KnnJoinTotals *totals, const KnnJoinRecord *record);

/* EXPLAIN ANALYZE's lines for a node's runs (nothing where none ran). */
extern void knn_stats_explain(const KnnJoinTotals *totals, ExplainState *es);

#endif							/* KNN_STATS_H */
