/*
 * knn_scan_plan.c -- turning a KnnJoinPath into the KNN Join CustomScan.
 *
 * The node has two children: the outer side's plan (from custom_paths) and
 * a plain scan plan of the inner relation. The inner plan is the user's
 * subquery planned again without its ORDER BY and LIMIT and with a select
 * list of what the join needs:
 *
 *     SELECT t.v, <other columns of n used above> FROM items t WHERE ...
 *
 * Planned by subquery_planner, it is an ordinary PostgreSQL plan of the
 * relation: visibility, row-level security, permissions, WHERE filters,
 * partitions and parallel scans behave exactly as in the user's plan.
 *
 * Why not plan it as a path of this query: the relation exists only inside
 * the subquery (its own range table). A subquery's plan gets into the final
 * plan through a SubqueryScan of the subquery RTE, which setrefs.c flattens
 * using that RTE's RelOptInfo->subroot. So we wrap the new plan in a
 * SubqueryScan of n and point n's subroot at the new planning: PostgreSQL's
 * own nested-loop plan of n is not in the final plan (ours is), so nothing
 * else uses the old subroot. The SubqueryScan passes its child's columns
 * through unchanged, so setrefs.c removes it and EXPLAIN shows the scan.
 */
#include "postgres.h"

#include "nodes/makefuncs.h"
#include "nodes/nodeFuncs.h"
#include "optimizer/optimizer.h"
#include "optimizer/pathnode.h"
#include "optimizer/planmain.h"
#include "optimizer/planner.h"
#include "optimizer/tlist.h"
#include "parser/parsetree.h"

#include "knn_scan.h"

static const CustomScanMethods knn_join_scan_methods = {
	.CustomName = KNN_JOIN_NAME,
	.CreateCustomScanState = knn_join_create_scan_state,
};

/*
 * Plans "SELECT <vector>, <needed columns> FROM <relation> WHERE ..." from
 * the user's subquery. Column 1 is the target vector; column 2 + i is the
 * i-th of kp->needed_columns.
 */
static Plan *
plan_inner_relation(PlannerInfo *root, KnnJoinPath *kp)
{
	RelOptInfo *subquery_rel = kp->subquery_rel;
	RangeTblEntry *rte = planner_rt_fetch(subquery_rel->relid, root);
	Query	   *scan_query = copyObject(rte->subquery);
	List	   *tlist = NIL;
	AttrNumber	resno = 1;
	PlannerInfo *subroot;
	RelOptInfo *final_rel;
	Plan	   *plan;
	SubqueryScan *wrapper;
	ListCell   *lc;

	tlist = lappend(tlist, makeTargetEntry((Expr *) copyObject(kp->target_vector),
										   resno++, pstrdup("vector"), false));
	foreach(lc, kp->needed_columns)
	{
		TargetEntry *tle = get_tle_by_resno(scan_query->targetList, lfirst_int(lc));
		TargetEntry *copy = flatCopyTargetEntry(tle);

		copy->resno = resno++;
		copy->ressortgroupref = 0;
		copy->resjunk = false;
		tlist = lappend(tlist, copy);
	}
	scan_query->targetList = tlist;
	scan_query->sortClause = NIL;
	scan_query->limitCount = NULL;

	/* Every row is wanted: tuple_fraction 0. */
	subroot = subquery_planner(root->glob, scan_query, root, false, 0.0);
	final_rel = fetch_upper_rel(subroot, UPPERREL_FINAL, NULL);
	plan = create_plan(subroot, final_rel->cheapest_total_path);

	/* n is now planned as this subroot (see the comment at the top). */
	subquery_rel->subroot = subroot;
	subquery_rel->subplan_params = NIL;

	wrapper = makeNode(SubqueryScan);
	wrapper->scan.scanrelid = subquery_rel->relid;
	wrapper->subplan = plan;
	wrapper->scanstatus = SUBQUERY_SCAN_UNKNOWN;
	foreach(lc, plan->targetlist)
	{
		TargetEntry *tle = lfirst_node(TargetEntry, lc);

		wrapper->scan.plan.targetlist =
			lappend(wrapper->scan.plan.targetlist,
					makeTargetEntry((Expr *) makeVarFromTargetEntry(subquery_rel->relid, tle),
									tle->resno, tle->resname, false));
	}
	wrapper->scan.plan.startup_cost = plan->startup_cost;
	wrapper->scan.plan.total_cost = plan->total_cost;
	wrapper->scan.plan.plan_rows = plan->plan_rows;
	wrapper->scan.plan.plan_width = plan->plan_width;
	wrapper->scan.plan.parallel_aware = false;
	wrapper->scan.plan.parallel_safe = plan->parallel_safe;
	return (Plan *) wrapper;
}

/* The column of the outer plan's rows that holds expr; ERROR if none. */
static AttrNumber
outer_column(Plan *outer_plan, Expr *expr)
{
	TargetEntry *tle = tlist_member(expr, outer_plan->targetlist);

	if (tle == NULL)
		elog(ERROR, "KNN Join: outer plan does not provide a needed column");
	return tle->resno;
}

/* The column of the inner plan's rows that holds subquery column attno. */
static AttrNumber
inner_column(KnnJoinPath *kp, AttrNumber attno)
{
	ListCell   *lc;

	foreach(lc, kp->needed_columns)
		if (lfirst_int(lc) == attno)
			return 2 + foreach_current_index(lc);
	elog(ERROR, "KNN Join: subquery column %d was not planned", attno);
	return 0;					/* not reached */
}

static Plan *
knn_join_plan_path(PlannerInfo *root, RelOptInfo *rel, CustomPath *best_path,
				   List *tlist, List *clauses, List *custom_plans)
{
	KnnJoinPath *kp = (KnnJoinPath *) best_path;
	Plan	   *outer_plan = linitial(custom_plans);
	Plan	   *inner_plan = plan_inner_relation(root, kp);
	Index		subquery_relid = kp->subquery_rel->relid;
	CustomScan *cscan = makeNode(CustomScan);
	List	   *quals = NIL;
	List	   *scan_tlist;
	List	   *sources = NIL;
	ListCell   *lc;

	/* Checked on each joined row (clauses is empty for a join rel). */
	foreach(lc, list_concat(list_copy(clauses), kp->join_clauses))
		quals = lappend(quals, lfirst_node(RestrictInfo, lc)->clause);

	/*
	 * The scan tuple: every Var of the join's output and the quals. Each
	 * comes from the outer rows, the inner rows, or is the distance. (The
	 * path's target, not tlist: with CUSTOMPATH_SUPPORT_PROJECTION a
	 * projection above may pass no tlist and set its own expressions of
	 * these Vars.)
	 */
	scan_tlist = add_to_flat_tlist(NIL, pull_var_clause((Node *) best_path->path.pathtarget->exprs, 0));
	scan_tlist = add_to_flat_tlist(scan_tlist, pull_var_clause((Node *) tlist, 0));
	scan_tlist = add_to_flat_tlist(scan_tlist, pull_var_clause((Node *) quals, 0));
	foreach(lc, scan_tlist)
	{
		Var		   *var = castNode(Var, lfirst_node(TargetEntry, lc)->expr);
		int			source;

		if (var->varno != subquery_relid)
			source = outer_column(outer_plan, (Expr *) var);
		else if (list_member_int(kp->distance_columns, var->varattno))
			source = 0;
		else
			source = -inner_column(kp, var->varattno);
		sources = lappend_int(sources, source);
	}

	/*
	 * The quals go into custom_exprs rather than plan.qual, so that EXPLAIN
	 * can show them as a "Join Filter" with table names.
	 */
	cscan->scan.plan.targetlist = tlist;
	cscan->scan.plan.qual = NIL;
	cscan->scan.scanrelid = 0;
	cscan->flags = best_path->flags;
	cscan->custom_plans = list_make2(outer_plan, inner_plan);
	cscan->custom_exprs = lcons(copyObject(kp->limit), quals);
	cscan->custom_private = list_make5(makeInteger(kp->metric),
									   makeInteger(outer_column(outer_plan,
																(Expr *) kp->query_vector)),
									   makeInteger(1),
									   makeInteger(kp->target_is_left ? 1 : 0),
									   sources);
	cscan->custom_scan_tlist = scan_tlist;
	cscan->methods = &knn_join_scan_methods;
	return &cscan->scan.plan;
}

const CustomPathMethods knn_join_path_methods = {
	.CustomName = KNN_JOIN_NAME,
	.PlanCustomPath = knn_join_plan_path,
};

void
knn_scan_register_plan(void)
{
	RegisterCustomScanMethods(&knn_join_scan_methods);
}
