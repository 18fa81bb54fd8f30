/*
 * knn_shard.h -- joins over a table sharded across PostgreSQL servers: a
 * partitioned table (or a single foreign table) whose partitions are
 * postgres_fdw foreign tables of servers where knn_gpu is installed. Each
 * such server joins the query vectors against its own rows (its remote
 * SELECT, with the filters postgres_fdw pushed down), all servers at once;
 * the other partitions are read and joined here; the per-query lists are
 * merged into the exact global answer.
 *
 * Two joins use it: knn_join (knn_shard.c's knn_shard_try_join) and the
 * KNN Join node (knn_scan_shard.c). Both find their shards in a plan with
 * knn_shard_classify and knn_shard_open, and describe them in EXPLAIN
 * with knn_shard_explain (knn_shard_explain.c).
 */
#ifndef KNN_SHARD_H
#define KNN_SHARD_H

#include "postgres.h"

#include "commands/explain.h"
#include "executor/spi.h"
#include "nodes/execnodes.h"
#include "nodes/params.h"
#include "nodes/plannodes.h"

#include "knn_catalog.h"
#include "knn_matrix.h"
#include "knn_operator_values.h"
#include "knn_shard_remote.h"

/* ---- finding the shards in a plan (knn_shard.c) ---- */

/* One partition scan that can run on its server as it is. */
typedef struct KnnShardScan
{
	int			index;			/* among the plan's partition scans */
	char	   *relation;		/* the foreign table's name here, for EXPLAIN */
	Oid			relid;			/* the foreign table */
	char	   *remote_select;	/* postgres_fdw's SELECT for it */
	int			n_retrieved;	/* its columns, named c1 .. cn by the callers */
	int		   *positions;		/* per output column of the scan: its c<i> */
	int			n_columns;
	/* per output column of the scan: the foreign table's column, its declared type and typmod */
	AttrNumber *attnos;
	Oid		   *types;
	int32	   *typmods;
} KnnShardScan;

/* A plan's partition scans, the ones that can run on their servers in shards. */
typedef struct KnnShardPlan
{
	const char *who;			/* "knn_join" or "KNN Join", for messages */
	List	   *scans;			/* the partitions' scans, in the plan's order */
	int			n_scans;
	int		   *shard_of;		/* per scan: its shard, -1 = read here */
	KnnShardRemote **shards;	/* one per user mapping (one connection) */
	int			n_shards;
	char	   *read_here;		/* the servers (partitions) knn_shard_open left here, or NULL */
	/*
	 * The scans' output columns (1-based) the shards' joins compute with,
	 * set by the caller before knn_shard_open: a partition whose column
	 * there is not of the type declared here is read here
	 * (knn_shard_types.c).
	 */
	const AttrNumber *typed_columns;
	int			n_typed_columns;
	/*
	 * knn_join's: the extension whose vector or halfvec type its query rows
	 * must have there (and its version), set by the caller before
	 * knn_shard_open; NULL: either, knn_gpu's first (the KNN Join node
	 * ships as its operator's operand type instead).
	 */
	const char *query_type_extension;
	const char *query_type_version;
} KnnShardPlan;

/* The partition scans under the top of a plan (an Append, a MergeAppend, a ForeignScan), or NIL. */
extern List *knn_shard_partition_scans(Plan *top);

/*
 * Sorts sp->scans (set by the caller) into shards by user mapping (the
 * range table's checkAsUser, as postgres_fdw picks it): the scans of
 * postgres_fdw servers whose whole work is their remote SELECT, returning
 * plain columns. A postgres_fdw scan that filters or computes here stays
 * here, with a NOTICE naming the table.
 */
extern void knn_shard_classify(KnnShardPlan *sp, List *rtable);

/* Says why a shard cannot join (after knn_shard_remote_open), or NULL. */
typedef const char *(*KnnShardCheck) (void *arg, KnnShardRemote *shard);

/*
 * Adds {"server": ..., ["partition": ...,] "reason": ...} to fallbacks (JSON
 * objects, comma-separated): a server (or one partition of it) read here.
 */
extern void knn_shard_add_fallback(StringInfo fallbacks, const char *server,
								   const char *partition, const char *why);

/*
 * Opens every shard; a shard that cannot join (no knn_gpu there, another
 * version, no type for the rows, check's reason) is read here, with a
 * NOTICE, and listed in fallbacks (JSON objects, comma-separated) when
 * that is not NULL. So is a partition whose typed column (sp's
 * typed_columns) has there another type than here (knn_shard_types.c). The
 * shards that join stay, compacted.
 */
extern void knn_shard_open(KnnShardPlan *sp, KnnElement element, KnnShardCheck check,
						   void *check_arg, StringInfo fallbacks);

/*
 * May the part of the plan `top` read here (all but the scans that join
 * on their servers) use the connection of a shard: a postgres_fdw scan on
 * it anywhere in that part (a foreign partition that cannot join there, a
 * subquery's), or something that may run SQL of its own (a nested
 * knn_join, a PL function, a subquery's plan; nodes not known are taken
 * as may)? Then the part read here must wait for the shards: one
 * connection runs one statement at a time.
 */
extern bool knn_shard_local_needs_shard_connection(const KnnShardPlan *sp, Plan *top,
												   List *rtable);

/*
 * A copy of the top of the plan without the scans that join on their
 * servers (the plan itself stays as it was), or NULL when none is left.
 */
extern Plan *knn_shard_local_plan(Plan *top, const KnnShardPlan *sp);

/* ---- the partitions' column types there (knn_shard_types.c) ---- */

/*
 * The select-list fields (", f1, ...": *n_fields of them, 0 or 1) that ask
 * the shard, within its check at opening (knn_shard_remote_open: no round
 * trip of their own), the type of each typed column of each of its
 * partitions (the table and columns postgres_fdw's SELECT names there).
 */
extern char *knn_shard_types_fields(const KnnShardPlan *sp, const KnnShardRemote *shard,
									int *n_fields);

/*
 * Their answers (fields: each field's text, NULL for NULL): a partition
 * one of whose typed columns there is not exactly the type declared here
 * (catalog identity, and the declared typmod where there is one) is
 * taken out of the shard and read here, through postgres_fdw as a plain
 * scan reads it, with a NOTICE naming the table and column; it is added
 * to sp->read_here ("server (partition, ...)") and to fallbacks (when not
 * NULL). Exact: the shard would join the values of its own type (a
 * halfvec column under a declared vector: halfvec distances), this
 * server's read gives those of the declared one.
 */
extern void knn_shard_types_check(KnnShardPlan *sp, KnnShardRemote *shard, char **fields,
								  StringInfo fallbacks);

/* "(<remote select>) alias(c1, ..., cn)": a scan's rows there, for FROM. */
extern char *knn_shard_scan_from(const KnnShardScan *scan, const char *alias);

/*
 * A float8's text for a shard (a literal or a parameter's value): the
 * shortest digits that read back to the same value (NaN, Infinity and
 * -Infinity as float8in reads them), whatever this session's
 * extra_float_digits.
 */
extern char *knn_shard_float8_text(double value);

/* ---- knn_join (knn_shard.c) ---- */

/* What a knn_join call asks of its shards. */
typedef struct KnnShardJoin
{
	int32		k;				/* knn_join: k; knn_range_join: the cap, 0 = none */
	KnnMetric	metric;
	bool		exclude_self;
	KnnMethod	method;
	bool		range;			/* knn_range_join: every pair within radius */
	double		radius;
	bool		inclusive;
	ParamListInfo params;		/* the targets text's bound parameters, or NULL */
	const char *not_pushed;		/* why this call joins here (a form not pushed down), or NULL */
	KnnOperatorValues *by_operator; /* pgvector's operator ranks (the part joined here), or NULL */
	bool		describe_only;	/* EXPLAIN: find the shards, run nothing */
	struct KnnPackedRows *packed;	/* knn_join_packed: the rows go there, or NULL */
	struct KnnJoinDirect *direct;	/* the KNN Join Function node's direct return: the rows go there, or NULL */
	FunctionCallInfo fcinfo;	/* the call: a merge in batches materialises a packed form called value per call */
} KnnShardJoin;

/* A sharded knn_join begun before its queries are read (knn_shard_start). */
typedef struct KnnShardEarly KnnShardEarly;

/*
 * Called by knn_join before it reads its queries (of `element`; grouped:
 * with group key columns): when the targets are sharded and the call can
 * go to the shards, opens them and has each one read its targets now
 * (knn_shard_prefetch_targets there), while the caller reads its queries.
 * Where the queries text might use the shards' connections itself (a
 * foreign table, a function that runs SQL), the shards are only found
 * (their NOTICEs said) and opened after the queries are read. NULL with
 * knn_gpu.shard_prefetch off, or for EXPLAIN: knn_shard_try_join then does
 * it all, as before. Otherwise what knn_shard_try_join must be given.
 */
extern KnnShardEarly *knn_shard_start(SPIPlanPtr queries_plan, SPIPlanPtr targets_plan,
									  KnnElement element, bool grouped, const KnnShardJoin *join,
									  bool queries_are_targets);

/*
 * A self-join (queries_are_targets: the queries text is the targets text,
 * with the same parameters, and stable) whose every partition joins on a
 * shard that can send its rows back: knn_shard_start had the shards read
 * the rows as their targets. Where those rows are what this server's read
 * of the text would give (the types declared here, by catalog identity; a
 * dimension the declared type allows), this appends them, fetched from
 * all shards at once in binary (the very values they join) and decoded as
 * they arrive, to `queries` (knn_matrix_init'ed with the join's element,
 * empty), shard by shard, each shard's in the order it read them (not
 * necessarily a read here's order: the join sorts them by id), and returns
 * true. Otherwise false (also where ids repeat: the call then joins here,
 * on the rows in the order of a read here): the caller reads its queries
 * text (early may be NULL).
 */
extern bool knn_shard_read_queries(KnnShardEarly *early, KnnMatrix *queries);

/*
 * Called by knn_join's query read after each row it appends to `queries`
 * (early may be NULL): where the shards opened early receive in blocks,
 * ships the complete blocks of the rows read so far once their prefetches
 * are done (knn_shard_remote_ship_poll: without waiting), so that when the
 * read ends only the last blocks remain for knn_shard_try_join. Cheap
 * between its looks (a comparison).
 */
extern void knn_shard_queries_added(KnnShardEarly *early, const KnnMatrix *queries);

/*
 * Called by knn_join when its query read fails (in PG_CATCH): the
 * shipping begun meanwhile leaves the connections to postgres_fdw's abort
 * cleanup, which takes the rows back there.
 */
extern void knn_shard_queries_failed(KnnShardEarly *early);

/* The caller's time reading its queries, for the statistics (early may be NULL). */
extern void knn_shard_queries_read(KnnShardEarly *early, double seconds);

/*
 * Called by knn_join once the queries are read (into `queries`, any order)
 * and before the targets are: when the prepared targets text scans
 * foreign partitions that can join on their servers, runs the whole join,
 * puts its rows into rsinfo's tuplestore and returns true (the caller then
 * only finishes SPI). Returns false when there is nothing to push down
 * (the queries may have been put in id order meanwhile, which the caller
 * does anyway), with a NOTICE when there were shards but the call cannot
 * go to them: the caller joins as usual (the shards then hold nothing and
 * their connections are free). early: knn_shard_start's, or NULL. Runs
 * inside the caller's SPI connection.
 */
extern bool knn_shard_try_join(ReturnSetInfo *rsinfo, KnnMatrix *queries,
							   SPIPlanPtr targets_plan, const char *targets_sql,
							   KnnVectorKind target_kind, const KnnShardJoin *join,
							   KnnShardEarly *early);

/*
 * One source's candidates per query (a shard's result, or the local
 * part's): those of query row q are entries offsets[q] .. offsets[q+1]-1.
 */
typedef struct KnnShardLists
{
	int64		n_queries;
	int64	   *offsets;		/* n_queries + 1 */
	int64	   *target_ids;
	double	   *distances;
} KnnShardLists;

/*
 * Merges the sources' lists into the best `limit` per query (-1: all),
 * ordered by (distance, NaN last, target id), and puts them into rsinfo's
 * tuplestore with ranks from 1 (or into packed, when not NULL; or, when
 * direct is not NULL, into its merged lists, allocated in rsinfo's
 * per-query memory: knn_join_function_scan.h). query_ids[q] is query row
 * q's id. Returns the rows put.
 */
extern int64 knn_shard_merge(ReturnSetInfo *rsinfo, const int64 *query_ids, int64 n_queries,
							 const KnnShardLists *sources, int n_sources, int64 limit,
							 struct KnnPackedRows *packed, struct KnnJoinDirect *direct);

/*
 * The statistics of this backend's last sharded join, as JSON
 * (TopMemoryContext), kept with the role it ran as (knn_role_visibility.h).
 */
extern void knn_shard_set_last_stats(const char *json);

struct KnnShardSummary;

/*
 * Records a finished sharded join as knn_gpu_last_shard_stats() gives it:
 * per shard its server, partitions, rows, time, remote SQL and its own
 * knn_gpu_last_stats(); the servers read here (fallbacks: JSON objects);
 * the local part; the phases.
 */
extern void knn_shard_record_stats(const KnnShardPlan *sp, const struct KnnShardSummary *summary,
								   int64 n_queries, int64 k, const char *fallbacks,
								   double seconds_total);

/* ---- EXPLAIN (knn_shard_explain.c) ---- */

/* What a sharded join did (or, for plain EXPLAIN, would do), per shard. */
typedef struct KnnShardSummaryShard
{
	char	   *server;
	char	   *partitions;		/* "items_1, items_3" */
	char	   *remote_sql;
	int64		rows;
	double		seconds_ship;
	double		seconds_join;
	double		seconds_read;	/* its targets read ahead of the queries, -1 = not */
	int64		targets_read;
} KnnShardSummaryShard;

typedef struct KnnShardSummary
{
	bool		ran;			/* false: plain EXPLAIN, nothing ran */
	int			n_shards;
	KnnShardSummaryShard *shards;
	char	   *read_here;		/* the servers read here, or NULL */
	int64		local_targets;	/* rows joined here */
	bool		local_after;	/* read after the shards' results (it may use their connections) */
	int64		rows;			/* rows of the merge */
	int64		merge_batches;	/* > 0: merged in batches of queries (knn_gpu.max_result_memory) */
	double		seconds_queries;	/* the coordinator's query read, -1 = not known */
	bool		queries_from_shards;	/* ... the shards' rows fetched back (a self-join) */
	bool		queries_relayed;	/* ... and sent on to the other shards as they came */
	bool		queries_streamed;	/* ... the shards sending them as they read them */
	double		seconds_prefetch_wait;	/* then waiting for the shards' target reads */
	double		seconds_ship;
	double		seconds_local;
	double		seconds_merge;
	int64		calls;			/* the calls summed (knn_shard_summary_add), 0 = one */
} KnnShardSummary;

/* The summary of a plan's shards (before or after a run), in memory of the caller. */
extern void knn_shard_summarize(KnnShardSummary *summary, const KnnShardPlan *sp);

/*
 * Adds a call's summary to a node's sum (NULL: a copy of it), in context:
 * each shard's rows and times to those of the shard of the same server
 * and partitions (a new one after them), the merge's to the merge's; the
 * remote SQL and the servers read here are the last call's. Returns the
 * sum. (EXPLAIN ANALYZE shows every call of the statement, as
 * knn_stats.h's KnnJoinTotals.)
 */
extern KnnShardSummary *knn_shard_summary_add(KnnShardSummary *total,
											  const KnnShardSummary *summary,
											  MemoryContext context);

/* EXPLAIN lines: "Shard: server (partitions)", its "Remote SQL", and with ANALYZE rows and times. */
extern void knn_shard_explain(const KnnShardSummary *summary, ExplainState *es);

#endif							/* KNN_SHARD_H */
