/*
 * knn_join_function_scan.c -- the "KNN Join Function" custom scan
 * (knn_join_function_scan.h).
 *
 * The node has the Function Scan as its only child. For knn_join's forms
 * (one function, no ordinality; knn_gpu.direct_return on) the node calls
 * the function itself, with the child's arguments (LATERAL parameters
 * included), asks for the engine's arrays instead of a tuplestore (a
 * sharded call's merged lists: knn_join_call_direct) and returns their
 * rows through the child's quals and target list; the child is never
 * executed, but its instrumentation counts what it would have returned.
 * Otherwise (knn_range_join, or knn_gpu.direct_return off) the node
 * returns the child's slots as they are: knn_join materialises its result
 * on the child's first fetch of each scan. Either way the call finishes inside the node, which marks itself
 * as the collector for that time (restored on every exit, so nested nodes
 * nest).
 *
 * Each call that reaches the engine reports its record, and a sharded
 * call (knn_shard.h) what its shards did; EXPLAIN ANALYZE shows the sums
 * over the node's calls in the statement (knn_stats.h's KnnJoinTotals),
 * as PostgreSQL's figures cover every loop. Plain EXPLAIN of a call whose arguments are constants
 * asks knn_join which shards it would use (knn_join_describe: the texts are
 * prepared, the shards connected and checked, nothing is read or joined)
 * and shows each shard's remote SQL.
 *
 * knn_join's functions are recognised by their C entry point (fmgr), not
 * by name.
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/pg_language.h"
#include "catalog/pg_proc.h"
#include "commands/explain.h"
#include "executor/executor.h"
#include "nodes/extensible.h"
#include "optimizer/pathnode.h"
#include "optimizer/paths.h"
#include "miscadmin.h"
#include "utils/memutils.h"
#include "utils/syscache.h"
#include "utils/tuplestore.h"

#include "knn_join_function_scan.h"
#include "knn_settings.h"
#include "knn_shard.h"
#include "knn_subtransaction.h"

#define KNN_JOIN_FUNCTION_NAME "KNN Join Function"
/*
 * Rows filtered out between two looks at the interrupt flags (each fetch
 * looks once: ExecCustomScan).
 */
#define KNN_DIRECT_SLICE 4096

/*
 * The direct path (knn_join's forms, not knn_range_join): the node calls
 * the function itself and returns rows from the engine's arrays (or a
 * sharded call's merged lists), applying
 * the child's quals and target list as the Function Scan would; the child
 * is never executed, but its instrumentation counts the rows, so EXPLAIN
 * ANALYZE reads as before.
 */
typedef struct KnnDirectScan
{
	FuncExpr   *call;			/* the child's */
	Bitmapset  *funcparams;		/* the PARAM_EXEC ids its arguments use */
	List	   *args;			/* ExprState of each argument */
	FmgrInfo	flinfo;
	ExprState  *qual;			/* the child's quals, on function_slot */
	ProjectionInfo *projection; /* the child's target list, from function_slot */
	TupleTableSlot *function_slot;	/* virtual, of the function's columns */
	TupleTableSlot *store_slot; /* minimal, for rows of a tuplestore */
	TupleDesc	function_desc;
	MemoryContext call_context; /* the call and its result: reset when it runs again */
	ExprContext *call_econtext; /* the call's ReturnSetInfo's (per-query memory: call_context) */
	bool		called;			/* the result below is of the current parameters */
	bool		has_arrays;		/* else the rows are in store */
	KnnJoinDirect result;
	Tuplestorestate *store;
	int64		query;			/* the next row: query row and slot */
	int32		slot;
	bool		timing;			/* rows are being returned since return_start */
	instr_time	return_start;
} KnnDirectScan;

typedef struct KnnJoinFunctionState
{
	CustomScanState css;
	KnnJoinRecord record;		/* of the last call that reached the engine */
	KnnJoinTotals totals;		/* of every such call of the statement (EXPLAIN ANALYZE) */
	bool		fetched;		/* since the last (re)scan: the call has run */
	KnnShardSummary *shards;	/* every sharded call's, summed; or NULL */
	MemoryContext context;		/* the node's: where shards lives */
	KnnDirectScan *direct;		/* NULL: the child's rows are passed on */
} KnnJoinFunctionState;

static set_rel_pathlist_hook_type prev_rel_pathlist_hook = NULL;
static KnnJoinFunctionState *collector = NULL;
/* The node of the knn_join call running now: its reports go there (knn_join_explain_enter). */
static KnnJoinFunctionState *reporting = NULL;

static Plan *plan_function_path(PlannerInfo *root, RelOptInfo *rel, CustomPath *best_path,
								List *tlist, List *clauses, List *custom_plans);
static Node *create_function_state(CustomScan *cscan);
static void begin_function_scan(CustomScanState *node, EState *estate, int eflags);
static TupleTableSlot *exec_function_scan(CustomScanState *node);
static void end_function_scan(CustomScanState *node);
static void rescan_function_scan(CustomScanState *node);
static void explain_function_scan(CustomScanState *node, List *ancestors, ExplainState *es);

static const CustomPathMethods path_methods = {
	.CustomName = KNN_JOIN_FUNCTION_NAME,
	.PlanCustomPath = plan_function_path,
};

static const CustomScanMethods scan_methods = {
	.CustomName = KNN_JOIN_FUNCTION_NAME,
	.CreateCustomScanState = create_function_state,
};

static const CustomExecMethods exec_methods = {
	.CustomName = KNN_JOIN_FUNCTION_NAME,
	.BeginCustomScan = begin_function_scan,
	.ExecCustomScan = exec_function_scan,
	.EndCustomScan = end_function_scan,
	.ReScanCustomScan = rescan_function_scan,
	.ExplainCustomScan = explain_function_scan,
};

void *
knn_join_explain_enter(void)
{
	KnnJoinFunctionState *outer = reporting;

	/*
	 * The call takes the collector: a knn_join that its texts call outside
	 * a node of its own (a target list, WITH ORDINALITY) is not this call.
	 */
	reporting = collector;
	collector = NULL;
	return outer;
}

void
knn_join_explain_leave(void *outer)
{
	collector = reporting;
	reporting = (KnnJoinFunctionState *) outer;
}

void
knn_join_explain_report(const KnnJoinRecord *record)
{
	if (reporting == NULL)
		return;
	reporting->record = *record;
	knn_stats_totals_add(&reporting->totals, record);
}

void
knn_join_explain_report_shards(const KnnShardSummary *summary)
{
	if (reporting == NULL)
		return;
	reporting->shards = knn_shard_summary_add(reporting->shards, summary, reporting->context);
}

/* The function's C entry point, or NULL when it is not a C function. */
static PGFunction
c_entry_point(Oid funcid)
{
	FmgrInfo	info;
	HeapTuple	tuple = SearchSysCache1(PROCOID, ObjectIdGetDatum(funcid));
	bool		in_c;

	if (!HeapTupleIsValid(tuple))
		return NULL;
	/* Only C functions can be ours (a cheap test before the fmgr lookup). */
	in_c = ((Form_pg_proc) GETSTRUCT(tuple))->prolang == ClanguageId;
	ReleaseSysCache(tuple);
	if (!in_c)
		return NULL;
	fmgr_info(funcid, &info);
	return info.fn_addr;
}

/* Is the function one of knn_join's forms (whose rows the node can return itself)? */
static bool
is_knn_join_form(PGFunction entry)
{
	return entry == knn_join || entry == knn_join_params || entry == knn_join_keyed;
}

/* Is the function one of knn_join's forms or knn_range_join (by its C entry point)? */
static bool
is_knn_join(Oid funcid)
{
	PGFunction	entry = c_entry_point(funcid);

	return entry != NULL && (is_knn_join_form(entry) || entry == knn_range_join);
}

static void
knn_join_rel_pathlist(PlannerInfo *root, RelOptInfo *rel, Index rti, RangeTblEntry *rte)
{
	RangeTblFunction *function;
	List	   *paths = NIL;
	ListCell   *lc;

	if (prev_rel_pathlist_hook)
		prev_rel_pathlist_hook(root, rel, rti, rte);
	if (rte->rtekind != RTE_FUNCTION || rte->funcordinality ||
		list_length(rte->functions) != 1 || rel->pathlist == NIL)
		return;
	function = linitial_node(RangeTblFunction, rte->functions);
	if (!IsA(function->funcexpr, FuncExpr) ||
		!is_knn_join(((FuncExpr *) function->funcexpr)->funcid))
		return;

	/* Each Function Scan path gets its wrapper, of the same cost and parameters. */
	foreach(lc, rel->pathlist)
	{
		Path	   *child = (Path *) lfirst(lc);
		CustomPath *path;

		if (child->pathtype != T_FunctionScan)
			return;				/* someone else's: leave the list alone */
		path = makeNode(CustomPath);
		path->path.pathtype = T_CustomScan;
		path->path.parent = rel;
		path->path.pathtarget = child->pathtarget;
		path->path.param_info = child->param_info;
		path->path.parallel_aware = false;
		path->path.parallel_safe = child->parallel_safe;
		path->path.parallel_workers = 0;
		path->path.rows = child->rows;
		path->path.startup_cost = child->startup_cost;
		path->path.total_cost = child->total_cost;
		path->path.pathkeys = child->pathkeys;
		path->custom_paths = list_make1(child);
		path->methods = &path_methods;
		paths = lappend(paths, path);
	}
	rel->pathlist = paths;
}

static Plan *
plan_function_path(PlannerInfo *root, RelOptInfo *rel, CustomPath *best_path,
				   List *tlist, List *clauses, List *custom_plans)
{
	CustomScan *scan = makeNode(CustomScan);
	Plan	   *child = linitial(custom_plans);

	/*
	 * The child, planned from its own path, already applies the quals.
	 * Both nodes return the same columns: the child computes any Var of
	 * its function, and this node passes its slots on.
	 */
	child->targetlist = copyObject(tlist);
	scan->scan.plan.targetlist = tlist;
	scan->scan.plan.qual = NIL;
	scan->scan.scanrelid = 0;
	scan->custom_scan_tlist = copyObject(tlist);
	scan->custom_plans = custom_plans;
	scan->flags = best_path->flags;
	scan->methods = &scan_methods;
	return &scan->scan.plan;
}

static Node *
create_function_state(CustomScan *cscan)
{
	KnnJoinFunctionState *state = palloc0(sizeof(KnnJoinFunctionState));

	NodeSetTag(state, T_CustomScanState);
	state->css.methods = &exec_methods;
	return (Node *) state;
}

/*
 * The direct path's state, when the child calls one of knn_join's forms
 * (no ordinality, one function, knn_join's four columns); else NULL.
 */
static KnnDirectScan *
begin_direct(KnnJoinFunctionState *state, EState *estate)
{
	PlanState  *ps = &state->css.ss.ps;
	FunctionScanState *child = linitial(state->css.custom_ps);
	FunctionScan *scan = (FunctionScan *) child->ss.ps.plan;
	RangeTblFunction *function;
	KnnDirectScan *direct;
	TupleDesc	saved_desc = ps->scandesc;
	const TupleTableSlotOps *saved_ops = ps->scanops;
	bool		saved_fixed = ps->scanopsfixed;
	bool		saved_set = ps->scanopsset;
	TupleTableSlot *result_slot;

	if (!IsA(scan, FunctionScan) || scan->funcordinality || list_length(scan->functions) != 1)
		return NULL;
	function = linitial_node(RangeTblFunction, scan->functions);
	if (!IsA(function->funcexpr, FuncExpr) ||
		!is_knn_join_form(c_entry_point(((FuncExpr *) function->funcexpr)->funcid)) ||
		child->ss.ss_ScanTupleSlot->tts_tupleDescriptor->natts != 4)
		return NULL;

	direct = palloc0(sizeof(KnnDirectScan));
	direct->call = (FuncExpr *) function->funcexpr;
	direct->funcparams = function->funcparams;
	fmgr_info(direct->call->funcid, &direct->flinfo);
	fmgr_info_set_expr((Node *) direct->call, &direct->flinfo);
	direct->args = ExecInitExprList(direct->call->args, ps);
	direct->function_desc = child->ss.ss_ScanTupleSlot->tts_tupleDescriptor;
	direct->function_slot = ExecInitExtraTupleSlot(estate, direct->function_desc, &TTSOpsVirtual);
	direct->store_slot = ExecInitExtraTupleSlot(estate, direct->function_desc,
												&TTSOpsMinimalTuple);
	result_slot = ExecInitExtraTupleSlot(estate, ExecTypeFromTL(scan->scan.plan.targetlist),
										 &TTSOpsVirtual);

	/* The child's quals and target list, compiled for rows of function_slot. */
	ps->scandesc = direct->function_desc;
	ps->scanops = &TTSOpsVirtual;
	ps->scanopsfixed = true;
	ps->scanopsset = true;
	direct->qual = ExecInitQual(scan->scan.plan.qual, ps);
	direct->projection = ExecBuildProjectionInfo(scan->scan.plan.targetlist, ps->ps_ExprContext,
												 result_slot, ps, direct->function_desc);
	ps->scandesc = saved_desc;
	ps->scanops = saved_ops;
	ps->scanopsfixed = saved_fixed;
	ps->scanopsset = saved_set;

	direct->call_context = AllocSetContextCreate(CurrentMemoryContext, "knn_join direct result",
												 ALLOCSET_DEFAULT_SIZES);
	direct->call_econtext = CreateExprContext(estate);
	/* what the call leaves in "per-query" memory goes with its result */
	direct->call_econtext->ecxt_per_query_memory = direct->call_context;
	return direct;
}

static void
begin_function_scan(CustomScanState *node, EState *estate, int eflags)
{
	CustomScan *cscan = (CustomScan *) node->ss.ps.plan;
	KnnJoinFunctionState *state = (KnnJoinFunctionState *) node;

	state->context = CurrentMemoryContext;
	node->custom_ps = list_make1(ExecInitNode(linitial(cscan->custom_plans), estate, eflags));
	/* The child's slots are returned as they are: of no fixed kind. */
	node->ss.ps.resultopsfixed = false;
	if (knn_gpu_direct_return)
		state->direct = begin_direct(state, estate);
}

/* The end of the rows of a call: their return time goes into its record. */
static void
finish_return(KnnJoinFunctionState *state)
{
	KnnDirectScan *direct = state->direct;
	double		seconds;

	if (!direct->timing)
		return;
	direct->timing = false;
	seconds = knn_seconds_since(direct->return_start);
	knn_stats_set_return(&state->record, seconds);
	state->totals.sum.seconds_return += seconds;
}

/* Forgets the call's result: the next fetch calls again. */
static void
drop_result(KnnDirectScan *direct)
{
	if (direct->store != NULL)
		tuplestore_end(direct->store);	/* its temporary files too */
	direct->store = NULL;
	direct->has_arrays = false;
	direct->called = false;
	MemoryContextReset(direct->call_context);
}

/*
 * Calls the function with the arguments evaluated now (LATERAL values
 * included), as the Function Scan would: a strict form given a NULL
 * returns no row.
 */
static void
call_direct(KnnJoinFunctionState *state)
{
	KnnDirectScan *direct = state->direct;
	ExprContext *econtext = state->css.ss.ps.ps_ExprContext;
	KnnJoinFunctionState *saved = collector;
	ReturnSetInfo rsinfo = {T_ReturnSetInfo};
	MemoryContext old_context;
	ListCell   *lc;
	int			n = 0;
	bool		null_argument = false;
	LOCAL_FCINFO(fcinfo, FUNC_MAX_ARGS);

	drop_result(direct);
	direct->called = true;
	direct->query = 0;
	direct->slot = 0;
	old_context = MemoryContextSwitchTo(direct->call_context);
	InitFunctionCallInfoData(*fcinfo, &direct->flinfo, list_length(direct->args),
							 direct->call->inputcollid, NULL, (Node *) &rsinfo);
	ResetExprContext(econtext);
	foreach(lc, direct->args)
	{
		fcinfo->args[n].value = ExecEvalExpr(lfirst(lc), econtext, &fcinfo->args[n].isnull);
		null_argument |= fcinfo->args[n].isnull;
		n++;
	}
	rsinfo.econtext = direct->call_econtext;
	rsinfo.expectedDesc = direct->function_desc;
	rsinfo.allowedModes = SFRM_Materialize;
	if (!(direct->flinfo.fn_strict && null_argument))
	{
		collector = state;
		PG_TRY();
		{
			direct->has_arrays = knn_join_call_direct(fcinfo, &direct->result);
		}
		PG_FINALLY();
		{
			collector = saved;
		}
		PG_END_TRY();
		if (direct->has_arrays)
		{
			if (rsinfo.setResult != NULL)
				tuplestore_end(rsinfo.setResult);	/* empty */
			/* the engine's record measures the return; a sharded call's summary, its merge */
			direct->timing = direct->result.neighbors != NULL;
			if (direct->timing)
				INSTR_TIME_SET_CURRENT(direct->return_start);
		}
		else
			direct->store = rsinfo.setResult;	/* no arrays: the rows, if any, as a tuplestore */
	}
	MemoryContextSwitchTo(old_context);
}

/* The call's next row into slot (virtual, the function's columns); false after the last. */
static bool
next_row(KnnDirectScan *direct, TupleTableSlot *slot)
{
	const KnnJoinDirect *result = &direct->result;

	if (!direct->has_arrays)
	{
		if (direct->store == NULL ||
			!tuplestore_gettupleslot(direct->store, true, false, direct->store_slot))
			return false;
		ExecCopySlot(slot, direct->store_slot);
		return true;
	}
	while (direct->query < result->n_queries)
	{
		int64		q = direct->query;
		int64		at;				/* the row's distance */
		int64		t;				/* its target row, -1 past the query's last */

		if (result->offsets != NULL)
		{
			/* a sharded call's merged lists: a target id per row */
			at = result->offsets[q] + direct->slot;
			t = at < result->offsets[q + 1] ? at : -1;
		}
		else
		{
			at = q * result->slots + direct->slot;
			t = direct->slot < result->slots ? result->neighbors[at] : -1;
			knn_prefetch_target(result->target_ids, result->target_keys, result->neighbors, at,
								result->n_queries * result->slots);
		}
		if (t < 0)
		{
			direct->query++;
			direct->slot = 0;
			continue;
		}
		ExecClearTuple(slot);
		if (result->query_keys != NULL)
		{
			/* keyed: ids are ranks of the keys (knn_key_order.h) */
			slot->tts_values[0] = result->query_keys[result->query_ids[q]];
			slot->tts_values[1] = result->target_keys[result->target_ids[t]];
		}
		else
		{
			slot->tts_values[0] = Int64GetDatum(result->query_ids[q]);
			slot->tts_values[1] = Int64GetDatum(result->target_ids[t]);
		}
		slot->tts_values[2] = Int32GetDatum(direct->slot + 1);
		slot->tts_values[3] = Float8GetDatum(result->distances[at]);
		memset(slot->tts_isnull, 0, 4 * sizeof(bool));
		ExecStoreVirtualTuple(slot);
		direct->slot++;
		return true;
	}
	return false;
}

/*
 * The next row of the child's quals and target list, as ExecScan would
 * give it; the child's instrumentation counts it (EXPLAIN ANALYZE).
 */
static TupleTableSlot *
exec_direct(KnnJoinFunctionState *state)
{
	KnnDirectScan *direct = state->direct;
	PlanState  *child = linitial(state->css.custom_ps);
	ExprContext *econtext = state->css.ss.ps.ps_ExprContext;
	TupleTableSlot *slot = NULL;
	uint32		looked = 0;

	if (child->instrument)
		InstrStartNode(child->instrument);
	if (!direct->called)
		call_direct(state);
	for (;;)
	{
		if (++looked % KNN_DIRECT_SLICE == 0)
			CHECK_FOR_INTERRUPTS();
		if (!next_row(direct, direct->function_slot))
		{
			finish_return(state);
			break;
		}
		ResetExprContext(econtext);
		econtext->ecxt_scantuple = direct->function_slot;
		if (direct->qual != NULL && !ExecQual(direct->qual, econtext))
		{
			InstrCountFiltered1(child, 1);
			continue;
		}
		slot = ExecProject(direct->projection);
		break;
	}
	if (child->instrument)
		InstrStopNode(child->instrument, slot != NULL ? 1.0 : 0.0);
	return slot;
}

static TupleTableSlot *
exec_function_scan(CustomScanState *node)
{
	KnnJoinFunctionState *state = (KnnJoinFunctionState *) node;
	KnnJoinFunctionState *saved = collector;
	TupleTableSlot *slot;

	if (state->direct != NULL)
	{
		slot = exec_direct(state);
		if (slot == NULL || node->ss.ps.ps_ProjInfo == NULL)
			return slot;
		node->ss.ps.ps_ExprContext->ecxt_scantuple = slot;
		return ExecProject(node->ss.ps.ps_ProjInfo);
	}

	/* The call runs on the first fetch of each scan; later ones read its rows. */
	if (state->fetched)
		slot = ExecProcNode(linitial(node->custom_ps));
	else
	{
		collector = state;
		PG_TRY();
		{
			slot = ExecProcNode(linitial(node->custom_ps));
		}
		PG_FINALLY();
		{
			collector = saved;
		}
		PG_END_TRY();
		state->fetched = true;
	}
	if (TupIsNull(slot) || node->ss.ps.ps_ProjInfo == NULL)
		return slot;
	node->ss.ps.ps_ExprContext->ecxt_scantuple = slot;
	return ExecProject(node->ss.ps.ps_ProjInfo);
}

static void
end_function_scan(CustomScanState *node)
{
	KnnJoinFunctionState *state = (KnnJoinFunctionState *) node;

	if (state->direct != NULL)
	{
		finish_return(state);
		drop_result(state->direct);
	}
	ExecEndNode(linitial(node->custom_ps));
}

static void
rescan_function_scan(CustomScanState *node)
{
	KnnJoinFunctionState *state = (KnnJoinFunctionState *) node;
	PlanState  *child = linitial(node->custom_ps);

	if (state->direct != NULL)
	{
		/*
		 * Changed parameters of the call's arguments call again; otherwise
		 * (none changed, or only those of the quals and target list) the
		 * same rows are read again, as the Function Scan rereads its
		 * tuplestore. The child is rescanned for its instrumentation's
		 * loops.
		 */
		finish_return(state);
		if (bms_overlap(node->ss.ps.chgParam, state->direct->funcparams))
			drop_result(state->direct);
		else
		{
			state->direct->query = 0;
			state->direct->slot = 0;
			if (state->direct->store != NULL)
				tuplestore_rescan(state->direct->store);
		}
		if (node->ss.ps.chgParam != NULL)
			UpdateChangedParamSet(child, node->ss.ps.chgParam);
		ExecReScan(child);
		return;
	}
	state->fetched = false;
	/* Changed LATERAL parameters reach the child, which re-runs the call. */
	if (node->ss.ps.chgParam != NULL)
		UpdateChangedParamSet(child, node->ss.ps.chgParam);
	if (child->chgParam == NULL)
		ExecReScan(child);
}

static void
describe_step(void *arg)
{
	knn_join_describe((FuncExpr *) arg);
}

/*
 * Plain EXPLAIN: the shards the call would use, when its arguments are
 * constants (a call of LATERAL values is known only when it runs). A call
 * that cannot be described (a text that does not prepare, a shard that is
 * down) says so in one line: EXPLAIN itself does not fail.
 */
static void
describe_shards(KnnJoinFunctionState *state, ExplainState *es)
{
	FunctionScan *scan = (FunctionScan *) linitial(((CustomScan *) state->css.ss.ps.plan)->custom_plans);
	RangeTblFunction *function;
	FuncExpr   *call;
	ListCell   *lc;
	KnnJoinFunctionState *saved = collector;
	char	   *message;

	if (!IsA(scan, FunctionScan) || list_length(scan->functions) != 1)
		return;
	function = linitial_node(RangeTblFunction, scan->functions);
	if (!IsA(function->funcexpr, FuncExpr))
		return;
	call = (FuncExpr *) function->funcexpr;
	foreach(lc, call->args)
		if (!IsA(lfirst(lc), Const))
			return;

	collector = state;
	PG_TRY();
	{
		if (!knn_try_in_subtransaction(describe_step, call, &message))
			ExplainPropertyText("Shards", psprintf("not known (%s)", message), es);
	}
	PG_FINALLY();
	{
		collector = saved;
	}
	PG_END_TRY();
}

static void
explain_function_scan(CustomScanState *node, List *ancestors, ExplainState *es)
{
	KnnJoinFunctionState *state = (KnnJoinFunctionState *) node;

	if (!es->analyze)
	{
		describe_shards(state, es);
		knn_shard_explain(state->shards, es);
		return;
	}
	knn_stats_explain(&state->totals, es);
	knn_shard_explain(state->shards, es);
}

void
knn_join_function_scan_register(void)
{
	RegisterCustomScanMethods(&scan_methods);
	prev_rel_pathlist_hook = set_rel_pathlist_hook;
	set_rel_pathlist_hook = knn_join_rel_pathlist;
}
