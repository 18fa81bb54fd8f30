/*
 * knn_scan_exec.c -- running the KNN Join node.
 *
 * On the first call the node reads all outer rows, then (if any) all rows
 * of the inner scan plan, keeps them as minimal tuples, hands every non-NULL
 * vector to the engine in one knn_run_problem call, and then emits, per
 * outer row in the outer plan's order, the k nearest inner rows in distance
 * order -- what the nested loop over "ORDER BY distance LIMIT k" returns:
 *
 *  - Ties (equal distances) come in the order the inner scan returned the
 *    rows: inner rows are the engine's targets in scan order, and the engine
 *    breaks ties by target row. (PostgreSQL leaves the order of ties
 *    unspecified, so any order is one its plan could give; ORDER BY keys
 *    after the distance are the inner scan's ORDER BY, so they order ties
 *    exactly as PostgreSQL's sort does.)
 *  - NaN distances (cosine with a zero vector) sort after all numbers and
 *    NULL distances after NaN, as ORDER BY float8 ASC does. An inner row
 *    with a NULL vector has a NULL distance: such rows fill up to k after
 *    the engine's rows, in scan order.
 *  - An outer row with a NULL vector has NULL distances to everything: it
 *    gets the first k inner rows in scan order, with NULL distance.
 *  - A query vector that is an expression of the outer row is computed
 *    here, once per outer row, and only for the outer rows PostgreSQL's
 *    plan computes it for: its subquery computes the distance for each
 *    inner row its WHERE keeps, so those that meet such a row (of their
 *    group, with another key; never under LIMIT 0 or for an empty inner
 *    relation). Its errors are the expression's own; the other outer rows
 *    have no rows to return anyway. (All before the first row is returned,
 *    like every outer row's reading: where a LIMIT above the join stops the
 *    nested loop early, PostgreSQL never computes a later row's.)
 *  - LIMIT NULL means all rows; a negative LIMIT or OFFSET is the same
 *    error as the Limit node's; LIMIT 0 reads no inner rows. OFFSET n skips
 *    the first n rows of each outer row (the engine is asked for n + k).
 *  - Self-exclusion ("t.id <> q.id" in the subquery): both sides' values
 *    map to keys equal exactly when the values are (knn_keys.h), and the
 *    engine never pairs equal keys. A NULL on either side makes "<>" NULL,
 *    so an outer row with a NULL key has no rows and an inner row with a
 *    NULL key belongs to none.
 *  - Conditions that may fail after the self-exclusion (the planner's
 *    deferred_clauses, knn_scan.h): the inner scan leaves them out and
 *    returns its rows unsorted; the node evaluates them for the rows
 *    PostgreSQL's plan evaluates them for, then sorts the rows that pass
 *    (read_inner_rows_after_exclusion).
 *  - Groups ("t.g = q.g [AND t.h = q.h ...]" in the subquery): both sides'
 *    values map to group ids equal exactly when every column is equal
 *    (knn_group_keys.h) and the engine joins each group apart. A NULL in a
 *    group column makes "=" NULL: such an outer row has no rows and such an
 *    inner row belongs to none; rows with a NULL vector or NULL distance
 *    come only from the outer row's group, as the nested loop's filter
 *    would let them through.
 *  - LEFT JOIN: an outer row none of whose rows passes the join filter
 *    comes once with NULLs for the subquery's columns; the filter (pushed-
 *    down clauses) is checked on both kinds of rows.
 *  - The inner side is read only when some outer row exists, and vector
 *    dimensions are checked only between non-NULL query and target vectors,
 *    (and not between an excluded pair), so the operator's "different
 *    vector dimensions" error happens when the nested loop would hit it.
 *
 *  - Radius ("WHERE <distance> < r", or <=, in the subquery; r evaluated
 *    once): the engine's range join (knn_run_range_problem) returns, per
 *    query, the pairs within r in distance order, capped at OFFSET + LIMIT
 *    when there is a LIMIT. A NULL distance or a NULL r makes the
 *    comparison NULL: such rows never come.
 *
 *  - A sharded inner relation (knn_scan_shard.h): the partitions that join
 *    on their servers are taken out of the inner plan when the node starts;
 *    each run ships the outer rows to the shards, joins the rest here with
 *    OFFSET 0 and LIMIT OFFSET + LIMIT, and merges both sides' candidates
 *    per outer row in the subquery's order: the rows are then taken from
 *    that list, as from the engine's.
 *
 * The rows then pass the node's quals (filters above the subquery's LIMIT
 * and join clauses: the join filter, and for LEFT JOIN the filter) and its
 * projection. A rescan starts over.
 */
#include "postgres.h"

#include <math.h>

#include "commands/explain.h"
#include "executor/executor.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "nodes/nodeFuncs.h"
#include "portability/instr_time.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/ruleutils.h"
#include "utils/tuplesort.h"

#include "knn_group_keys.h"
#include "knn_keys.h"
#include "knn_matrix.h"
#include "knn_operator_values.h"
#include "knn_progress.h"
#include "knn_run.h"
#include "knn_scan.h"
#include "knn_scan_shard.h"
#include "knn_settings.h"
#include "knn_stats.h"
#include "knn_vocabulary.h"

typedef struct KnnJoinState
{
	CustomScanState css;

	/* From the plan */
	KnnMetric	metric;
	KnnVectorKind kind;			/* of both vector columns (vector, halfvec, bit) */
	AttrNumber	query_column;	/* query vector in the outer rows, or 0: */
	ExprState  *query_expression;	/* computed from them (else NULL) */
	AttrNumber	target_column;	/* target vector in the inner rows */
	bool		target_is_left;
	int			n_scan_columns;
	int		   *column_source;	/* see KNN_PRIVATE_SOURCES */
	JoinType	jointype;		/* JOIN_INNER or JOIN_LEFT */
	ExprState  *limit_state;
	ExprState  *offset_state;	/* NULL when there is no OFFSET */
	ExprState  *join_filter;	/* NULL when there is none */
	ExprState  *other_filter;	/* NULL when there is none */
	AttrNumber	exclude_query_column;	/* self-exclusion key, 0 = none */
	AttrNumber	exclude_target_column;
	Oid			exclude_type;
	Oid			exclude_collation;
	ExprState  *after_exclusion;	/* conditions PostgreSQL evaluates after the
									 * self-exclusion (NULL: none), on inner
									 * rows as ecxt_innertuple */
	int			n_group_columns;	/* 0 = no groups */
	AttrNumber *group_query_columns;
	AttrNumber *group_target_columns;
	Oid		   *group_types;
	Oid		   *group_collations;
	KnnRange	radius_mode;	/* KNN_RANGE_NONE: the top-k join */
	ExprState  *radius_state;
	bool		with_ties;		/* FETCH FIRST ... WITH TIES */
	int			n_tie_columns;	/* ORDER BY keys after the distance */
	AttrNumber *tie_columns;	/* ... in the inner rows (WITH TIES only) */
	FmgrInfo   *tie_equality;
	Oid		   *tie_collations;
	TupleTableSlot *tie_slot;	/* reads back the row others tie with */
	PlanState  *outer_ps;
	PlanState  *inner_ps;
	TupleTableSlot *outer_slot; /* reads back a stored outer row */
	TupleTableSlot *inner_slot; /* reads back a stored inner row */
	MemoryContext join_cxt;		/* all of one execution; reset on rescan */

	/* One execution */
	bool		computed;
	int64		n_outer;
	MinimalTuple *outer_rows;
	int64		n_inner;
	MinimalTuple *inner_rows;
	int64		k;				/* rows per outer row, at most n_inner */
	int64		offset;			/* rows skipped first */
	int64	   *query_of_outer; /* outer row -> engine query, -1 = NULL vector */
	Datum	   *query_values;	/* query_expression's values, detoasted, */
	bool	   *query_nulls;	/* per outer row (true: NULL or not computed) */
	int64	   *outer_key;		/* self-exclusion keys, KNN_NULL_KEY for NULL */
	int64	   *inner_key;
	int64	   *outer_group;	/* group ids, KNN_GROUP_NULL for a NULL, -1 for */
	int64	   *inner_group;	/* an outer group no inner row has */
	int64		group_bound;	/* every group id is below it */
	int64	   *inner_of_target;	/* engine target -> inner row */
	int64	   *null_inner;		/* inner rows with a NULL vector, scan order */
	int64		n_null_inner;
	int32		engine_k;		/* neighbours per query from the engine */
	int64	   *neighbors;		/* n_queries x engine_k; radius: see range_begin */
	double	   *distances;
	int64		n_slots;		/* n_queries x engine_k (0 in the range layout) */
	/*
	 * Radius and WITH TIES: query q's rows are [range_begin[q],
	 * range_begin[q + 1]) of neighbors and distances
	 */
	int64	   *range_begin;
	int64	   *range_query;	/* while the engine runs: each pair's query */
	int64		range_count;	/* pairs received */
	int64		range_capacity; /* of neighbors, distances and range_query */
	double		radius;

	/* Where emission stands: the current outer row's sorted rows */
	int64		current_outer;
	bool		row_started;
	bool		in_tail;		/* past the engine's rows: NULL distances */
	int64		position;		/* in the engine's rows, or in the tail */
	int64		emitted;		/* rows after the OFFSET so far */
	bool		matched;		/* a row passed the join filter */
	int64		last_inner_row; /* WITH TIES: the k-th row, */
	double		last_distance;	/* its distance */
	bool		last_distance_null;
	bool		progress;		/* this node's progress row is open */

	/* A sharded inner relation (knn_scan_shard.h), or NULL */
	KnnScanShards *shards;
	KnnScanCandidates *candidates;	/* while a run with shards collects: theirs */
	int64	   *merged_begin;	/* a run with shards: outer row o's rows are */
	KnnScanCandidate *merged;	/* merged[merged_begin[o] .. merged_begin[o + 1]) */

	/* For EXPLAIN ANALYZE: every engine run of the statement (kept across rescans) */
	KnnJoinTotals totals;
	double		seconds_read;	/* this execution's, until its first engine run takes it */
} KnnJoinState;

/* An outer row whose key is NULL: "<>" is never true for it. */
#define KNN_NULL_KEY PG_INT64_MIN

typedef enum KnnRowKind
{
	KNN_ROW_NONE,				/* no more rows */
	KNN_ROW_JOINED,				/* an outer row with one of its neighbours */
	KNN_ROW_NULL_EXTENDED		/* JOIN_LEFT: an outer row without any */
} KnnRowKind;

static bool next_candidate(KnnJoinState *state, int64 *inner_row, double *distance,
						   bool *distance_null);
static void fill_scan_slot(KnnJoinState *state, TupleTableSlot *scan_slot, int64 outer_row,
						   int64 inner_row, double distance, bool distance_null);
static bool ties_with_last(KnnJoinState *state, int64 inner_row, double distance,
						   bool distance_null);
static void knn_join_begin(CustomScanState *node, EState *estate, int eflags);
static TupleTableSlot *knn_join_exec(CustomScanState *node);
static void knn_join_end(CustomScanState *node);
static void knn_join_rescan(CustomScanState *node);
static void knn_join_explain(CustomScanState *node, List *ancestors, ExplainState *es);

static const CustomExecMethods knn_join_exec_methods = {
	.CustomName = KNN_JOIN_NAME,
	.BeginCustomScan = knn_join_begin,
	.ExecCustomScan = knn_join_exec,
	.EndCustomScan = knn_join_end,
	.ReScanCustomScan = knn_join_rescan,
	.ExplainCustomScan = knn_join_explain,
};

Node *
knn_join_create_scan_state(CustomScan *cscan)
{
	KnnJoinState *state = palloc0(sizeof(KnnJoinState));

	NodeSetTag(state, T_CustomScanState);
	state->css.methods = &knn_join_exec_methods;
	return (Node *) state;
}

static int
private_int(CustomScan *cscan, KnnJoinPrivate item)
{
	return intVal(list_nth(cscan->custom_private, item));
}

/*
 * The inner plan to run here: without the partitions that join on their
 * servers, when the inner relation is sharded (knn_scan_shard.h).
 */
static Plan *
begin_shards(KnnJoinState *state, CustomScan *cscan, EState *estate)
{
	Plan	   *inner_plan = list_nth(cscan->custom_plans, KNN_INNER_CHILD);
	KnnScanShardSpec spec = {0};

	spec.distance_operator = (Oid) private_int(cscan, KNN_PRIVATE_OPERATOR);
	spec.target_is_left = state->target_is_left;
	spec.target_column = state->target_column;
	spec.outer_desc = ExecGetResultType(state->outer_ps);
	spec.query_column = state->query_column;
	spec.exclude_query_column = state->exclude_query_column;
	spec.exclude_target_column = state->exclude_target_column;
	spec.exclude_type = state->exclude_type;
	spec.exclude_collation = state->exclude_collation;
	spec.n_group_columns = state->n_group_columns;
	spec.group_query_columns = state->group_query_columns;
	spec.group_target_columns = state->group_target_columns;
	spec.group_types = state->group_types;
	spec.group_collations = state->group_collations;
	spec.radius_mode = state->radius_mode;
	spec.has_limit = list_nth(cscan->custom_exprs, KNN_EXPR_LIMIT) != NULL;
	spec.with_ties = state->with_ties;
	/* the inner columns the node reads from the rows it returns */
	for (int i = 0; i < state->n_scan_columns; i++)
		if (state->column_source[i] < 0)
			spec.read_back = bms_add_member(spec.read_back, -state->column_source[i]);
	for (int c = 0; c < state->n_tie_columns; c++)
		spec.read_back = bms_add_member(spec.read_back, state->tie_columns[c]);
	/* ... and the ORDER BY keys after the distance, which the merge compares */
	spec.n_order_keys = list_length(list_nth(cscan->custom_private, KNN_PRIVATE_ORDER_COLUMNS));
	if (spec.n_order_keys > 0)
	{
		AttrNumber *columns = palloc(spec.n_order_keys * sizeof(AttrNumber));
		Oid		   *operators = palloc(spec.n_order_keys * sizeof(Oid));
		Oid		   *collations = palloc(spec.n_order_keys * sizeof(Oid));
		bool	   *nulls_first = palloc(spec.n_order_keys * sizeof(bool));

		for (int i = 0; i < spec.n_order_keys; i++)
		{
			columns[i] = list_nth_int(list_nth(cscan->custom_private, KNN_PRIVATE_ORDER_COLUMNS), i);
			operators[i] = (Oid) list_nth_int(list_nth(cscan->custom_private, KNN_PRIVATE_ORDER_OPERATORS), i);
			collations[i] = (Oid) list_nth_int(list_nth(cscan->custom_private, KNN_PRIVATE_ORDER_COLLATIONS), i);
			nulls_first[i] = list_nth_int(list_nth(cscan->custom_private, KNN_PRIVATE_ORDER_NULLS_FIRST), i) != 0;
			spec.read_back = bms_add_member(spec.read_back, columns[i]);
		}
		spec.order_columns = columns;
		spec.order_operators = operators;
		spec.order_collations = collations;
		spec.order_nulls_first = nulls_first;
	}
	return knn_scan_shards_begin(inner_plan, estate->es_range_table, &spec, &state->shards);
}

static void
knn_join_begin(CustomScanState *node, EState *estate, int eflags)
{
	KnnJoinState *state = (KnnJoinState *) node;
	CustomScan *cscan = (CustomScan *) node->ss.ps.plan;
	List	   *sources = list_nth(cscan->custom_private, KNN_PRIVATE_SOURCES);
	ListCell   *lc;
	int			i = 0;

	state->metric = (KnnMetric) private_int(cscan, KNN_PRIVATE_METRIC);
	state->query_column = private_int(cscan, KNN_PRIVATE_QUERY_COLUMN);
	state->target_column = private_int(cscan, KNN_PRIVATE_TARGET_COLUMN);
	state->target_is_left = private_int(cscan, KNN_PRIVATE_TARGET_IS_LEFT) != 0;
	state->jointype = (JoinType) private_int(cscan, KNN_PRIVATE_JOIN_TYPE);
	state->exclude_query_column = private_int(cscan, KNN_PRIVATE_EXCLUDE_QUERY);
	state->exclude_target_column = private_int(cscan, KNN_PRIVATE_EXCLUDE_TARGET);
	state->exclude_type = (Oid) private_int(cscan, KNN_PRIVATE_EXCLUDE_TYPE);
	state->exclude_collation = (Oid) private_int(cscan, KNN_PRIVATE_EXCLUDE_COLLATION);
	state->radius_mode = (KnnRange) private_int(cscan, KNN_PRIVATE_RADIUS);
	state->with_ties = private_int(cscan, KNN_PRIVATE_WITH_TIES) != 0;
	state->n_tie_columns = list_length(list_nth(cscan->custom_private, KNN_PRIVATE_TIE_COLUMNS));
	if (state->n_tie_columns > 0)
	{
		List	   *columns = list_nth(cscan->custom_private, KNN_PRIVATE_TIE_COLUMNS);
		List	   *equality = list_nth(cscan->custom_private, KNN_PRIVATE_TIE_EQUALITY);
		List	   *collations = list_nth(cscan->custom_private, KNN_PRIVATE_TIE_COLLATIONS);

		state->tie_columns = palloc(sizeof(AttrNumber) * state->n_tie_columns);
		state->tie_equality = palloc(sizeof(FmgrInfo) * state->n_tie_columns);
		state->tie_collations = palloc(sizeof(Oid) * state->n_tie_columns);
		for (int c = 0; c < state->n_tie_columns; c++)
		{
			state->tie_columns[c] = list_nth_int(columns, c);
			fmgr_info(get_opcode((Oid) list_nth_int(equality, c)), &state->tie_equality[c]);
			state->tie_collations[c] = (Oid) list_nth_int(collations, c);
		}
	}
	state->n_group_columns = list_length(list_nth(cscan->custom_private, KNN_PRIVATE_GROUP_QUERY));
	if (state->n_group_columns > 0)
	{
		List	   *query_columns = list_nth(cscan->custom_private, KNN_PRIVATE_GROUP_QUERY);
		List	   *target_columns = list_nth(cscan->custom_private, KNN_PRIVATE_GROUP_TARGET);
		List	   *types = list_nth(cscan->custom_private, KNN_PRIVATE_GROUP_TYPES);
		List	   *collations = list_nth(cscan->custom_private, KNN_PRIVATE_GROUP_COLLATIONS);

		state->group_query_columns = palloc(sizeof(AttrNumber) * state->n_group_columns);
		state->group_target_columns = palloc(sizeof(AttrNumber) * state->n_group_columns);
		state->group_types = palloc(sizeof(Oid) * state->n_group_columns);
		state->group_collations = palloc(sizeof(Oid) * state->n_group_columns);
		for (int g = 0; g < state->n_group_columns; g++)
		{
			state->group_query_columns[g] = list_nth_int(query_columns, g);
			state->group_target_columns[g] = list_nth_int(target_columns, g);
			state->group_types[g] = (Oid) list_nth_int(types, g);
			state->group_collations[g] = (Oid) list_nth_int(collations, g);
		}
	}
	state->n_scan_columns = list_length(sources);
	state->column_source = palloc(sizeof(int) * Max(1, state->n_scan_columns));
	foreach(lc, sources)
		state->column_source[i++] = lfirst_int(lc);

	/* The children are read once, forwards. */
	eflags &= ~(EXEC_FLAG_BACKWARD | EXEC_FLAG_MARK);
	state->outer_ps = ExecInitNode(list_nth(cscan->custom_plans, KNN_OUTER_CHILD), estate, eflags);
	state->inner_ps = ExecInitNode(begin_shards(state, cscan, estate), estate, eflags);
	node->custom_ps = list_make2(state->outer_ps, state->inner_ps);

	state->limit_state = ExecInitExpr(list_nth(cscan->custom_exprs, KNN_EXPR_LIMIT), &node->ss.ps);
	state->offset_state = ExecInitExpr(list_nth(cscan->custom_exprs, KNN_EXPR_OFFSET), &node->ss.ps);
	state->radius_state = ExecInitExpr(list_nth(cscan->custom_exprs, KNN_EXPR_RADIUS), &node->ss.ps);
	state->join_filter = ExecInitQual(list_nth(cscan->custom_exprs, KNN_EXPR_JOIN_FILTER),
									  &node->ss.ps);
	state->query_expression = ExecInitExpr(list_nth(cscan->custom_exprs, KNN_EXPR_QUERY_VECTOR),
										   &node->ss.ps);
	state->other_filter = ExecInitQual(list_nth(cscan->custom_exprs, KNN_EXPR_FILTER),
									   &node->ss.ps);
	state->after_exclusion = ExecInitQual(list_nth(cscan->custom_private,
												   KNN_PRIVATE_AFTER_EXCLUSION),
										  &node->ss.ps);
	/* (the planner leaves them to a table without partitions, so without shards) */
	if (state->after_exclusion != NULL && state->shards != NULL)
		elog(ERROR, "KNN Join: conditions after the self-exclusion over a sharded relation");
	state->outer_slot = ExecInitExtraTupleSlot(estate, ExecGetResultType(state->outer_ps),
											   &TTSOpsMinimalTuple);
	state->inner_slot = ExecInitExtraTupleSlot(estate, ExecGetResultType(state->inner_ps),
											   &TTSOpsMinimalTuple);
	state->tie_slot = ExecInitExtraTupleSlot(estate, ExecGetResultType(state->inner_ps),
											 &TTSOpsMinimalTuple);
	/* The planner checked the column's type; it decides the element type. */
	state->kind = knn_vector_kind(TupleDescAttr(state->inner_slot->tts_tupleDescriptor,
												state->target_column - 1)->atttypid);
	if (state->kind != KNN_VECTOR_TYPE && state->kind != KNN_VECTOR_HALFVEC &&
		state->kind != KNN_VECTOR_BIT)
		elog(ERROR, "KNN Join: the target column is not of a joinable type");
	/* The planner checked both against the operator's input type. */
	if (state->query_expression != NULL &&
		exprType((Node *) list_nth(cscan->custom_exprs, KNN_EXPR_QUERY_VECTOR)) !=
		TupleDescAttr(state->inner_slot->tts_tupleDescriptor, state->target_column - 1)->atttypid)
		elog(ERROR, "KNN Join: the query vector is not of the target column's type");
	state->join_cxt = AllocSetContextCreate(CurrentMemoryContext, "KNN Join",
											ALLOCSET_DEFAULT_SIZES);
}

/*
 * Runs a k-nearest problem whose rows are those of queries and targets. With
 * pgvector's type the results are ranked by pgvector's own operator and
 * carry its values (knn_operator_values.h), as PostgreSQL's plan would; with
 * knn_gpu's type the engine's values are the operator's.
 */
/* The type of both vector columns. */
static Oid
target_type(KnnJoinState *state)
{
	return TupleDescAttr(state->inner_slot->tts_tupleDescriptor,
						 state->target_column - 1)->atttypid;
}

static void
run_knn(KnnJoinState *state, const KnnVectorReader *reader, KnnProblem *problem,
		const KnnMatrix *queries, const KnnMatrix *targets, int64 *neighbors,
		double *distances, KnnStats *stats)
{
	KnnOperatorValues by_operator;

	if (knn_operator_values_init(&by_operator, target_type(state), state->metric,
								 reader->element))
		knn_operator_values_run(&by_operator, problem, queries, targets, neighbors, distances,
								stats);
	else
		knn_run_problem(problem, neighbors, distances, stats);
}

/* Reads a child to the end, keeping its rows as minimal tuples. */
static MinimalTuple *
read_all_rows(PlanState *child, MemoryContext cxt, int64 *n_rows)
{
	MinimalTuple *rows = NULL;
	int64		capacity = 0;
	int64		n = 0;

	for (;;)
	{
		TupleTableSlot *slot = ExecProcNode(child);
		MemoryContext old;

		if (TupIsNull(slot))
			break;
		old = MemoryContextSwitchTo(cxt);
		if (n == capacity)
		{
			capacity = capacity == 0 ? 1024 : capacity * 2;
			rows = rows == NULL ?
				MemoryContextAllocHuge(cxt, capacity * sizeof(MinimalTuple)) :
				repalloc_huge(rows, capacity * sizeof(MinimalTuple));
		}
		rows[n++] = ExecCopySlotMinimalTuple(slot);
		MemoryContextSwitchTo(old);
		knn_progress_rows(1);
	}
	*n_rows = n;
	return rows;
}

/* Does an inner row pass the conditions evaluated after the self-exclusion? */
static bool
passes_after_exclusion(KnnJoinState *state, TupleTableSlot *inner_row)
{
	ExprContext *econtext = state->css.ss.ps.ps_ExprContext;
	bool		passes;

	CHECK_FOR_INTERRUPTS();
	ResetExprContext(econtext);
	econtext->ecxt_innertuple = inner_row;
	passes = ExecQual(state->after_exclusion, econtext);
	econtext->ecxt_innertuple = NULL;
	return passes;
}

/*
 * Rows of the inner scan in the tie order (the ORDER BY keys after the
 * distance, KNN_PRIVATE_ORDER_*), as the inner scan's sort would return
 * them: for an inner scan that leaves the sort to the node
 * (read_inner_rows_after_exclusion). The rows are replaced by copies.
 */
static void
sort_inner_rows(KnnJoinState *state, MinimalTuple *rows, int64 n)
{
	CustomScan *cscan = (CustomScan *) state->css.ss.ps.plan;
	List	   *columns = list_nth(cscan->custom_private, KNN_PRIVATE_ORDER_COLUMNS);
	int			n_keys = list_length(columns);
	AttrNumber *key_columns;
	Oid		   *operators;
	Oid		   *collations;
	bool	   *nulls_first;
	Tuplesortstate *sort;
	MemoryContext old;

	if (n_keys == 0 || n < 2)
		return;
	/* (in join_cxt, which a rescan resets: the caller's lives as long as the query) */
	old = MemoryContextSwitchTo(state->join_cxt);
	key_columns = palloc(sizeof(AttrNumber) * n_keys);
	operators = palloc(sizeof(Oid) * n_keys);
	collations = palloc(sizeof(Oid) * n_keys);
	nulls_first = palloc(sizeof(bool) * n_keys);
	for (int i = 0; i < n_keys; i++)
	{
		key_columns[i] = list_nth_int(columns, i);
		operators[i] = (Oid) list_nth_int(list_nth(cscan->custom_private, KNN_PRIVATE_ORDER_OPERATORS), i);
		collations[i] = (Oid) list_nth_int(list_nth(cscan->custom_private, KNN_PRIVATE_ORDER_COLLATIONS), i);
		nulls_first[i] = list_nth_int(list_nth(cscan->custom_private, KNN_PRIVATE_ORDER_NULLS_FIRST), i) != 0;
	}
	sort = tuplesort_begin_heap(state->inner_slot->tts_tupleDescriptor, n_keys, key_columns,
								operators, collations, nulls_first, work_mem, NULL,
								TUPLESORT_NONE);
	for (int64 i = 0; i < n; i++)
	{
		ExecStoreMinimalTuple(rows[i], state->inner_slot, false);
		tuplesort_puttupleslot(sort, state->inner_slot);
		pfree(rows[i]);
	}
	tuplesort_performsort(sort);
	for (int64 i = 0; i < n; i++)
	{
		if (!tuplesort_gettupleslot(sort, true, false, state->inner_slot, NULL))
			elog(ERROR, "KNN Join: the inner rows' sort lost a row");
		rows[i] = ExecCopySlotMinimalTuple(state->inner_slot);
	}
	ExecClearTuple(state->inner_slot);
	tuplesort_end(sort);
	MemoryContextSwitchTo(old);
}

/* The self-exclusion key of the first outer row in keys (added), or -1 for NULL. */
static int64
first_outer_key(KnnJoinState *state, KnnKeys *keys)
{
	bool		isnull;
	Datum		value;

	ExecStoreMinimalTuple(state->outer_rows[0], state->outer_slot, false);
	value = slot_getattr(state->outer_slot, state->exclude_query_column, &isnull);
	return isnull ? -1 : knn_keys_add(keys, value);
}

/*
 * The inner rows when conditions come after the self-exclusion
 * (state->after_exclusion): those that pass them, evaluated for exactly
 * the rows PostgreSQL's plan evaluates them for, in its order, so that it
 * is the same row's error that is raised, if any. Its nested loop runs the
 * subquery's scan per outer row, in the outer rows' order; the scan
 * evaluates for each row, in scan order, the inner scan's conditions
 * (here the child's), then "t.key <> q.key", then these. So:
 *
 *  - for the first outer row, while the child is read: on each row whose
 *    key is not NULL and differs from that row's (not NULL) key, at once,
 *    before the child evaluates its conditions on the next row;
 *  - for each later outer row with a non-NULL key: on the rows not yet
 *    evaluated whose key differs from it, in scan order. The rows left
 *    after one such pass all have its key, so only an outer row of
 *    another key evaluates more, and two passes at most reach them all.
 *
 * A row never evaluated (a NULL key, or the key of every outer row that
 * has one) pairs with no outer row: it is left out, as those that fail.
 * (None of this runs under LIMIT 0 or without outer rows: compute_join.)
 * The inner scan returns the rows in the order it reads them, the order
 * PostgreSQL's scan evaluates them in; they are put in the tie order
 * after (sort_inner_rows).
 */
static MinimalTuple *
read_inner_rows_after_exclusion(KnnJoinState *state, int64 *n_rows)
{
	MemoryContext keys_cxt = AllocSetContextCreate(state->join_cxt, "KNN Join keys",
												   ALLOCSET_DEFAULT_SIZES);
	MemoryContext old = MemoryContextSwitchTo(keys_cxt);
	KnnKeys    *keys = knn_keys_create(state->exclude_type, state->exclude_collation);
	int64		first_key = first_outer_key(state, keys);
	MinimalTuple *rows = NULL;
	int64	   *waiting_key = NULL; /* per kept row: its key until evaluated, or -1 */
	int64		capacity = 0;
	int64		n = 0;
	int64		n_waiting = 0;
	int64		last_key = first_key;
	int64		kept = 0;

	MemoryContextSwitchTo(old);
	for (;;)
	{
		TupleTableSlot *slot = ExecProcNode(state->inner_ps);
		bool		isnull;
		Datum		value;
		int64		key;

		if (TupIsNull(slot))
			break;
		knn_progress_rows(1);
		value = slot_getattr(slot, state->exclude_target_column, &isnull);
		if (isnull)
			continue;
		old = MemoryContextSwitchTo(keys_cxt);
		key = knn_keys_add(keys, value);
		MemoryContextSwitchTo(old);
		if (first_key >= 0 && key != first_key && !passes_after_exclusion(state, slot))
			continue;
		old = MemoryContextSwitchTo(state->join_cxt);
		if (n == capacity)
		{
			capacity = capacity == 0 ? 1024 : capacity * 2;
			rows = rows == NULL ?
				MemoryContextAllocHuge(state->join_cxt, capacity * sizeof(MinimalTuple)) :
				repalloc_huge(rows, capacity * sizeof(MinimalTuple));
			waiting_key = waiting_key == NULL ?
				MemoryContextAllocHuge(state->join_cxt, capacity * sizeof(int64)) :
				repalloc_huge(waiting_key, capacity * sizeof(int64));
		}
		rows[n] = ExecCopySlotMinimalTuple(slot);
		MemoryContextSwitchTo(old);
		waiting_key[n] = first_key >= 0 && key != first_key ? -1 : key;
		n_waiting += waiting_key[n] >= 0 ? 1 : 0;
		n++;
	}

	/* the later outer rows */
	for (int64 o = 1; o < state->n_outer && n_waiting > 0; o++)
	{
		bool		isnull;
		Datum		value;
		int64		key;

		CHECK_FOR_INTERRUPTS();
		ExecStoreMinimalTuple(state->outer_rows[o], state->outer_slot, false);
		value = slot_getattr(state->outer_slot, state->exclude_query_column, &isnull);
		if (isnull)
			continue;
		key = knn_keys_find(keys, value);	/* -1: differs from every row's */
		if (key >= 0 && key == last_key)
			continue;
		for (int64 i = 0; i < n; i++)
		{
			if (waiting_key[i] < 0 || waiting_key[i] == key)
				continue;
			ExecStoreMinimalTuple(rows[i], state->inner_slot, false);
			if (!passes_after_exclusion(state, state->inner_slot))
			{
				pfree(rows[i]);
				rows[i] = NULL;
			}
			waiting_key[i] = -1;
			n_waiting--;
		}
		last_key = key;
	}

	/* the rows that passed, in scan order */
	for (int64 i = 0; i < n; i++)
	{
		if (rows[i] != NULL && waiting_key[i] >= 0)
			pfree(rows[i]);
		else if (rows[i] != NULL)
			rows[kept++] = rows[i];
	}
	if (waiting_key != NULL)
		pfree(waiting_key);
	MemoryContextDelete(keys_cxt);
	sort_inner_rows(state, rows, kept);
	*n_rows = kept;
	return rows;
}

/*
 * LIMIT or OFFSET as the Limit node reads them: NULL is no limit (-1) and
 * no offset (0); negative is the Limit node's error.
 */
static int64
evaluate_count(KnnJoinState *state, ExprState *expr, bool is_offset)
{
	ExprContext *econtext = state->css.ss.ps.ps_ExprContext;
	bool		isnull;
	Datum		value;
	int64		count;

	if (expr == NULL)
		return is_offset ? 0 : -1;
	value = ExecEvalExprSwitchContext(expr, econtext, &isnull);
	if (isnull)
		return is_offset ? 0 : -1;
	count = DatumGetInt64(value);
	if (count < 0 && is_offset)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_ROW_COUNT_IN_RESULT_OFFSET_CLAUSE),
				 errmsg("OFFSET must not be negative")));
	if (count < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_ROW_COUNT_IN_LIMIT_CLAUSE),
				 errmsg("LIMIT must not be negative")));
	return count;
}

static void
dimension_error(KnnJoinState *state, int target_dim, int query_dim)
{
	/* The operator's own message, operands in the user's order. */
	if (state->kind == KNN_VECTOR_BIT)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("different bit lengths %d and %d",
						state->target_is_left ? target_dim : query_dim,
						state->target_is_left ? query_dim : target_dim)));
	if (state->kind == KNN_VECTOR_HALFVEC)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("different halfvec dimensions %d and %d",
						state->target_is_left ? target_dim : query_dim,
						state->target_is_left ? query_dim : target_dim)));
	ereport(ERROR,
			(errcode(ERRCODE_DATA_EXCEPTION),
			 errmsg("different vector dimensions %d and %d",
					state->target_is_left ? target_dim : query_dim,
					state->target_is_left ? query_dim : target_dim)));
}

/*
 * A vector value checked and viewed. A value that must be detoasted is,
 * into the per-row context, which the caller has reset for this row.
 */
static void
view_vector(KnnJoinState *state, Datum value, const KnnVectorReader *reader,
			const char *set_name, int64 id, KnnVectorView *view)
{
	MemoryContext old = MemoryContextSwitchTo(state->css.ss.ps.ps_ExprContext->ecxt_per_tuple_memory);
	struct varlena *detoasted = PG_DETOAST_DATUM(value);
	KnnValueProblem problem;

	MemoryContextSwitchTo(old);
	problem = reader->view(detoasted, view);
	if (problem != KNN_VALUE_OK)
		knn_vector_problem_error(problem, set_name, id);
}

/*
 * The vector of a stored row, checked and viewed (false for NULL), valid
 * until the next row's.
 */
static bool
row_vector(KnnJoinState *state, TupleTableSlot *slot, MinimalTuple row, AttrNumber column,
		   const KnnVectorReader *reader, const char *set_name, int64 id,
		   KnnVectorView *view)
{
	bool		isnull;
	Datum		value;

	CHECK_FOR_INTERRUPTS();
	MemoryContextReset(state->css.ss.ps.ps_ExprContext->ecxt_per_tuple_memory);
	ExecStoreMinimalTuple(row, slot, false);
	value = slot_getattr(slot, column, &isnull);
	if (isnull)
		return false;
	view_vector(state, value, reader, set_name, id, view);
	return true;
}

/*
 * The query vector of an outer row, checked and viewed as row_vector's
 * (false for NULL, or an expression not computed for the row).
 */
static bool
query_vector(KnnJoinState *state, int64 outer_row, const KnnVectorReader *reader,
			 KnnVectorView *view)
{
	if (state->query_expression == NULL)
		return row_vector(state, state->outer_slot, state->outer_rows[outer_row],
						  state->query_column, reader, "query", outer_row, view);
	CHECK_FOR_INTERRUPTS();
	MemoryContextReset(state->css.ss.ps.ps_ExprContext->ecxt_per_tuple_memory);
	if (state->query_nulls[outer_row])
		return false;
	view_vector(state, state->query_values[outer_row], reader, "query", outer_row, view);
	return true;
}

/*
 * Self-exclusion keys of every stored row (KNN_NULL_KEY for NULL): inner
 * values get keys by equality, outer values the key of an equal inner value
 * or -1, which no inner row has.
 */
static void
build_keys(KnnJoinState *state)
{
	MemoryContext old = MemoryContextSwitchTo(state->join_cxt);
	KnnKeys    *keys = knn_keys_create(state->exclude_type, state->exclude_collation);
	bool		isnull;
	Datum		value;

	state->inner_key = palloc_extended(sizeof(int64) * Max(1, state->n_inner), MCXT_ALLOC_HUGE);
	state->outer_key = palloc_extended(sizeof(int64) * Max(1, state->n_outer), MCXT_ALLOC_HUGE);
	for (int64 i = 0; i < state->n_inner; i++)
	{
		CHECK_FOR_INTERRUPTS();
		ExecStoreMinimalTuple(state->inner_rows[i], state->inner_slot, false);
		value = slot_getattr(state->inner_slot, state->exclude_target_column, &isnull);
		state->inner_key[i] = isnull ? KNN_NULL_KEY : knn_keys_add(keys, value);
	}
	for (int64 i = 0; i < state->n_outer; i++)
	{
		CHECK_FOR_INTERRUPTS();
		ExecStoreMinimalTuple(state->outer_rows[i], state->outer_slot, false);
		value = slot_getattr(state->outer_slot, state->exclude_query_column, &isnull);
		state->outer_key[i] = isnull ? KNN_NULL_KEY : knn_keys_find(keys, value);
	}
	MemoryContextSwitchTo(old);
}

/* The group columns of a stored row. */
static void
row_group_values(TupleTableSlot *slot, MinimalTuple row, int n, const AttrNumber *columns,
				 Datum *values, bool *isnull)
{
	ExecStoreMinimalTuple(row, slot, false);
	for (int g = 0; g < n; g++)
		values[g] = slot_getattr(slot, columns[g], &isnull[g]);
}

/*
 * Group ids of every stored row: inner rows' values get ids by equality,
 * outer rows' the id of equal inner values, or -1 (no inner row has them).
 */
static void
build_groups(KnnJoinState *state)
{
	MemoryContext old = MemoryContextSwitchTo(state->join_cxt);
	KnnGroupKeys *groups = knn_group_keys_create(state->n_group_columns, state->group_types,
												 state->group_collations);
	Datum	   *values = palloc(sizeof(Datum) * state->n_group_columns);
	bool	   *isnull = palloc(sizeof(bool) * state->n_group_columns);

	state->inner_group = palloc_extended(sizeof(int64) * Max(1, state->n_inner), MCXT_ALLOC_HUGE);
	state->outer_group = palloc_extended(sizeof(int64) * Max(1, state->n_outer), MCXT_ALLOC_HUGE);
	for (int64 i = 0; i < state->n_inner; i++)
	{
		CHECK_FOR_INTERRUPTS();
		row_group_values(state->inner_slot, state->inner_rows[i], state->n_group_columns,
						 state->group_target_columns, values, isnull);
		state->inner_group[i] = knn_group_keys_add(groups, values, isnull);
	}
	for (int64 i = 0; i < state->n_outer; i++)
	{
		CHECK_FOR_INTERRUPTS();
		row_group_values(state->outer_slot, state->outer_rows[i], state->n_group_columns,
						 state->group_query_columns, values, isnull);
		state->outer_group[i] = knn_group_keys_find(groups, values, isnull);
	}
	state->group_bound = knn_group_keys_bound(groups);
	MemoryContextSwitchTo(old);
}

/* Does an outer row have no rows at all, its group being NULL or unmatched? */
static bool
outer_without_group(KnnJoinState *state, int64 outer_row)
{
	return state->outer_group != NULL && state->outer_group[outer_row] < 0;
}

/*
 * Which keys a set of rows has, as far as the dimension checks need to
 * know: all the same one (first), or not.
 */
typedef struct KnnKeySet
{
	int64		n;
	int64		first;
	bool		differ;
} KnnKeySet;

static void
key_set_add(KnnKeySet *set, int64 key)
{
	if (set->n++ == 0)
		set->first = key;
	else if (key != set->first)
		set->differ = true;
}

/* Does every row of set have exactly this key (then none pairs with it)? */
static bool
key_set_all(const KnnKeySet *set, bool exclude, int64 key)
{
	return exclude && !set->differ && (set->n == 0 || set->first == key);
}

/*
 * Does PostgreSQL's plan compute the query vector for this outer row: does
 * its subquery's WHERE keep an inner row for it (met: per group, or [0]
 * without groups, the keys of the inner rows that have one)?
 */
static bool
meets_inner_row(KnnJoinState *state, const KnnKeySet *met, int64 outer_row)
{
	int64		group = state->outer_group != NULL ? state->outer_group[outer_row] : 0;
	int64		key = state->outer_key != NULL ? state->outer_key[outer_row] : 0;

	if (key == KNN_NULL_KEY || group < 0)
		return false;
	return met[group].n > 0 && !key_set_all(&met[group], state->outer_key != NULL, key);
}

/*
 * A query vector that is an expression: computed from each outer row that
 * meets an inner row (meets_inner_row), in the outer rows' order, each in
 * the per-row context, and kept detoasted in join_cxt (query_vector reads
 * and checks it). The other outer rows' stay NULL: PostgreSQL never
 * computes theirs, and they have no rows.
 */
static void
compute_query_vectors(KnnJoinState *state)
{
	ExprContext *econtext = state->css.ss.ps.ps_ExprContext;
	TupleTableSlot *scan_slot = state->css.ss.ss_ScanTupleSlot;
	int64		n_groups = state->inner_group != NULL ? state->group_bound : 1;
	MemoryContext old = MemoryContextSwitchTo(state->join_cxt);
	KnnKeySet  *met = palloc_extended(sizeof(KnnKeySet) * Max(1, n_groups),
									  MCXT_ALLOC_HUGE | MCXT_ALLOC_ZERO);

	state->query_values = palloc_extended(sizeof(Datum) * Max(1, state->n_outer), MCXT_ALLOC_HUGE);
	state->query_nulls = palloc_extended(sizeof(bool) * Max(1, state->n_outer), MCXT_ALLOC_HUGE);
	MemoryContextSwitchTo(old);
	for (int64 i = 0; i < state->n_inner; i++)
	{
		int64		group = state->inner_group != NULL ? state->inner_group[i] : 0;
		int64		key = state->inner_key != NULL ? state->inner_key[i] : 0;

		if (key != KNN_NULL_KEY && group >= 0)
			key_set_add(&met[group], key);
	}
	for (int64 i = 0; i < state->n_outer; i++)
	{
		bool		isnull = true;
		Datum		value = (Datum) 0;

		CHECK_FOR_INTERRUPTS();
		if (meets_inner_row(state, met, i))
		{
			ResetExprContext(econtext);
			fill_scan_slot(state, scan_slot, i, -1, 0, true);
			econtext->ecxt_scantuple = scan_slot;
			value = ExecEvalExprSwitchContext(state->query_expression, econtext, &isnull);
			if (!isnull)
			{
				old = MemoryContextSwitchTo(state->join_cxt);
				value = PointerGetDatum(PG_DETOAST_DATUM_COPY(value));
				MemoryContextSwitchTo(old);
			}
		}
		state->query_values[i] = value;
		state->query_nulls[i] = isnull;
	}
	ResetExprContext(econtext);
	ExecClearTuple(scan_slot);
	pfree(met);
}

/*
 * The queries: every outer row's vector, read once (not for an outer row
 * whose key is NULL: it has no rows). A query whose dimension differs from
 * the first one's is kept out and remembered in *odd_dim and *odd_keys:
 * the nested loop fails on it only once it meets a target it is not
 * excluded from.
 */
static void
read_queries(KnnJoinState *state, const KnnVectorReader *reader, KnnMatrix *queries,
			 int64 *query_keys, KnnKeySet *query_key_set, int *odd_dim, KnnKeySet *odd_keys)
{
	*odd_dim = -1;
	for (int64 i = 0; i < state->n_outer; i++)
	{
		KnnVectorView view;
		int64		key = state->outer_key != NULL ? state->outer_key[i] : 0;

		state->query_of_outer[i] = -1;
		if (key == KNN_NULL_KEY || !query_vector(state, i, reader, &view))
			continue;
		if (queries->dim < 0 || view.dim == queries->dim)
		{
			state->query_of_outer[i] = queries->n;
			query_keys[queries->n] = key;
			key_set_add(query_key_set, key);
			knn_matrix_append_view(queries, i, &view, reader);
		}
		else
		{
			if (*odd_dim < 0)
				*odd_dim = view.dim;
			key_set_add(odd_keys, key);
		}
	}
}

/*
 * The targets: every inner row's vector, read once; a non-NULL one against
 * the queries' dimension, as the nested loop compares them (unless every
 * query is excluded from it, and no query of another dimension could meet
 * it). NULL vectors are listed in scan order. Without queries (query_dim <
 * 0) no distance is ever computed, so only the NULLs are listed. An inner
 * row with a NULL key belongs to no outer row.
 */
static void
read_targets(KnnJoinState *state, const KnnVectorReader *reader, int query_dim,
			 const KnnKeySet *query_key_set, bool odd_queries, KnnMatrix *targets,
			 int64 *target_keys, KnnKeySet *target_key_set)
{
	bool		exclude = state->inner_key != NULL;

	state->n_null_inner = 0;
	for (int64 i = 0; i < state->n_inner; i++)
	{
		KnnVectorView view;
		int64		key = exclude ? state->inner_key[i] : 0;

		if (key == KNN_NULL_KEY)
			continue;
		if (!row_vector(state, state->inner_slot, state->inner_rows[i], state->target_column,
						reader, "target", i, &view))
			state->null_inner[state->n_null_inner++] = i;
		else if (query_dim >= 0)
		{
			if (view.dim != query_dim)
			{
				if (odd_queries || !key_set_all(query_key_set, exclude, key))
					dimension_error(state, view.dim, query_dim);
				continue;
			}
			state->inner_of_target[targets->n] = i;
			target_keys[targets->n] = key;
			key_set_add(target_key_set, key);
			knn_matrix_append_view(targets, i, &view, reader);
		}
	}
}

/* One engine run of a radius join: where its query and target rows go. */
typedef struct KnnRangeRun
{
	KnnJoinState *state;
	const int64 *query_map;		/* run's query row -> the join's, NULL = same */
	int64		target_base;	/* run's target row + this = the join's */
} KnnRangeRun;

/*
 * The node holds its whole result until the scan ends: one past
 * knn_gpu.max_result_memory (the LIMIT, or a radius, is the query's, and
 * rows x LIMIT x 16 bytes can be more than the server has) is an ERROR
 * before it is allocated, not an out-of-memory kill.
 */
void
knn_scan_check_result_memory(double bytes)
{
	int64		limit = knn_result_memory_bytes();

	if (bytes <= (double) limit)
		return;
	ereport(ERROR,
			(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
			 errmsg("KNN Join's result needs %.0f MB, more than knn_gpu.max_result_memory (" INT64_FORMAT " MB)",
					ceil(bytes / (1024 * 1024)), limit / (1024 * 1024)),
			 errhint("knn_join() returns larger joins in batches; or SET knn_gpu.enable_knn_join = off.")));
}

/*
 * What a run with shards holds besides the engine's arrays (the shards'
 * rows, when the local part runs after them): counted with those arrays.
 */
static int64
held_beside_engine(KnnJoinState *state)
{
	return state->candidates != NULL ? state->candidates->held_bytes : 0;
}

/* knn_scan_check_result_memory of the engine's result arrays of `bytes`. */
static void
check_engine_memory(KnnJoinState *state, double bytes)
{
	knn_scan_check_result_memory(bytes + (double) held_beside_engine(state));
}

/*
 * WITH TIES: the engine's first run fills LIMIT + 1 slots per query
 * (knn_scan_run_with_ties) before any pair is kept: checked before it
 * runs, as the plain LIMIT's arrays are.
 */
static void
check_ties_memory(KnnJoinState *state, int64 n_queries, int64 wanted, int64 n_targets)
{
	check_engine_memory(state, (double) n_queries * Min(wanted + 1, n_targets) * KNN_SLOT_BYTES);
}

/* KnnPairSink of a radius join: appends the pairs, with the join's rows. */
static void
keep_pairs(void *arg, const int64 *query_rows, const int64 *target_rows,
		   const double *distances, int64 n)
{
	KnnRangeRun *run = (KnnRangeRun *) arg;
	KnnJoinState *state = run->state;
	int64		c = state->range_count;

	if (c + n > state->range_capacity)
	{
		int64		capacity = Max(state->range_capacity * 2, c + n);
		int64		room = knn_result_memory_bytes() - held_beside_engine(state);

		check_engine_memory(state, (double) (c + n) * KNN_RANGE_PAIR_BYTES);
		capacity = Max(c + n, Min(capacity, room / (int64) KNN_RANGE_PAIR_BYTES));

		state->neighbors = repalloc_huge(state->neighbors, sizeof(int64) * capacity);
		state->distances = repalloc_huge(state->distances, sizeof(double) * capacity);
		state->range_query = repalloc_huge(state->range_query, sizeof(int64) * capacity);
		state->range_capacity = capacity;
	}
	for (int64 i = 0; i < n; i++)
	{
		state->range_query[c + i] = run->query_map != NULL ? run->query_map[query_rows[i]]
			: query_rows[i];
		state->neighbors[c + i] = run->target_base + target_rows[i];
		state->distances[c + i] = distances[i];
	}
	state->range_count = c + n;
}

/* Before the runs of a radius join: no pair yet. */
static void
start_ranges(KnnJoinState *state)
{
	state->range_capacity = 1024;
	state->range_count = 0;
	state->neighbors = MemoryContextAllocHuge(state->join_cxt, sizeof(int64) * state->range_capacity);
	state->distances = MemoryContextAllocHuge(state->join_cxt, sizeof(double) * state->range_capacity);
	state->range_query = MemoryContextAllocHuge(state->join_cxt, sizeof(int64) * state->range_capacity);
}

/*
 * A radius join of the problem's queries and targets (problem->k: the cap
 * per query; none for WITH TIES, whose ties the executor finds): its pairs
 * appended in the engine's order (per query by distance, then target row).
 */
static void
run_range(KnnJoinState *state, const KnnVectorReader *reader, KnnProblem *problem,
		  const KnnMatrix *queries, const KnnMatrix *targets, KnnStats *stats,
		  const int64 *query_map, int64 target_base)
{
	KnnRangeRun run = {state, query_map, target_base};
	KnnOperatorValues by_operator;

	problem->range = state->radius_mode;
	problem->max_distance = state->radius;
	if (state->with_ties)
		problem->k = 0;
	/* pgvector's type: the radius applies to its operator's values */
	if (knn_operator_values_init(&by_operator, target_type(state), state->metric,
								 reader->element))
		knn_operator_values_range(&by_operator, problem, queries, targets, keep_pairs, &run,
								  stats);
	else
		knn_run_range_problem(problem, keep_pairs, &run, stats);
}

/* run_knn for knn_scan_run_with_ties, on one run's targets. */
typedef struct KnnTiesRun
{
	KnnJoinState *state;
	const KnnVectorReader *reader;
	const KnnMatrix *targets;
} KnnTiesRun;

static void
run_knn_for_ties(void *arg, KnnProblem *problem, const KnnMatrix *queries, int64 *neighbors,
				 double *distances, KnnStats *stats)
{
	KnnTiesRun *run = (KnnTiesRun *) arg;

	run_knn(run->state, run->reader, problem, queries, run->targets, neighbors, distances,
			stats);
}

/*
 * FETCH FIRST ... WITH TIES: the first `wanted` rows of each query and
 * those tied in distance with the wanted-th, appended as a radius join's
 * pairs are (finish_ranges puts them per query).
 */
static void
run_ties(KnnJoinState *state, const KnnVectorReader *reader, KnnProblem *problem,
		 const KnnMatrix *queries, const KnnMatrix *targets, int64 wanted, KnnStats *stats,
		 const int64 *query_map, int64 target_base)
{
	KnnTiesRun	knn = {state, reader, targets};
	KnnRangeRun sink = {state, query_map, target_base};

	knn_scan_run_with_ties(problem, queries, wanted, run_knn_for_ties, &knn, keep_pairs, &sink,
						   stats);
}

/*
 * After the runs: query q's pairs are [range_begin[q], range_begin[q + 1])
 * (a stable counting sort by query: each query's pairs come from one run,
 * in order).
 */
static void
finish_ranges(KnnJoinState *state, int64 n_queries)
{
	int64		n = state->range_count;
	int64	   *begin = MemoryContextAllocHuge(state->join_cxt, sizeof(int64) * (n_queries + 1));
	bool		in_order = true;

	memset(begin, 0, sizeof(int64) * (n_queries + 1));
	for (int64 c = 0; c < n; c++)
	{
		begin[state->range_query[c] + 1]++;
		if (c > 0 && state->range_query[c] < state->range_query[c - 1])
			in_order = false;
	}
	for (int64 q = 0; q < n_queries; q++)
		begin[q + 1] += begin[q];
	if (!in_order)
	{
		int64	   *fill = MemoryContextAllocHuge(state->join_cxt, sizeof(int64) * Max(1, n_queries));
		int64	   *neighbors = MemoryContextAllocHuge(state->join_cxt, sizeof(int64) * Max(1, n));
		double	   *distances = MemoryContextAllocHuge(state->join_cxt, sizeof(double) * Max(1, n));

		memcpy(fill, begin, sizeof(int64) * n_queries);
		for (int64 c = 0; c < n; c++)
		{
			int64		slot = fill[state->range_query[c]]++;

			neighbors[slot] = state->neighbors[c];
			distances[slot] = state->distances[c];
			if ((c & 65535) == 0)
				CHECK_FOR_INTERRUPTS();
		}
		pfree(fill);
		pfree(state->neighbors);
		pfree(state->distances);
		state->neighbors = neighbors;
		state->distances = distances;
	}
	pfree(state->range_query);
	state->range_query = NULL;
	state->range_begin = begin;
}

/*
 * One engine run's statistics, added to the node's totals (EXPLAIN ANALYZE
 * sums every run of the statement). The execution's read time goes with
 * its first run only: a grouped join runs the engine once per dimension
 * after one read.
 */
static void
record_run(KnnJoinState *state, KnnProblem *problem, KnnStats *stats)
{
	KnnJoinRecord record;

	knn_stats_record(&record, problem, stats, state->seconds_read, 0.0, 0.0);
	knn_stats_totals_add(&state->totals, &record);
	state->seconds_read = 0.0;
	knn_progress_work(stats->distance_computations);
}

/*
 * Builds the engine's matrices from the stored rows (queries from outer
 * rows, targets from inner rows, NULL vectors left out) and runs it.
 */
static void
run_engine(KnnJoinState *state, int64 wanted)
{
	const KnnVectorReader *reader = knn_vector_reader(state->kind);
	KnnMatrix	queries;
	KnnMatrix	targets;
	KnnProblem	problem;
	KnnStats	stats;
	MemoryContext old;
	int			odd_query_dim;
	KnnKeySet	query_key_set = {0};
	KnnKeySet	odd_key_set = {0};
	KnnKeySet	target_key_set = {0};
	int64	   *query_keys;
	int64	   *target_keys;

	if (state->exclude_query_column > 0)
		build_keys(state);
	if (state->query_expression != NULL)
		compute_query_vectors(state);
	old = MemoryContextSwitchTo(state->join_cxt);
	state->query_of_outer = palloc_extended(sizeof(int64) * Max(1, state->n_outer), MCXT_ALLOC_HUGE);
	state->inner_of_target = palloc_extended(sizeof(int64) * Max(1, state->n_inner), MCXT_ALLOC_HUGE);
	state->null_inner = palloc_extended(sizeof(int64) * Max(1, state->n_inner), MCXT_ALLOC_HUGE);
	query_keys = palloc_extended(sizeof(int64) * Max(1, state->n_outer), MCXT_ALLOC_HUGE);
	target_keys = palloc_extended(sizeof(int64) * Max(1, state->n_inner), MCXT_ALLOC_HUGE);
	knn_matrix_init(&queries, "query", reader->element);
	knn_matrix_init(&targets, "target", reader->element);
	MemoryContextSwitchTo(old);

	read_queries(state, reader, &queries, query_keys, &query_key_set, &odd_query_dim, &odd_key_set);
	read_targets(state, reader, queries.dim, &query_key_set, odd_query_dim >= 0,
				 &targets, target_keys, &target_key_set);
	MemoryContextReset(state->css.ss.ps.ps_ExprContext->ecxt_per_tuple_memory);
	if (odd_query_dim >= 0 && targets.n > 0 &&
		!(key_set_all(&odd_key_set, state->inner_key != NULL, target_key_set.first) &&
		  !target_key_set.differ))
		dimension_error(state, targets.dim, odd_query_dim);

	/* No pair of non-NULL vectors: no distance to compute. */
	state->engine_k = (int32) Min(wanted, targets.n);
	if (queries.n == 0 || state->engine_k == 0)
	{
		state->engine_k = 0;
		return;
	}

	if (state->with_ties && state->radius_mode == KNN_RANGE_NONE)
		check_ties_memory(state, queries.n, wanted, targets.n);
	if (state->radius_mode == KNN_RANGE_NONE && !state->with_ties)
	{
		check_engine_memory(state, (double) queries.n * state->engine_k * KNN_SLOT_BYTES);
		state->n_slots = queries.n * state->engine_k;
		state->neighbors = MemoryContextAllocHuge(state->join_cxt, sizeof(int64) * state->n_slots);
		state->distances = MemoryContextAllocHuge(state->join_cxt, sizeof(double) * state->n_slots);
	}

	/* Targets are in scan order, so the engine breaks ties by scan order. */
	knn_matrix_problem(&problem, &queries, &targets, state->engine_k);
	problem.metric = state->metric;
	problem.method = KNN_METHOD_AUTO;
	if (state->inner_key != NULL)
	{
		problem.query_keys = query_keys;
		problem.target_keys = target_keys;
	}

	/*
	 * A self-join of one table reads the same vectors, in the same order, on
	 * both sides: one matrix tells the engine so (shared clustering, the
	 * symmetric Gram matrix). The result cannot differ: the values are the
	 * same bits.
	 */
	if (knn_matrix_same_values(&queries, &targets))
		problem.targets = problem.queries;
	knn_progress_totals(queries.n, targets.n, -1);
	knn_progress_phase(KNN_PROGRESS_ENGINE);
	if (state->radius_mode != KNN_RANGE_NONE)
	{
		start_ranges(state);
		run_range(state, reader, &problem, &queries, &targets, &stats, NULL, 0);
		finish_ranges(state, queries.n);
	}
	else if (state->with_ties)
	{
		start_ranges(state);
		run_ties(state, reader, &problem, &queries, &targets, wanted, &stats, NULL, 0);
		finish_ranges(state, queries.n);
	}
	else
		run_knn(state, reader, &problem, &queries, &targets, state->neighbors, state->distances,
				&stats);
	record_run(state, &problem, &stats);
	knn_matrix_free(&queries);
	knn_matrix_free(&targets);
}

/*
 * Dimensions of the grouped join: each query's (0 = no part), and per group
 * the first query's and one other, if its queries differ.
 */
typedef struct KnnGroupDims
{
	int		   *outer_dim;
	int		   *group_dim;
	int		   *group_other_dim;
} KnnGroupDims;

/* The targets of the groups whose queries have one dimension, read once. */
typedef struct KnnDimTargets
{
	int			dim;
	KnnMatrix	targets;
	int64	   *inner_rows;		/* per target: its inner row */
	int64	   *groups;
	int64	   *keys;			/* self-exclusion keys (0 without) */
	int64		room;			/* entries the three arrays have */
} KnnDimTargets;

/*
 * Room in dt's arrays for one more target: they grow by doubling (in cxt),
 * so that many query dimensions do not each take arrays of every inner row.
 */
static void
dim_targets_reserve(KnnDimTargets *dt, int64 n_inner, MemoryContext cxt)
{
	int64		room;

	if (dt->targets.n < dt->room)
		return;
	room = Min(n_inner, Max(1024, 2 * dt->room));
	if (dt->room == 0)
	{
		dt->inner_rows = MemoryContextAllocHuge(cxt, sizeof(int64) * room);
		dt->groups = MemoryContextAllocHuge(cxt, sizeof(int64) * room);
		dt->keys = MemoryContextAllocHuge(cxt, sizeof(int64) * room);
	}
	else
	{
		dt->inner_rows = repalloc_huge(dt->inner_rows, sizeof(int64) * room);
		dt->groups = repalloc_huge(dt->groups, sizeof(int64) * room);
		dt->keys = repalloc_huge(dt->keys, sizeof(int64) * room);
	}
	dt->room = room;
}

/*
 * The queries' dimensions, per group, and the distinct ones in order of
 * first appearance (*dim_list). Numbers the queries in query_of_outer.
 */
static void
read_group_query_dims(KnnJoinState *state, const KnnVectorReader *reader, KnnGroupDims *dims,
					  int64 *n_queries, List **dim_list)
{
	*n_queries = 0;
	*dim_list = NIL;
	for (int64 i = 0; i < state->n_outer; i++)
	{
		KnnVectorView view;
		int64		g = state->outer_group[i];

		state->query_of_outer[i] = -1;
		dims->outer_dim[i] = 0;
		if ((state->outer_key != NULL && state->outer_key[i] == KNN_NULL_KEY) ||
			outer_without_group(state, i) ||
			!query_vector(state, i, reader, &view))
			continue;
		dims->outer_dim[i] = view.dim;
		state->query_of_outer[i] = (*n_queries)++;
		if (!list_member_int(*dim_list, view.dim))
			*dim_list = lappend_int(*dim_list, view.dim);
		if (dims->group_dim[g] == 0)
			dims->group_dim[g] = view.dim;
		else if (dims->group_dim[g] != view.dim && dims->group_other_dim[g] == 0)
			dims->group_other_dim[g] = view.dim;
	}
}

/*
 * Reads every inner row's vector once, into the targets of its group's
 * dimension, and fails as the nested loop would: when a query and a target
 * of one group differ (with a self-exclusion this is stricter than the
 * nested loop, which would skip an excluded pair of different dimensions).
 * Lists the inner rows with a NULL vector; a row of a group without
 * queries is never compared, so it is left out.
 */
static void
read_group_targets(KnnJoinState *state, const KnnVectorReader *reader, const KnnGroupDims *dims,
				   KnnDimTargets *per_dim, int n_dims, int64 *n_targets)
{
	*n_targets = 0;
	state->n_null_inner = 0;
	for (int64 i = 0; i < state->n_inner; i++)
	{
		KnnVectorView view;
		int64		g = state->inner_group[i];
		KnnDimTargets *into = per_dim;

		if ((state->inner_key != NULL && state->inner_key[i] == KNN_NULL_KEY) ||
			g == KNN_GROUP_NULL)
			continue;
		if (!row_vector(state, state->inner_slot, state->inner_rows[i], state->target_column,
						reader, "target", i, &view))
		{
			state->null_inner[state->n_null_inner++] = i;
			continue;
		}
		if (dims->group_dim[g] == 0)
			continue;
		if (view.dim != dims->group_dim[g])
			dimension_error(state, view.dim, dims->group_dim[g]);
		if (dims->group_other_dim[g] != 0)
			dimension_error(state, view.dim, dims->group_other_dim[g]);
		/* group_dim[g] is some query's dimension, so one of per_dim's */
		while (into->dim != view.dim)
			into++;
		dim_targets_reserve(into, state->n_inner, state->join_cxt);
		into->inner_rows[into->targets.n] = i;
		into->groups[into->targets.n] = g;
		into->keys[into->targets.n] = state->inner_key != NULL ? state->inner_key[i] : 0;
		knn_matrix_append_view(&into->targets, i, &view, reader);
		(*n_targets)++;
	}
}


/*
 * One engine run over the groups whose rows have one dimension; its rows
 * land in the join's array of rows per query (targets numbered from
 * *target_base on, in scan order).
 */
static void
run_group_dimension(KnnJoinState *state, const KnnVectorReader *reader, const KnnGroupDims *dims,
					KnnDimTargets *dt, int64 wanted, int64 *target_base, int64 *scratch_query,
					int64 *query_keys, int64 *query_groups)
{
	KnnMatrix	queries;
	KnnProblem	problem;
	KnnStats	stats;
	MemoryContext old = MemoryContextSwitchTo(state->join_cxt);
	int64		base = *target_base;
	int32		k;
	int64	   *neighbors;
	double	   *distances;

	knn_matrix_init(&queries, "query", reader->element);
	MemoryContextSwitchTo(old);
	for (int64 j = 0; j < dt->targets.n; j++)
		state->inner_of_target[base + j] = dt->inner_rows[j];
	*target_base = base + dt->targets.n;
	if (dt->targets.n == 0)
		return;
	/* the queries, read again (they are usually far fewer than the targets) */
	for (int64 i = 0; i < state->n_outer; i++)
	{
		KnnVectorView view;

		if (dims->outer_dim[i] != dt->dim ||
			!query_vector(state, i, reader, &view))
			continue;
		scratch_query[queries.n] = state->query_of_outer[i];
		query_groups[queries.n] = state->outer_group[i];
		query_keys[queries.n] = state->outer_key != NULL ? state->outer_key[i] : 0;
		knn_matrix_append_view(&queries, i, &view, reader);
	}
	MemoryContextReset(state->css.ss.ps.ps_ExprContext->ecxt_per_tuple_memory);

	k = (int32) Min(wanted, dt->targets.n);
	knn_matrix_problem(&problem, &queries, &dt->targets, k);
	problem.metric = state->metric;
	problem.method = KNN_METHOD_AUTO;
	problem.query_groups = query_groups;
	problem.target_groups = dt->groups;
	if (state->inner_key != NULL)
	{
		problem.query_keys = query_keys;
		problem.target_keys = dt->keys;
	}
	/* One table on both sides: one matrix (see run_engine). */
	if (knn_matrix_same_values(&queries, &dt->targets) &&
		memcmp(query_groups, dt->groups, sizeof(int64) * queries.n) == 0)
		problem.targets = problem.queries;
	if (state->radius_mode != KNN_RANGE_NONE || state->with_ties)
	{
		if (state->radius_mode != KNN_RANGE_NONE)
			run_range(state, reader, &problem, &queries, &dt->targets, &stats, scratch_query,
					  base);
		else
			run_ties(state, reader, &problem, &queries, &dt->targets, wanted, &stats,
					 scratch_query, base);
		record_run(state, &problem, &stats);
		knn_matrix_free(&queries);
		return;
	}
	neighbors = MemoryContextAllocHuge(state->join_cxt, sizeof(int64) * queries.n * k);
	distances = MemoryContextAllocHuge(state->join_cxt, sizeof(double) * queries.n * k);
	run_knn(state, reader, &problem, &queries, &dt->targets, neighbors, distances, &stats);
	record_run(state, &problem, &stats);

	for (int64 j = 0; j < queries.n; j++)
	{
		int64		slot = scratch_query[j] * state->engine_k;

		for (int32 r = 0; r < k; r++)
		{
			int64		t = neighbors[j * k + r];

			state->neighbors[slot + r] = t < 0 ? -1 : base + t;
			state->distances[slot + r] = distances[j * k + r];
		}
		if ((j & 4095) == 0)
			CHECK_FOR_INTERRUPTS();
	}
	pfree(neighbors);
	pfree(distances);
	knn_matrix_free(&queries);
}

/*
 * The per-group join ("t.g = q.g ..."). Only pairs of one group are
 * compared, so groups may differ in dimension: one engine run per
 * dimension (almost always one), each a per-group problem.
 */
static void
run_grouped_engine(KnnJoinState *state, int64 wanted)
{
	const KnnVectorReader *reader = knn_vector_reader(state->kind);
	KnnGroupDims dims;
	KnnDimTargets *per_dim;
	List	   *dim_list;
	int			n_dims;
	MemoryContext old;
	int64		n_queries;
	int64		n_targets;
	int64		target_base = 0;
	int64	   *scratch_query;
	int64	   *query_keys;
	int64	   *query_groups;

	if (state->exclude_query_column > 0)
		build_keys(state);
	build_groups(state);
	if (state->query_expression != NULL)
		compute_query_vectors(state);
	old = MemoryContextSwitchTo(state->join_cxt);
	state->query_of_outer = palloc_extended(sizeof(int64) * Max(1, state->n_outer), MCXT_ALLOC_HUGE);
	state->inner_of_target = palloc_extended(sizeof(int64) * Max(1, state->n_inner), MCXT_ALLOC_HUGE);
	state->null_inner = palloc_extended(sizeof(int64) * Max(1, state->n_inner), MCXT_ALLOC_HUGE);
	dims.outer_dim = palloc_extended(sizeof(int) * Max(1, state->n_outer), MCXT_ALLOC_HUGE);
	dims.group_dim = palloc_extended(sizeof(int) * Max(1, state->group_bound),
									 MCXT_ALLOC_HUGE | MCXT_ALLOC_ZERO);
	dims.group_other_dim = palloc_extended(sizeof(int) * Max(1, state->group_bound),
										   MCXT_ALLOC_HUGE | MCXT_ALLOC_ZERO);
	read_group_query_dims(state, reader, &dims, &n_queries, &dim_list);
	n_dims = list_length(dim_list);
	per_dim = palloc0(sizeof(KnnDimTargets) * Max(1, n_dims));
	for (int d = 0; d < n_dims; d++)
	{
		per_dim[d].dim = list_nth_int(dim_list, d);
		knn_matrix_init(&per_dim[d].targets, "target", reader->element);
	}
	MemoryContextSwitchTo(old);
	/* (without any query vector, only the NULL-vector inner rows matter) */
	read_group_targets(state, reader, &dims, per_dim, n_dims, &n_targets);
	MemoryContextReset(state->css.ss.ps.ps_ExprContext->ecxt_per_tuple_memory);
	state->engine_k = (int32) Min(wanted, n_targets);
	if (n_queries == 0 || state->engine_k == 0)
	{
		state->engine_k = 0;
		return;
	}
	knn_progress_totals(n_queries, n_targets, -1);
	knn_progress_phase(KNN_PROGRESS_ENGINE);
	if (state->with_ties && state->radius_mode == KNN_RANGE_NONE)
		check_ties_memory(state, n_queries, wanted, n_targets);
	if (state->radius_mode != KNN_RANGE_NONE || state->with_ties)
		start_ranges(state);
	else
	{
		check_engine_memory(state, (double) n_queries * state->engine_k * KNN_SLOT_BYTES);
		state->n_slots = n_queries * state->engine_k;
		state->neighbors = MemoryContextAllocHuge(state->join_cxt, sizeof(int64) * state->n_slots);
		state->distances = MemoryContextAllocHuge(state->join_cxt, sizeof(double) * state->n_slots);
		for (int64 i = 0; i < state->n_slots; i++)
			state->neighbors[i] = -1;	/* a group with fewer targets than k */
	}

	old = MemoryContextSwitchTo(state->join_cxt);
	scratch_query = palloc_extended(sizeof(int64) * n_queries, MCXT_ALLOC_HUGE);
	query_keys = palloc_extended(sizeof(int64) * n_queries, MCXT_ALLOC_HUGE);
	query_groups = palloc_extended(sizeof(int64) * n_queries, MCXT_ALLOC_HUGE);
	MemoryContextSwitchTo(old);
	for (int d = 0; d < n_dims; d++)
	{
		run_group_dimension(state, reader, &dims, &per_dim[d], wanted, &target_base,
							scratch_query, query_keys, query_groups);
		knn_matrix_free(&per_dim[d].targets);
	}
	if (state->radius_mode != KNN_RANGE_NONE || state->with_ties)
		finish_ranges(state, n_queries);
}

/* Reads the inner rows and runs the engine, for OFFSET state->offset and this LIMIT. */
static void
join_inner(KnnJoinState *state, int64 limit, instr_time start)
{
	instr_time	read_done;

	if (state->after_exclusion != NULL)
		state->inner_rows = read_inner_rows_after_exclusion(state, &state->n_inner);
	else
		state->inner_rows = read_all_rows(state->inner_ps, state->join_cxt, &state->n_inner);
	if (state->offset < state->n_inner)
		state->k = limit < 0 ? state->n_inner - state->offset :
			Min(limit, state->n_inner - state->offset);
	/* (an OFFSET past every inner row leaves nothing to rank: no limit applies) */
	if (state->k > 0 && state->offset + state->k > PG_INT32_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("KNN Join supports at most %d rows per outer row", PG_INT32_MAX)));
	INSTR_TIME_SET_CURRENT(read_done);
	INSTR_TIME_SUBTRACT(read_done, start);
	state->seconds_read = INSTR_TIME_GET_DOUBLE(read_done);

	/*
	 * An OFFSET past every inner row (k = 0) still reads every vector:
	 * PostgreSQL's sort computes every distance before the OFFSET skips
	 * them, so a dimension mismatch fails there too (wanted 0: no run).
	 */
	if (state->n_inner > 0 && state->n_group_columns > 0)
		run_grouped_engine(state, state->k > 0 ? state->offset + state->k : 0);
	else if (state->n_inner > 0)
		run_engine(state, state->k > 0 ? state->offset + state->k : 0);
}

/* What the engine's result arrays hold (they stay until the node's rows are read). */
static int64
engine_result_bytes(KnnJoinState *state)
{
	int64		bytes = 0;

	if (state->neighbors != NULL)
		bytes += GetMemoryChunkSpace(state->neighbors);
	if (state->distances != NULL)
		bytes += GetMemoryChunkSpace(state->distances);
	if (state->range_begin != NULL)
		bytes += GetMemoryChunkSpace(state->range_begin);
	return bytes;
}

/*
 * The local part's rows of every outer row, in its order: the first `want`
 * (-1: all), and WITH TIES those tied with the last of them.
 */
static void
collect_local_candidates(KnnJoinState *state, int64 want, KnnScanCandidates *candidates)
{
	MemoryContext old = MemoryContextSwitchTo(state->join_cxt);

	for (int64 o = 0; o < state->n_outer; o++)
	{
		KnnScanCandidate item = {0};
		int64		n = 0;

		state->current_outer = o;
		state->in_tail = false;
		state->position = 0;
		item.outer_row = o;
		while (next_candidate(state, &item.inner_row, &item.distance, &item.distance_null))
		{
			if (want >= 0 && n >= want &&
				!(state->with_ties &&
				  ties_with_last(state, item.inner_row, item.distance, item.distance_null)))
				break;
			item.rank = n;
			knn_scan_candidates_add(candidates, &item);
			if (++n == want && state->with_ties)
			{
				state->last_inner_row = item.inner_row;
				state->last_distance = item.distance;
				state->last_distance_null = item.distance_null;
			}
		}
		if ((o & 1023) == 0)
			CHECK_FOR_INTERRUPTS();
	}
	state->current_outer = 0;
	state->in_tail = false;
	state->position = 0;
	MemoryContextSwitchTo(old);
}

/*
 * The join with shards: ship and send, the local part (OFFSET 0, LIMIT
 * OFFSET + LIMIT) while they work unless it needs their connections, their
 * rows, and the merge; the node then reads the merged lists.
 */
static void
join_sharded(KnnJoinState *state, int64 limit, instr_time start)
{
	int64		offset = state->offset;
	int64		want = limit < 0 ? -1 :
		(limit > PG_INT64_MAX - offset ? PG_INT64_MAX : offset + limit);
	bool		local_after = knn_scan_shards_local_after(state->shards);
	KnnScanCandidates candidates = {0};
	MinimalTuple *shard_rows = NULL;
	int64		n_shard_rows = 0;
	int64		n_local;

	/*
	 * The shards' rows, counted against the limit as they are held (a LIMIT
	 * is a bound, not what comes back; knn_scan_shard.c keeps per outer row
	 * only what can still be among its first rows), with the local part's
	 * engine arrays: all are held together until the merge is read.
	 */
	knn_scan_candidates_begin(&candidates);
	state->candidates = &candidates;
	knn_scan_shards_start(state->shards, state->outer_rows, state->n_outer, state->outer_slot,
						  want, state->radius);
	for (int pass = 0; pass < 2; pass++)
	{
		if (pass == (local_after ? 1 : 0))
		{
			instr_time	local_start;

			INSTR_TIME_SET_CURRENT(local_start);
			state->offset = 0;
			join_inner(state, want, start);
			knn_scan_candidates_hold(&candidates, engine_result_bytes(state));
			collect_local_candidates(state, want, &candidates);
			state->offset = offset;
			knn_scan_shards_note_local(state->shards, state->n_inner,
									   knn_seconds_since(local_start));
		}
		if (pass == 0)
			knn_scan_shards_collect(state->shards, ExecGetResultType(state->inner_ps),
									state->join_cxt, &shard_rows, &n_shard_rows, &candidates);
	}

	/* the shards' rows after the local part's */
	n_local = state->n_inner;
	if (n_shard_rows > 0)
	{
		MinimalTuple *rows;

		/* counted as the shards' array was (knn_scan_shards_collect), which it replaces */
		knn_scan_candidates_hold(&candidates, (n_local + n_shard_rows) * (int64) sizeof(MinimalTuple));
		rows = MemoryContextAllocHuge(state->join_cxt, (n_local + n_shard_rows) * sizeof(MinimalTuple));
		if (n_local > 0)
			memcpy(rows, state->inner_rows, n_local * sizeof(MinimalTuple));
		memcpy(rows + n_local, shard_rows, n_shard_rows * sizeof(MinimalTuple));
		pfree(shard_rows);
		candidates.held_bytes -= n_shard_rows * (int64) sizeof(MinimalTuple);
		state->inner_rows = rows;
		state->n_inner = n_local + n_shard_rows;
		for (int64 i = 0; i < candidates.n; i++)
			if (candidates.items[i].source > 0)
				candidates.items[i].inner_row += n_local;
	}
	state->merged_begin = knn_scan_shards_merge(state->shards, &candidates, state->n_outer,
												state->inner_rows, state->inner_slot,
												state->tie_slot, state->join_cxt);
	state->merged = candidates.items;
	state->k = limit < 0 ? PG_INT64_MAX : limit;
	state->candidates = NULL;
}

/* The whole join, on the first call after start or rescan. */
static void
compute_join(KnnJoinState *state)
{
	instr_time	start;
	int64		limit;

	INSTR_TIME_SET_CURRENT(start);
	state->computed = true;
	/* (a run with shards that failed left its own) */
	state->candidates = NULL;
	state->current_outer = 0;
	state->row_started = false;
	state->n_inner = 0;
	state->k = 0;
	state->engine_k = 0;

	/* The knn_gpu_progress view shows the node's phases (k once known). */
	knn_progress_begin(KNN_JOIN_NAME, 0);
	state->progress = true;
	state->outer_rows = read_all_rows(state->outer_ps, state->join_cxt, &state->n_outer);
	if (state->n_outer == 0)
		return;					/* the nested loop never starts its inner side */

	/* As the Limit node: OFFSET first, and LIMIT 0 reads nothing. */
	state->offset = evaluate_count(state, state->offset_state, true);
	limit = evaluate_count(state, state->limit_state, false);
	if (limit == 0)
		return;
	knn_progress_k((int32) Min(Max(limit, 0), PG_INT32_MAX));
	knn_progress_phase(KNN_PROGRESS_READING_TARGETS);
	/*
	 * "<distance> < NULL" is never true: no rows (but LEFT JOIN's). Its
	 * filter still computes each distance: the vectors are read and
	 * checked, with no row to rank (join_inner).
	 */
	if (state->radius_mode != KNN_RANGE_NONE)
	{
		ExprContext *econtext = state->css.ss.ps.ps_ExprContext;
		bool		isnull;
		Datum		value = ExecEvalExprSwitchContext(state->radius_state, econtext, &isnull);

		if (isnull && state->shards != NULL)
			return;
		if (isnull)
			limit = 0;
		else
			state->radius = DatumGetFloat8(value);
	}
	if (state->shards != NULL)
		join_sharded(state, limit, start);
	else
		join_inner(state, limit, start);
	knn_progress_phase(KNN_PROGRESS_RETURNING);
}

/* Closes this node's progress row (at the end of its rows, rescan, end). */
static void
end_progress(KnnJoinState *state)
{
	if (state->progress)
		knn_progress_end();
	state->progress = false;
}

/*
 * Does the self-exclusion keep this inner row from the current outer row,
 * or is it of another group?
 */
static bool
excluded(KnnJoinState *state, int64 inner_row)
{
	return (state->inner_key != NULL &&
			(state->inner_key[inner_row] == KNN_NULL_KEY ||
			 state->inner_key[inner_row] == state->outer_key[state->current_outer])) ||
		(state->inner_group != NULL &&
		 state->inner_group[inner_row] != state->outer_group[state->current_outer]);
}

/*
 * The engine's order reads the inner rows through two arrays, all three
 * all over memory: a later slot's inner_of_target entry is asked for 16
 * slots ahead (knn_prefetch_target), its row's pointer 8 ahead and the row
 * itself 4 ahead, each once the level before it has come.
 */
static pg_attribute_always_inline void
prefetch_inner_rows(const KnnJoinState *state, int64 slot)
{
	int64		pointer_slot = slot + KNN_PREFETCH_AHEAD / 2;
	int64		row_slot = slot + KNN_PREFETCH_AHEAD / 4;

	knn_prefetch_target(state->inner_of_target, NULL, state->neighbors, slot, state->n_slots);
	if (pointer_slot < state->n_slots && state->neighbors[pointer_slot] >= 0)
		knn_prefetch(&state->inner_rows[state->inner_of_target[state->neighbors[pointer_slot]]]);
	if (row_slot < state->n_slots && state->neighbors[row_slot] >= 0)
		knn_prefetch(state->inner_rows[state->inner_of_target[state->neighbors[row_slot]]]);
}

/*
 * The next of the engine's rows for the current outer row's query (false
 * after the last): per query in the range layout (radius, WITH TIES), else
 * in engine_k slots per query.
 */
static bool
next_engine_row(KnnJoinState *state, int64 query, int64 *inner_row, double *distance)
{
	int64		slot;

	if (state->range_begin != NULL)
	{
		slot = state->range_begin[query] + state->position;
		if (slot >= state->range_begin[query + 1])
			return false;
	}
	else
	{
		slot = query * state->engine_k + state->position;
		if (state->position >= state->engine_k || state->neighbors[slot] < 0)
			return false;
		prefetch_inner_rows(state, slot);
	}
	state->position++;
	*inner_row = state->inner_of_target[state->neighbors[slot]];
	*distance = state->distances[slot];
	return true;
}

/*
 * The next row of the current outer row's subquery, sorted as its ORDER BY
 * sorts: the engine's rows, then (but within a radius) those with a NULL
 * distance in scan order (inner rows with a NULL vector, or every row for
 * a NULL query vector). false at the end.
 */
static bool
next_candidate(KnnJoinState *state, int64 *inner_row, double *distance, bool *distance_null)
{
	int64		query;
	int64		tail_length;

	/* with shards: the merged list */
	if (state->merged_begin != NULL)
	{
		int64		at = state->merged_begin[state->current_outer] + state->position;
		KnnScanCandidate *item;

		if (at >= state->merged_begin[state->current_outer + 1])
			return false;
		state->position++;
		item = &state->merged[at];
		*inner_row = item->inner_row;
		*distance = item->distance;
		*distance_null = item->distance_null;
		return true;
	}
	if (state->k == 0 ||
		(state->outer_key != NULL && state->outer_key[state->current_outer] == KNN_NULL_KEY) ||
		outer_without_group(state, state->current_outer))
		return false;
	query = state->query_of_outer[state->current_outer];
	if (query >= 0 && !state->in_tail && state->engine_k > 0)
	{
		if (next_engine_row(state, query, inner_row, distance))
		{
			*distance_null = false;
			return true;
		}
		state->in_tail = true;
		state->position = 0;
	}
	/* A NULL distance is never within the radius. */
	if (state->radius_mode != KNN_RANGE_NONE)
		return false;
	state->in_tail = true;
	tail_length = query >= 0 ? state->n_null_inner : state->n_inner;
	while (state->position < tail_length)
	{
		int64		row = query >= 0 ? state->null_inner[state->position] : state->position;

		state->position++;
		if (excluded(state, row))
			continue;
		*inner_row = row;
		*distance_null = true;
		return true;
	}
	return false;
}

/*
 * WITH TIES: does this row equal the k-th on every ORDER BY key -- the
 * distance (float8's "=": NaN equals NaN) and the keys after it (their
 * equality operators; two NULLs are equal, as the Limit node has them)?
 */
static bool
ties_with_last(KnnJoinState *state, int64 inner_row, double distance, bool distance_null)
{
	if (distance_null != state->last_distance_null ||
		(!distance_null && !(distance == state->last_distance ||
							 (isnan(distance) && isnan(state->last_distance)))))
		return false;
	if (state->n_tie_columns == 0)
		return true;
	ExecStoreMinimalTuple(state->inner_rows[state->last_inner_row], state->tie_slot, false);
	ExecStoreMinimalTuple(state->inner_rows[inner_row], state->inner_slot, false);
	for (int c = 0; c < state->n_tie_columns; c++)
	{
		bool		last_null;
		bool		this_null;
		Datum		last = slot_getattr(state->tie_slot, state->tie_columns[c], &last_null);
		Datum		this = slot_getattr(state->inner_slot, state->tie_columns[c], &this_null);

		if (last_null != this_null)
			return false;
		if (!last_null &&
			!DatumGetBool(FunctionCall2Coll(&state->tie_equality[c], state->tie_collations[c],
											last, this)))
			return false;
	}
	return true;
}

/*
 * The next row the subquery returns for the current outer row, as its
 * LIMIT would: up to k rows after the OFFSET, and with WITH TIES the rows
 * after the k-th that tie with it.
 */
static bool
next_subquery_row(KnnJoinState *state, int64 *inner_row, double *distance, bool *distance_null)
{
	if (state->emitted < state->k)
	{
		if (!next_candidate(state, inner_row, distance, distance_null))
			return false;
		if (++state->emitted == state->k && state->with_ties)
		{
			state->last_inner_row = *inner_row;
			state->last_distance = *distance;
			state->last_distance_null = *distance_null;
		}
		return true;
	}
	/* (a row that does not tie ends the outer row's rows: nothing is lost) */
	return state->with_ties && state->k > 0 &&
		next_candidate(state, inner_row, distance, distance_null) &&
		ties_with_last(state, *inner_row, *distance, *distance_null);
}

/* Starts the current outer row: its sorted rows, past the OFFSET. */
static void
start_outer_row(KnnJoinState *state)
{
	int64		row;
	double		distance;
	bool		distance_null;

	state->row_started = true;
	state->in_tail = false;
	state->position = 0;
	state->emitted = 0;
	state->matched = false;
	for (int64 i = 0; i < state->offset; i++)
	{
		CHECK_FOR_INTERRUPTS();
		if (!next_candidate(state, &row, &distance, &distance_null))
			break;
	}
}

/*
 * Fills the scan slot from an outer row and an inner row (inner_row < 0:
 * NULLs for the subquery's columns).
 */
static void
fill_scan_slot(KnnJoinState *state, TupleTableSlot *scan_slot, int64 outer_row,
			   int64 inner_row, double distance, bool distance_null)
{
	ExecClearTuple(scan_slot);
	ExecStoreMinimalTuple(state->outer_rows[outer_row], state->outer_slot, false);
	if (inner_row >= 0)
		ExecStoreMinimalTuple(state->inner_rows[inner_row], state->inner_slot, false);
	for (int i = 0; i < state->n_scan_columns; i++)
	{
		int			source = state->column_source[i];

		if (source > 0)
			scan_slot->tts_values[i] = slot_getattr(state->outer_slot, source,
													&scan_slot->tts_isnull[i]);
		else if (source < 0 && inner_row >= 0)
			scan_slot->tts_values[i] = slot_getattr(state->inner_slot, -source,
													&scan_slot->tts_isnull[i]);
		else
		{
			scan_slot->tts_values[i] = Float8GetDatum(distance);
			scan_slot->tts_isnull[i] = distance_null || inner_row < 0;
		}
	}
	ExecStoreVirtualTuple(scan_slot);
}

/* Fills the scan slot with the next row of the join. */
static KnnRowKind
next_row(KnnJoinState *state, TupleTableSlot *scan_slot)
{
	int64		inner_row;
	double		distance = 0;
	bool		distance_null;

	for (;;)
	{
		int64		outer_row = state->current_outer;

		if (outer_row >= state->n_outer)
		{
			end_progress(state);
			return KNN_ROW_NONE;
		}
		if (!state->row_started)
			start_outer_row(state);
		if (next_subquery_row(state, &inner_row, &distance, &distance_null))
		{
			fill_scan_slot(state, scan_slot, outer_row, inner_row, distance, distance_null);
			knn_progress_rows(1);
			return KNN_ROW_JOINED;
		}
		state->current_outer++;
		state->row_started = false;
		if (state->jointype == JOIN_LEFT && !state->matched)
		{
			fill_scan_slot(state, scan_slot, outer_row, -1, 0, true);
			return KNN_ROW_NULL_EXTENDED;
		}
	}
}

/*
 * Our own loop rather than ExecScan: ExecScan would hand an EvalPlanQual
 * recheck to a recheck callback instead of running the join.
 */
static TupleTableSlot *
knn_join_exec(CustomScanState *node)
{
	KnnJoinState *state = (KnnJoinState *) node;
	ExprContext *econtext = node->ss.ps.ps_ExprContext;
	ProjectionInfo *projection = node->ss.ps.ps_ProjInfo;
	TupleTableSlot *scan_slot = node->ss.ss_ScanTupleSlot;

	/*
	 * Children run in the caller's context (a Sort child's tuplesort must
	 * not live in join_cxt); what we keep is allocated in join_cxt.
	 */
	if (!state->computed)
		compute_join(state);

	for (;;)
	{
		KnnRowKind	kind;

		CHECK_FOR_INTERRUPTS();
		ResetExprContext(econtext);
		kind = next_row(state, scan_slot);
		if (kind == KNN_ROW_NONE)
			return NULL;
		econtext->ecxt_scantuple = scan_slot;
		if (kind == KNN_ROW_JOINED)
		{
			if (state->join_filter != NULL && !ExecQual(state->join_filter, econtext))
			{
				InstrCountFiltered1(node, 1);
				continue;
			}
			state->matched = true;
		}
		if (state->other_filter != NULL && !ExecQual(state->other_filter, econtext))
		{
			InstrCountFiltered2(node, 1);
			continue;
		}
		return projection ? ExecProject(projection) : scan_slot;
	}
}

static void
forget_execution(KnnJoinState *state)
{
	state->computed = false;
	state->outer_rows = NULL;
	state->inner_rows = NULL;
	state->query_of_outer = NULL;
	state->query_values = NULL;
	state->query_nulls = NULL;
	state->outer_key = NULL;
	state->inner_key = NULL;
	state->outer_group = NULL;
	state->inner_group = NULL;
	state->inner_of_target = NULL;
	state->null_inner = NULL;
	state->neighbors = NULL;
	state->n_slots = 0;
	state->distances = NULL;
	state->range_begin = NULL;
	state->range_query = NULL;
	state->range_count = state->range_capacity = 0;
	state->n_outer = state->n_inner = state->n_null_inner = 0;
	state->k = 0;
	state->engine_k = 0;
	state->merged_begin = NULL;
	state->merged = NULL;
	end_progress(state);
	MemoryContextReset(state->join_cxt);
}

static void
knn_join_rescan(CustomScanState *node)
{
	KnnJoinState *state = (KnnJoinState *) node;
	ListCell   *lc;

	ExecClearTuple(state->outer_slot);
	ExecClearTuple(state->inner_slot);
	ExecClearTuple(state->tie_slot);
	ExecClearTuple(node->ss.ss_ScanTupleSlot);
	forget_execution(state);
	foreach(lc, node->custom_ps)
	{
		PlanState  *child = lfirst(lc);

		if (node->ss.ps.chgParam != NULL)
			UpdateChangedParamSet(child, node->ss.ps.chgParam);
		/* A child with changed parameters rescans itself when next run. */
		if (child->chgParam == NULL)
			ExecReScan(child);
	}
}

static void
knn_join_end(CustomScanState *node)
{
	KnnJoinState *state = (KnnJoinState *) node;

	end_progress(state);
	ExecClearTuple(state->outer_slot);
	ExecClearTuple(state->inner_slot);
	ExecClearTuple(state->tie_slot);
	ExecClearTuple(node->ss.ss_ScanTupleSlot);
	ExecEndNode(state->outer_ps);
	ExecEndNode(state->inner_ps);
	knn_scan_shards_end(state->shards);
	MemoryContextDelete(state->join_cxt);
}

/* A filter's clauses, as EXPLAIN shows them, with how many rows it removed. */
static void
explain_filter(CustomScanState *node, List *ancestors, ExplainState *es, List *quals,
			   const char *label, const char *removed_label, double removed)
{
	List	   *context;
	double		nloops;

	if (quals == NIL)
		return;
	context = set_deparse_context_plan(es->deparse_cxt, node->ss.ps.plan, ancestors);
	ExplainPropertyText(label, deparse_expression((Node *) make_ands_explicit(quals),
												  context, true, false), es);
	if (es->analyze && node->ss.ps.instrument != NULL)
	{
		nloops = node->ss.ps.instrument->nloops;
		if (removed > 0 || es->format != EXPLAIN_FORMAT_TEXT)
			ExplainPropertyFloat(removed_label, NULL, nloops > 0 ? removed / nloops : 0.0, 0, es);
	}
}

/* LIMIT or OFFSET: a number, ALL, or the expression. */
static void
explain_count(CustomScanState *node, List *ancestors, ExplainState *es, const char *label,
			  Node *count)
{
	if (IsA(count, Const) && ((Const *) count)->constisnull)
		ExplainPropertyText(label, "ALL", es);
	else if (IsA(count, Const))
		ExplainPropertyInteger(label, NULL, DatumGetInt64(((Const *) count)->constvalue), es);
	else
	{
		List	   *context = set_deparse_context_plan(es->deparse_cxt,
													   node->ss.ps.plan, ancestors);

		ExplainPropertyText(label, deparse_expression(count, context, false, false), es);
	}
}

/* "Radius: < 0.5" (or "<= $1"): the bound the distance is compared with. */
static void
explain_radius(CustomScanState *node, List *ancestors, ExplainState *es, Node *radius,
			   bool inclusive)
{
	const char *bound;

	if (IsA(radius, Const) && ((Const *) radius)->constisnull)
		bound = "NULL";
	else if (IsA(radius, Const))
		bound = DatumGetCString(DirectFunctionCall1(float8out, ((Const *) radius)->constvalue));
	else
		bound = deparse_expression(radius,
								   set_deparse_context_plan(es->deparse_cxt, node->ss.ps.plan,
															ancestors),
								   false, false);
	ExplainPropertyText("Radius", psprintf("%s %s", inclusive ? "<=" : "<", bound), es);
}

static void
knn_join_explain(CustomScanState *node, List *ancestors, ExplainState *es)
{
	KnnJoinState *state = (KnnJoinState *) node;
	CustomScan *cscan = (CustomScan *) node->ss.ps.plan;
	Node	   *offset = list_nth(cscan->custom_exprs, KNN_EXPR_OFFSET);
	Node	   *query_expression = list_nth(cscan->custom_exprs, KNN_EXPR_QUERY_VECTOR);
	Instrumentation *instrument = node->ss.ps.instrument;
	const char *rewritten_from = strVal(list_nth(cscan->custom_private,
												 KNN_PRIVATE_REWRITTEN_FROM));

	/* the planner hook's rewrite of the query as written (knn_scan_window.c) */
	if (rewritten_from[0] != '\0')
		ExplainPropertyText("Rewritten From", rewritten_from, es);
	if (state->jointype == JOIN_LEFT)
		ExplainPropertyText("Join Type", "Left", es);
	if (query_expression != NULL)
		ExplainPropertyText("Query Vector",
							deparse_expression(query_expression,
											   set_deparse_context_plan(es->deparse_cxt,
																		node->ss.ps.plan,
																		ancestors),
											   true, false), es);
	if (state->radius_mode != KNN_RANGE_NONE)
		explain_radius(node, ancestors, es, list_nth(cscan->custom_exprs, KNN_EXPR_RADIUS),
					   state->radius_mode == KNN_RANGE_AT_MOST);
	if (list_nth(cscan->custom_exprs, KNN_EXPR_LIMIT) != NULL)
		explain_count(node, ancestors, es, "K", list_nth(cscan->custom_exprs, KNN_EXPR_LIMIT));
	if (offset != NULL)
		explain_count(node, ancestors, es, "Offset", offset);
	if (state->with_ties)
		ExplainPropertyBool("With Ties", true, es);
	ExplainPropertyText("Metric", knn_metric_name(state->metric), es);
	/* vector columns, the common case, keep their plans' lines unchanged */
	if (state->kind == KNN_VECTOR_HALFVEC)
		ExplainPropertyText("Element", "float16 (halfvec)", es);
	else if (state->kind == KNN_VECTOR_BIT)
		ExplainPropertyText("Element", "bit", es);
	ExplainPropertyText("Engine", knn_device_name((KnnDevice) knn_gpu_device), es);
	if (state->exclude_query_column > 0)
		ExplainPropertyText("Self Exclusion",
							strVal(list_nth(cscan->custom_private, KNN_PRIVATE_EXCLUDE_TEXT)), es);
	if (state->after_exclusion != NULL)
		ExplainPropertyText("Filter After Self Exclusion",
							strVal(list_nth(cscan->custom_private,
											KNN_PRIVATE_AFTER_EXCLUSION_TEXT)), es);
	if (state->n_group_columns > 0)
		ExplainPropertyText("Group Keys",
							strVal(list_nth(cscan->custom_private, KNN_PRIVATE_GROUP_TEXT)), es);

	explain_filter(node, ancestors, es, list_nth(cscan->custom_exprs, KNN_EXPR_JOIN_FILTER),
				   "Join Filter", "Rows Removed by Join Filter",
				   instrument ? instrument->nfiltered1 : 0);
	explain_filter(node, ancestors, es, list_nth(cscan->custom_exprs, KNN_EXPR_FILTER),
				   "Filter", "Rows Removed by Filter",
				   instrument ? instrument->nfiltered2 : 0);

	if (es->analyze)
		knn_stats_explain(&state->totals, es);
	knn_scan_shards_explain(state->shards, es);
}
