/*
 * knn_join_function_scan.h -- the "KNN Join Function" custom scan over a
 * knn_join call: it returns the call's rows without a tuplestore, and
 * EXPLAIN ANALYZE of it shows the engine's statistics.
 *
 * The planner wraps the Function Scan of a knn_join call in a Custom Scan
 * "KNN Join Function" (set_rel_pathlist_hook) that returns the same rows:
 * knn_join's straight from the engine's arrays, or from a sharded call's
 * merged lists (knn_join_call_direct), knn_range_join's from the Function
 * Scan; a knn_join call that finishes reports its record to it, and
 * EXPLAIN ANALYZE prints the record under the node, as the KNN Join node
 * does.
 */
#ifndef KNN_JOIN_FUNCTION_SCAN_H
#define KNN_JOIN_FUNCTION_SCAN_H

#include "postgres.h"

#include "fmgr.h"

#include "knn_stats.h"

/* The C entry points of knn_join's SQL forms (knn_join.c). */
extern Datum knn_join(PG_FUNCTION_ARGS);
extern Datum knn_join_params(PG_FUNCTION_ARGS);
extern Datum knn_join_keyed(PG_FUNCTION_ARGS);
extern Datum knn_range_join(PG_FUNCTION_ARGS);

/*
 * knn_join's result as the engine left it, for the custom scan to return
 * rows from without a tuplestore (knn_join_call_direct), in one of two
 * shapes. The engine's: neighbors (not NULL) holds n_queries x slots
 * target rows, a negative one ending a query's. A sharded call's merged
 * lists (knn_shard.h): offsets (not NULL) says where each query's rows
 * are, in rank order, in target_ids and distances. The arrays live in the
 * per-query memory of the call's ReturnSetInfo (the node's, reset when it
 * calls again or ends).
 */
typedef struct KnnJoinDirect
{
	int64		n_queries;
	const int64 *query_ids;		/* per query row: its id (keyed: its key's rank) */
	/* the engine's shape */
	int32		slots;			/* per query; a negative neighbour ends a query's */
	const int64 *target_ids;	/* per target row; merged: per row */
	const int64 *neighbors;		/* n_queries x slots target rows */
	const double *distances;	/* n_queries x slots; merged: per row */
	const Datum *query_keys;	/* keyed calls: the key of each rank, else NULL */
	const Datum *target_keys;
	/* the merged shape: query row q's rows are offsets[q] .. offsets[q+1]-1 */
	const int64 *offsets;		/* n_queries + 1 */
} KnnJoinDirect;

/*
 * Calls knn_join (one of its forms, through fcinfo, whose resultinfo is a
 * ReturnSetInfo allowing SFRM_Materialize) asking for its rows as arrays:
 * true when they are in *result; false when the rows went into the
 * ReturnSetInfo's tuplestore as usual (an empty result). knn_range_join
 * never comes here (the node runs its Function Scan).
 */
extern bool knn_join_call_direct(FunctionCallInfo fcinfo, KnnJoinDirect *result);

/* Installs the planner hook and the node's methods; from _PG_init. */
extern void knn_join_function_scan_register(void);

/*
 * Around a knn_join call (knn_join_run_reported): its reports go to the node
 * that made the call, not those of calls inside its texts. enter returns
 * what leave restores (on every exit).
 */
extern void *knn_join_explain_enter(void);
extern void knn_join_explain_leave(void *outer);

/* A knn_join call's record, for the node reading its rows (if any). */
extern void knn_join_explain_report(const KnnJoinRecord *record);

/* A sharded call's summary (knn_shard.h), for the node reading its rows (if any). */
struct KnnShardSummary;
extern void knn_join_explain_report_shards(const struct KnnShardSummary *summary);

/*
 * Plain EXPLAIN of a call of constant arguments: prepares its texts and
 * finds its shards as the call would, reporting them as a summary that did
 * not run (knn_join.c); reads no row, joins nothing.
 */
struct FuncExpr;
extern void knn_join_describe(struct FuncExpr *call);

#endif							/* KNN_JOIN_FUNCTION_SCAN_H */
