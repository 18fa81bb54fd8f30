/*
 * knn_scan_shard.h -- the KNN Join node over a sharded inner relation: a
 * partitioned table whose partitions are postgres_fdw foreign tables of
 * servers where knn_gpu is installed (knn_shard.h).
 *
 * The shards are found when the node starts (knn_scan_shards_begin): the
 * node then runs its inner plan without the partitions that join on their
 * servers. Each run ships the outer rows' query vectors (and their
 * self-exclusion and group values) to every shard, where the same LATERAL
 * top-k query runs against each partition, with the LIMIT of the node's
 * OFFSET + LIMIT; the node joins the other partitions here meanwhile, and
 * the per-outer-row candidates of all sources are merged in the order the
 * subquery's ORDER BY gives: distance (NaN after numbers, NULL last), the
 * ORDER BY keys after it, then source and rank. The node then returns
 * them as it returns its own rows (OFFSET, LIMIT, WITH TIES, filters,
 * LEFT JOIN). The shards' rows are read as they arrive; of an outer
 * row's only those that can still be among its first OFFSET + LIMIT rows
 * are kept, and what the candidates hold (their rows read back, the
 * merge's copy) counts against knn_gpu.max_result_memory as it is taken
 * (KnnScanCandidates).
 */
#ifndef KNN_SCAN_SHARD_H
#define KNN_SCAN_SHARD_H

#include "postgres.h"

#include "commands/explain.h"
#include "executor/tuptable.h"
#include "nodes/bitmapset.h"
#include "nodes/plannodes.h"

#include "knn_catalog.h"
#include "knn_engine.h"

typedef struct KnnScanShards KnnScanShards;

/* What the node's shards must know of the node (its plan, at BeginCustomScan). */
typedef struct KnnScanShardSpec
{
	Oid			distance_operator;
	bool		target_is_left;
	AttrNumber	target_column;	/* the target vector in the inner rows */
	TupleDesc	outer_desc;		/* the outer child's rows */
	AttrNumber	query_column;	/* the query vector in them (0: an expression
								 * of them, which keeps the join here) */
	AttrNumber	exclude_query_column;	/* "t.k <> q.k": 0 = none */
	AttrNumber	exclude_target_column;
	Oid			exclude_type;
	Oid			exclude_collation;
	int			n_group_columns;	/* "t.g = q.g ..." */
	const AttrNumber *group_query_columns;
	const AttrNumber *group_target_columns;
	const Oid  *group_types;
	const Oid  *group_collations;
	KnnRange	radius_mode;
	bool		has_limit;
	bool		with_ties;
	int			n_order_keys;	/* the ORDER BY keys after the distance */
	const AttrNumber *order_columns;	/* in the inner rows */
	const Oid  *order_operators;
	const Oid  *order_collations;
	const bool *order_nulls_first;
	Bitmapset  *read_back;		/* inner columns the node reads from the rows it returns */
} KnnScanShardSpec;

/*
 * At BeginCustomScan, before the inner plan is started: finds and opens
 * the shards of the inner plan (NOTICEs for what is read here and why);
 * returns the plan to run here, without the partitions that join on their
 * servers (inner_plan itself, and *shards NULL, when none does).
 */
extern Plan *knn_scan_shards_begin(Plan *inner_plan, List *rtable, const KnnScanShardSpec *spec,
								   KnnScanShards **shards);

/*
 * One run: ships the outer rows (read back through outer_slot) and sends
 * every shard its join, for `want` rows per outer row (OFFSET + LIMIT, -1
 * = all) and the radius; returns at once.
 */
extern void knn_scan_shards_start(KnnScanShards *shards, MinimalTuple *outer_rows, int64 n_outer,
								  TupleTableSlot *outer_slot, int64 want, double radius);

/* Must the inner plan run after the shards' results are in (it uses their connections)? */
extern bool knn_scan_shards_local_after(const KnnScanShards *shards);

/* One candidate row of an outer row: the local part's, or a shard's. */
typedef struct KnnScanCandidate
{
	int64		outer_row;
	int64		inner_row;		/* in the node's inner rows */
	double		distance;
	bool		distance_null;
	int			source;			/* 0 = here, then the shards */
	int64		rank;			/* within the outer row and source */
} KnnScanCandidate;

/*
 * The candidates of every outer row: the local part's and, once the
 * shards' rows are in, theirs. What the join holds for them (this array;
 * the local part's engine arrays and the inner rows' pointers, counted by
 * the node; through knn_scan_shards_collect the shards' rows read back and
 * the batch of a shard's cursor being read; through knn_scan_shards_merge
 * the merge's copy) is counted in held_bytes as it is taken against
 * knn_gpu.max_result_memory: the coordinator holds no more than the limit
 * for them.
 */
typedef struct KnnScanCandidates
{
	int64		n;
	int64		capacity;
	KnnScanCandidate *items;
	int64		held_bytes;
} KnnScanCandidates;

/* A result slot (neighbour, distance), and a radius join's pair (with its query). */
#define KNN_SLOT_BYTES (sizeof(int64) + sizeof(double))
#define KNN_RANGE_PAIR_BYTES (2 * sizeof(int64) + sizeof(double))

/* Empty candidates (they count the bytes they hold, not rows of the result). */
extern void knn_scan_candidates_begin(KnnScanCandidates *candidates);

/* Adds one; ERROR 54000, before it is kept, when what they hold then passes the limit. */
extern void knn_scan_candidates_add(KnnScanCandidates *candidates, const KnnScanCandidate *item);

/*
 * Counts `bytes` more held for them (before they are allocated): ERROR
 * 54000 when what they hold then passes the limit.
 */
extern void knn_scan_candidates_hold(KnnScanCandidates *candidates, int64 bytes);

/* ERROR 54000 when a result of `bytes` would pass knn_gpu.max_result_memory (knn_scan_exec.c). */
extern void knn_scan_check_result_memory(double bytes);

/*
 * Waits for the shards' results, reading each row as it arrives (libpq
 * never holds a shard's whole answer); their rows become rows like the
 * inner plan's (of inner_desc, the columns read back filled, in memory of
 * cxt). Of each outer row's only those that can still be among its first
 * `want` rows (knn_scan_shards_start; WITH TIES, and those tied with the
 * last of them) are kept as they come, counted in candidates->held_bytes;
 * at the end they are in *rows (*n_rows of them) and their candidates
 * added to candidates, inner_row numbering those rows.
 */
extern void knn_scan_shards_collect(KnnScanShards *shards, TupleDesc inner_desc,
									MemoryContext cxt, MinimalTuple **rows, int64 *n_rows,
									KnnScanCandidates *candidates);

/* For EXPLAIN ANALYZE: the rows the node joined here. */
extern void knn_scan_shards_note_local(KnnScanShards *shards, int64 local_targets,
									   double seconds_local);

/*
 * Puts the candidates in the subquery's order per outer row: outer row
 * o's are begin[o] .. begin[o + 1] - 1 of the sorted items (begin in cxt).
 * slots read inner rows for the ORDER BY keys after the distance. The
 * sorted copy is counted with what the candidates hold before it is made.
 */
extern int64 *knn_scan_shards_merge(KnnScanShards *shards, KnnScanCandidates *candidates,
									int64 n_outer, MinimalTuple *inner_rows,
									TupleTableSlot *slot_a, TupleTableSlot *slot_b,
									MemoryContext cxt);

/* EXPLAIN: the shards, their remote SQL, and with ANALYZE their rows and times. */
extern void knn_scan_shards_explain(const KnnScanShards *shards, ExplainState *es);

/* At EndCustomScan. */
extern void knn_scan_shards_end(KnnScanShards *shards);

#endif							/* KNN_SCAN_SHARD_H */
