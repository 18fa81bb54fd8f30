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
 *    unspecified, so any order is one its plan could give.)
 *  - NaN distances (cosine with a zero vector) sort after all numbers and
 *    NULL distances after NaN, as ORDER BY float8 ASC does. An inner row
 *    with a NULL vector has a NULL distance: such rows fill up to k after
 *    the engine's rows, in scan order.
 *  - An outer row with a NULL vector has NULL distances to everything: it
 *    gets the first k inner rows in scan order, with NULL distance.
 *  - LIMIT NULL means all rows; a negative LIMIT is the same error as the
 *    Limit node's; LIMIT 0 reads no inner rows.
 *  - The inner side is read only when some outer row exists, and vector
 *    dimensions are checked only between non-NULL query and target vectors,
 *    so the operator's "different vector dimensions" error happens exactly
 *    when the nested loop would hit it.
 *
 * The rows then pass the node's quals (filters above the subquery's LIMIT
 * and join clauses) and its projection. A rescan starts over.
 */
#include "postgres.h"

#include "commands/explain.h"
#include "executor/executor.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "portability/instr_time.h"
#include "utils/memutils.h"
#include "utils/ruleutils.h"

#include "knn_matrix.h"
#include "knn_run.h"
#include "knn_scan.h"
#include "knn_settings.h"
#include "knn_stats.h"
#include "knn_vocabulary.h"

typedef struct KnnJoinState
{
	CustomScanState css;

	/* From the plan */
	KnnMetric	metric;
	AttrNumber	query_column;	/* query vector in the outer rows */
	AttrNumber	target_column;	/* target vector in the inner rows */
	bool		target_is_left;
	int			n_scan_columns;
	int		   *column_source;	/* see KNN_PRIVATE_SOURCES */
	ExprState  *limit_state;
	ExprState  *join_filter;	/* NULL when there is none */
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
	int64	   *query_of_outer; /* outer row -> engine query, -1 = NULL vector */
	int64	   *inner_of_target;	/* engine target -> inner row */
	int64	   *null_inner;		/* inner rows with a NULL vector, scan order */
	int64		n_null_inner;
	int32		engine_k;		/* neighbours per query from the engine */
	int64	   *neighbors;		/* n_queries x engine_k */
	double	   *distances;

	/* Where emission stands */
	int64		current_outer;
	int64		current_rank;
	int64		current_rows;	/* rows the current outer row yields */
	int64		current_engine_rows;	/* of which from the engine */

	/* For EXPLAIN ANALYZE: the last engine run */
	bool		have_record;
	KnnJoinRecord record;
	double		seconds_read;
} KnnJoinState;

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
	state->n_scan_columns = list_length(sources);
	state->column_source = palloc(sizeof(int) * Max(1, state->n_scan_columns));
	foreach(lc, sources)
		state->column_source[i++] = lfirst_int(lc);

	/* The children are read once, forwards. */
	eflags &= ~(EXEC_FLAG_BACKWARD | EXEC_FLAG_MARK);
	state->outer_ps = ExecInitNode(list_nth(cscan->custom_plans, KNN_OUTER_CHILD), estate, eflags);
	state->inner_ps = ExecInitNode(list_nth(cscan->custom_plans, KNN_INNER_CHILD), estate, eflags);
	node->custom_ps = list_make2(state->outer_ps, state->inner_ps);

	state->limit_state = ExecInitExpr(linitial(cscan->custom_exprs), &node->ss.ps);
	state->join_filter = ExecInitQual(list_copy_tail(cscan->custom_exprs, 1), &node->ss.ps);
	state->outer_slot = ExecInitExtraTupleSlot(estate, ExecGetResultType(state->outer_ps),
											   &TTSOpsMinimalTuple);
	state->inner_slot = ExecInitExtraTupleSlot(estate, ExecGetResultType(state->inner_ps),
											   &TTSOpsMinimalTuple);
	state->join_cxt = AllocSetContextCreate(CurrentMemoryContext, "KNN Join",
											ALLOCSET_DEFAULT_SIZES);
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
	}
	*n_rows = n;
	return rows;
}

/* The LIMIT as the Limit node reads it: NULL = all, negative = error. */
static int64
evaluate_limit(KnnJoinState *state)
{
	ExprContext *econtext = state->css.ss.ps.ps_ExprContext;
	bool		isnull;
	Datum		value;
	int64		count;

	value = ExecEvalExprSwitchContext(state->limit_state, econtext, &isnull);
	if (isnull)
		return -1;
	count = DatumGetInt64(value);
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
	ereport(ERROR,
			(errcode(ERRCODE_DATA_EXCEPTION),
			 errmsg("different vector dimensions %d and %d",
					state->target_is_left ? target_dim : query_dim,
					state->target_is_left ? query_dim : target_dim)));
}

/*
 * The vector of a stored row, checked and viewed (false for NULL). A value
 * that must be detoasted is, into the per-row context, which is reset at
 * the next row.
 */
static bool
row_vector(KnnJoinState *state, TupleTableSlot *slot, MinimalTuple row, AttrNumber column,
		   const KnnVectorReader *reader, const char *set_name, int64 id,
		   KnnVectorView *view)
{
	MemoryContext row_cxt = state->css.ss.ps.ps_ExprContext->ecxt_per_tuple_memory;
	MemoryContext old;
	bool		isnull;
	Datum		value;
	struct varlena *detoasted;
	KnnValueProblem problem;

	CHECK_FOR_INTERRUPTS();
	MemoryContextReset(row_cxt);
	ExecStoreMinimalTuple(row, slot, false);
	value = slot_getattr(slot, column, &isnull);
	if (isnull)
		return false;
	old = MemoryContextSwitchTo(row_cxt);
	detoasted = PG_DETOAST_DATUM(value);
	MemoryContextSwitchTo(old);
	problem = reader->view(detoasted, view);
	if (problem != KNN_VALUE_OK)
		knn_vector_problem_error(problem, set_name, id);
	return true;
}

/*
 * The queries: every outer row's vector, read once. A query whose dimension
 * differs from the first one's is kept out and remembered in *odd_dim: the
 * nested loop fails on it only once it meets a target.
 */
static void
read_queries(KnnJoinState *state, const KnnVectorReader *reader, KnnMatrix *queries,
			 int *odd_dim)
{
	*odd_dim = -1;
	for (int64 i = 0; i < state->n_outer; i++)
	{
		KnnVectorView view;

		state->query_of_outer[i] = -1;
		if (!row_vector(state, state->outer_slot, state->outer_rows[i], state->query_column,
						reader, "query", i, &view))
			continue;
		if (queries->dim < 0 || view.dim == queries->dim)
		{
			state->query_of_outer[i] = queries->n;
			knn_matrix_append_view(queries, i, &view, reader);
		}
		else if (*odd_dim < 0)
			*odd_dim = view.dim;
	}
}

/*
 * The targets: every inner row's vector, read once; a non-NULL one against
 * the queries' dimension, as the nested loop compares them. NULL vectors
 * are listed in scan order. Without queries (query_dim < 0) no distance is
 * ever computed, so only the NULLs are listed.
 */
static void
read_targets(KnnJoinState *state, const KnnVectorReader *reader, int query_dim,
			 KnnMatrix *targets)
{
	state->n_null_inner = 0;
	for (int64 i = 0; i < state->n_inner; i++)
	{
		KnnVectorView view;

		if (!row_vector(state, state->inner_slot, state->inner_rows[i], state->target_column,
						reader, "target", i, &view))
			state->null_inner[state->n_null_inner++] = i;
		else if (query_dim >= 0)
		{
			if (view.dim != query_dim)
				dimension_error(state, view.dim, query_dim);
			state->inner_of_target[targets->n] = i;
			knn_matrix_append_view(targets, i, &view, reader);
		}
	}
}

/*
 * Builds the engine's matrices from the stored rows (queries from outer
 * rows, targets from inner rows, NULL vectors left out) and runs it.
 */
static void
run_engine(KnnJoinState *state)
{
	const KnnVectorReader *reader = knn_vector_reader(KNN_VECTOR_TYPE);
	KnnMatrix	queries;
	KnnMatrix	targets;
	KnnProblem	problem;
	KnnStats	stats;
	MemoryContext old;
	int			odd_query_dim;

	old = MemoryContextSwitchTo(state->join_cxt);
	state->query_of_outer = palloc_extended(sizeof(int64) * Max(1, state->n_outer), MCXT_ALLOC_HUGE);
	state->inner_of_target = palloc_extended(sizeof(int64) * Max(1, state->n_inner), MCXT_ALLOC_HUGE);
	state->null_inner = palloc_extended(sizeof(int64) * Max(1, state->n_inner), MCXT_ALLOC_HUGE);
	knn_matrix_init(&queries, "query");
	knn_matrix_init(&targets, "target");
	MemoryContextSwitchTo(old);

	read_queries(state, reader, &queries, &odd_query_dim);
	read_targets(state, reader, queries.dim, &targets);
	MemoryContextReset(state->css.ss.ps.ps_ExprContext->ecxt_per_tuple_memory);
	if (odd_query_dim >= 0 && targets.n > 0)
		dimension_error(state, targets.dim, odd_query_dim);

	/* No pair of non-NULL vectors: no distance to compute. */
	state->engine_k = (int32) Min(state->k, targets.n);
	if (queries.n == 0 || state->engine_k == 0)
	{
		state->engine_k = 0;
		return;
	}

	state->neighbors = MemoryContextAllocHuge(state->join_cxt,
											  sizeof(int64) * queries.n * state->engine_k);
	state->distances = MemoryContextAllocHuge(state->join_cxt,
											  sizeof(double) * queries.n * state->engine_k);

	/* Targets are in scan order, so the engine breaks ties by scan order. */
	knn_matrix_problem(&problem, &queries, &targets, state->engine_k);
	problem.metric = state->metric;
	problem.method = KNN_METHOD_AUTO;
	knn_run_problem(&problem, state->neighbors, state->distances, &stats);

	knn_stats_record(&state->record, &problem, &stats, state->seconds_read, 0.0, 0.0);
	state->have_record = true;
	knn_matrix_free(&queries);
	knn_matrix_free(&targets);
}

/* The whole join, on the first call after start or rescan. */
static void
compute_join(KnnJoinState *state)
{
	instr_time	start;
	instr_time	read_done;
	int64		limit;

	INSTR_TIME_SET_CURRENT(start);
	state->computed = true;
	state->current_outer = 0;
	state->current_rank = 0;
	state->current_rows = -1;
	state->n_inner = 0;
	state->k = 0;
	state->engine_k = 0;

	state->outer_rows = read_all_rows(state->outer_ps, state->join_cxt, &state->n_outer);
	if (state->n_outer == 0)
		return;					/* the nested loop never starts its inner side */

	limit = evaluate_limit(state);
	if (limit == 0)
		return;
	state->inner_rows = read_all_rows(state->inner_ps, state->join_cxt, &state->n_inner);
	state->k = limit < 0 ? state->n_inner : Min(limit, state->n_inner);
	if (state->k > PG_INT32_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("KNN Join supports at most %d rows per outer row", PG_INT32_MAX)));
	INSTR_TIME_SET_CURRENT(read_done);
	INSTR_TIME_SUBTRACT(read_done, start);
	state->seconds_read = INSTR_TIME_GET_DOUBLE(read_done);

	if (state->k > 0)
		run_engine(state);
}

/* How many rows outer row i yields, and how many of them the engine gave. */
static void
start_outer_row(KnnJoinState *state)
{
	int64		query = state->query_of_outer[state->current_outer];
	int64		engine_rows = 0;

	if (query >= 0)
	{
		const int64 *neighbors = state->neighbors + query * state->engine_k;

		while (engine_rows < state->engine_k && neighbors[engine_rows] >= 0)
			engine_rows++;
		state->current_rows = Min(state->k, engine_rows + state->n_null_inner);
	}
	else
		state->current_rows = state->k;
	state->current_engine_rows = engine_rows;
	state->current_rank = 0;
}

/* Fills the scan slot with the next joined row; false at the end. */
static bool
next_joined_row(KnnJoinState *state, TupleTableSlot *scan_slot)
{
	int64		inner_row;
	bool		distance_null;
	double		distance = 0;

	if (state->k == 0)
		return false;
	for (;;)
	{
		if (state->current_outer >= state->n_outer)
			return false;
		if (state->current_rows < 0)
			start_outer_row(state);
		if (state->current_rank < state->current_rows)
			break;
		state->current_outer++;
		state->current_rows = -1;
	}

	if (state->query_of_outer[state->current_outer] < 0)
	{
		/* NULL query vector: every distance is NULL, scan order */
		inner_row = state->current_rank;
		distance_null = true;
	}
	else if (state->current_rank < state->current_engine_rows)
	{
		int64		slot = state->query_of_outer[state->current_outer] * state->engine_k +
			state->current_rank;

		inner_row = state->inner_of_target[state->neighbors[slot]];
		distance = state->distances[slot];
		distance_null = false;
	}
	else
	{
		/* after the engine's rows: inner rows whose vector is NULL */
		inner_row = state->null_inner[state->current_rank - state->current_engine_rows];
		distance_null = true;
	}
	state->current_rank++;

	ExecClearTuple(scan_slot);
	ExecStoreMinimalTuple(state->outer_rows[state->current_outer], state->outer_slot, false);
	ExecStoreMinimalTuple(state->inner_rows[inner_row], state->inner_slot, false);
	for (int i = 0; i < state->n_scan_columns; i++)
	{
		int			source = state->column_source[i];

		if (source > 0)
			scan_slot->tts_values[i] = slot_getattr(state->outer_slot, source,
													&scan_slot->tts_isnull[i]);
		else if (source < 0)
			scan_slot->tts_values[i] = slot_getattr(state->inner_slot, -source,
													&scan_slot->tts_isnull[i]);
		else
		{
			scan_slot->tts_values[i] = Float8GetDatum(distance);
			scan_slot->tts_isnull[i] = distance_null;
		}
	}
	ExecStoreVirtualTuple(scan_slot);
	return true;
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
	ExprState  *qual = state->join_filter;
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
		CHECK_FOR_INTERRUPTS();
		ResetExprContext(econtext);
		if (!next_joined_row(state, scan_slot))
			return NULL;
		econtext->ecxt_scantuple = scan_slot;
		if (qual == NULL || ExecQual(qual, econtext))
			return projection ? ExecProject(projection) : scan_slot;
		InstrCountFiltered1(node, 1);
	}
}

static void
forget_execution(KnnJoinState *state)
{
	state->computed = false;
	state->outer_rows = NULL;
	state->inner_rows = NULL;
	state->query_of_outer = NULL;
	state->inner_of_target = NULL;
	state->null_inner = NULL;
	state->neighbors = NULL;
	state->distances = NULL;
	state->n_outer = state->n_inner = state->n_null_inner = 0;
	state->k = 0;
	state->engine_k = 0;
	MemoryContextReset(state->join_cxt);
}

static void
knn_join_rescan(CustomScanState *node)
{
	KnnJoinState *state = (KnnJoinState *) node;
	ListCell   *lc;

	ExecClearTuple(state->outer_slot);
	ExecClearTuple(state->inner_slot);
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

	ExecClearTuple(state->outer_slot);
	ExecClearTuple(state->inner_slot);
	ExecClearTuple(node->ss.ss_ScanTupleSlot);
	ExecEndNode(state->outer_ps);
	ExecEndNode(state->inner_ps);
	MemoryContextDelete(state->join_cxt);
}

static void
knn_join_explain(CustomScanState *node, List *ancestors, ExplainState *es)
{
	KnnJoinState *state = (KnnJoinState *) node;
	CustomScan *cscan = (CustomScan *) node->ss.ps.plan;
	Node	   *limit = linitial(cscan->custom_exprs);

	if (IsA(limit, Const) && ((Const *) limit)->constisnull)
		ExplainPropertyText("K", "ALL", es);
	else if (IsA(limit, Const))
		ExplainPropertyInteger("K", NULL, DatumGetInt64(((Const *) limit)->constvalue), es);
	else
	{
		List	   *context = set_deparse_context_plan(es->deparse_cxt,
													   node->ss.ps.plan, ancestors);

		ExplainPropertyText("K", deparse_expression(limit, context, false, false), es);
	}
	ExplainPropertyText("Metric", knn_metric_name(state->metric), es);
	ExplainPropertyText("Engine", knn_device_name((KnnDevice) knn_gpu_device), es);

	if (list_length(cscan->custom_exprs) > 1)
	{
		List	   *context = set_deparse_context_plan(es->deparse_cxt,
													   node->ss.ps.plan, ancestors);
		Node	   *filter = (Node *) make_ands_explicit(list_copy_tail(cscan->custom_exprs, 1));

		ExplainPropertyText("Join Filter", deparse_expression(filter, context, true, false), es);
		if (es->analyze && node->ss.ps.instrument != NULL)
		{
			double		nloops = node->ss.ps.instrument->nloops;
			double		removed = node->ss.ps.instrument->nfiltered1;

			if (removed > 0 || es->format != EXPLAIN_FORMAT_TEXT)
				ExplainPropertyFloat("Rows Removed by Join Filter", NULL,
									 nloops > 0 ? removed / nloops : 0.0, 0, es);
		}
	}

	if (es->analyze && state->have_record)
		knn_stats_explain(&state->record, es);
}
