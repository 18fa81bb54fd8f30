/*
 * knn_join_explain.c -- the "KNN Join Function" custom scan
 * (knn_join_explain.h).
 *
 * The node has the Function Scan as its only child and returns the child's
 * slots as they are: the function, its arguments, its quals and LATERAL
 * parameters all stay the Function Scan's. knn_join materialises its
 * result on the child's first fetch of each scan, so the call finishes
 * while the node is inside that ExecProcNode(child): the node marks itself
 * as the collector for that time (restored on every exit, so nested nodes
 * nest).
 *
 * A sharded call (knn_shard.h) reports what its shards did; EXPLAIN
 * ANALYZE shows it. Plain EXPLAIN of a call whose arguments are constants
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
#include "utils/syscache.h"

#include "knn_join_explain.h"
#include "knn_shard.h"
#include "knn_subtransaction.h"

#define KNN_JOIN_FUNCTION_NAME "KNN Join Function"

typedef struct KnnJoinFunctionState
{
	CustomScanState css;
	KnnJoinRecord record;		/* of the last call that finished */
	int64		calls;			/* calls that reached the engine */
	bool		fetched;		/* since the last (re)scan: the call has run */
	KnnShardSummary *shards;	/* of the last sharded call, or NULL */
	MemoryContext context;		/* the node's: where shards lives */
} KnnJoinFunctionState;

static set_rel_pathlist_hook_type prev_rel_pathlist_hook = NULL;
static KnnJoinFunctionState *collector = NULL;

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

void
knn_join_explain_report(const KnnJoinRecord *record)
{
	if (collector == NULL)
		return;
	collector->record = *record;
	collector->calls++;
}

void
knn_join_explain_report_shards(const KnnShardSummary *summary)
{
	if (collector == NULL)
		return;
	collector->shards = knn_shard_summary_copy(summary, collector->context);
}

/* Is the function one of knn_join's forms or knn_range_join (by its C entry point)? */
static bool
is_knn_join(Oid funcid)
{
	FmgrInfo	info;
	HeapTuple	tuple = SearchSysCache1(PROCOID, ObjectIdGetDatum(funcid));
	bool		in_c;

	if (!HeapTupleIsValid(tuple))
		return false;
	/* Only C functions can be ours (a cheap test before the fmgr lookup). */
	in_c = ((Form_pg_proc) GETSTRUCT(tuple))->prolang == ClanguageId;
	ReleaseSysCache(tuple);
	if (!in_c)
		return false;
	fmgr_info(funcid, &info);
	return info.fn_addr == knn_join || info.fn_addr == knn_join_params ||
		info.fn_addr == knn_join_keyed || info.fn_addr == knn_range_join;
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

static void
begin_function_scan(CustomScanState *node, EState *estate, int eflags)
{
	CustomScan *cscan = (CustomScan *) node->ss.ps.plan;

	((KnnJoinFunctionState *) node)->context = CurrentMemoryContext;
	node->custom_ps = list_make1(ExecInitNode(linitial(cscan->custom_plans), estate, eflags));
	/* The child's slots are returned as they are: of no fixed kind. */
	node->ss.ps.resultopsfixed = false;
}

static TupleTableSlot *
exec_function_scan(CustomScanState *node)
{
	KnnJoinFunctionState *state = (KnnJoinFunctionState *) node;
	KnnJoinFunctionState *saved = collector;
	TupleTableSlot *slot;

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
	ExecEndNode(linitial(node->custom_ps));
}

static void
rescan_function_scan(CustomScanState *node)
{
	PlanState  *child = linitial(node->custom_ps);

	((KnnJoinFunctionState *) node)->fetched = false;
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
	if (state->calls == 0 && state->shards == NULL)
		return;
	if (state->calls > 1)
		ExplainPropertyInteger("Engine Calls", NULL, state->calls, es);
	if (state->calls > 0)
		knn_stats_explain(&state->record, es);
	knn_shard_explain(state->shards, es);
}

void
knn_join_explain_register(void)
{
	RegisterCustomScanMethods(&scan_methods);
	prev_rel_pathlist_hook = set_rel_pathlist_hook;
	set_rel_pathlist_hook = knn_join_rel_pathlist;
}
