/*
 * knn_scan_plan.c -- turning a KnnJoinPath into the KNN Join CustomScan.
 *
 * The node has two children: the outer side's plan (from custom_paths) and
 * a plain scan plan of the inner relation. The inner plan is the user's
 * subquery planned again without its LIMIT, OFFSET, distance ordering,
 * self-exclusion and group equalities, and with a select list of what the
 * join needs:
 *
 *     SELECT t.v, <other columns of n used above>, [t.id,] [t.g, ...]
 *     FROM items t WHERE <the other conditions> [ORDER BY <tie keys>]
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

#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "nodes/nodeFuncs.h"
#include "optimizer/optimizer.h"
#include "optimizer/pathnode.h"
#include "optimizer/planmain.h"
#include "optimizer/plancat.h"
#include "optimizer/planner.h"
#include "optimizer/restrictinfo.h"
#include "optimizer/tlist.h"
#include "parser/parsetree.h"
#include "rewrite/rewriteManip.h"
#include "lib/stringinfo.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/ruleutils.h"

#include "knn_scan.h"

static AttrNumber outer_column(Plan *outer_plan, Expr *expr);
static void after_exclusion_private(PlannerInfo *root, KnnJoinPath *kp, CustomScan *cscan);

static const CustomScanMethods knn_join_scan_methods = {
	.CustomName = KNN_JOIN_NAME,
	.CreateCustomScanState = knn_join_create_scan_state,
};

/*
 * The relation's columns that the conditions evaluated after the
 * self-exclusion read (KnnJoinPath's deferred_clauses): Vars, each once.
 */
static List *
after_exclusion_columns(KnnJoinPath *kp)
{
	List	   *columns = NIL;
	ListCell   *lc;

	foreach(lc, pull_var_clause((Node *) kp->deferred_clauses, 0))
		columns = list_append_unique(columns, lfirst(lc));
	return columns;
}

/* The first column of the inner rows after the ORDER BY keys after the distance. */
static AttrNumber
first_after_exclusion_column(KnnJoinPath *kp)
{
	return 2 + list_length(kp->needed_columns) + (kp->exclude_target != NULL ? 1 : 0) +
		list_length(kp->group_targets) + list_length(kp->tie_order);
}

/*
 * The scan query's select list: column 1 is the target vector, column 2 + i
 * the i-th of kp->needed_columns, then the self-exclusion key (if any),
 * then the group keys (group_column), then the ORDER BY keys after the
 * distance (if any), then the columns the conditions evaluated after the
 * self-exclusion read (after_exclusion_columns).
 */
static List *
inner_select_list(KnnJoinPath *kp, List *subquery_tlist)
{
	List	   *tlist = NIL;
	AttrNumber	resno = 1;
	ListCell   *lc;

	tlist = lappend(tlist, makeTargetEntry((Expr *) copyObject(kp->target_vector),
										   resno++, pstrdup("vector"), false));
	foreach(lc, kp->needed_columns)
	{
		TargetEntry *copy = flatCopyTargetEntry(get_tle_by_resno(subquery_tlist,
																 lfirst_int(lc)));

		copy->resno = resno++;
		copy->ressortgroupref = 0;
		copy->resjunk = false;
		tlist = lappend(tlist, copy);
	}
	if (kp->exclude_target != NULL)
		tlist = lappend(tlist, makeTargetEntry((Expr *) copyObject(kp->exclude_target),
											   resno++, pstrdup("key"), false));
	foreach(lc, kp->group_targets)
		tlist = lappend(tlist, makeTargetEntry((Expr *) copyObject(lfirst(lc)),
											   resno++, pstrdup("group"), false));
	foreach(lc, kp->tie_order)
	{
		TargetEntry *copy = flatCopyTargetEntry(get_sortgroupclause_tle(lfirst(lc),
																		subquery_tlist));

		copy->resno = resno++;
		copy->resjunk = false;
		tlist = lappend(tlist, copy);
	}
	foreach(lc, after_exclusion_columns(kp))
		tlist = lappend(tlist, makeTargetEntry((Expr *) copyObject(lfirst(lc)),
											   resno++, pstrdup("checked"), false));
	return tlist;
}

/*
 * The subquery's WHERE without the self-exclusion, the group equalities
 * and the radius (they refer to the outer row), and the conditions the
 * node evaluates after the self-exclusion (deferred_quals).
 */
static Node *
inner_where(KnnJoinPath *kp, Node *quals)
{
	List	   *conjuncts;
	ListCell   *lc;

	if (kp->exclude_qual == NULL && kp->group_quals == NIL && kp->radius_qual == NULL)
		return quals;
	conjuncts = make_ands_implicit((Expr *) quals);
	if (kp->exclude_qual != NULL)
		conjuncts = list_delete(conjuncts, kp->exclude_qual);
	if (kp->radius_qual != NULL)
		conjuncts = list_delete(conjuncts, kp->radius_qual);
	foreach(lc, kp->group_quals)
		conjuncts = list_delete(conjuncts, lfirst(lc));
	foreach(lc, kp->deferred_quals)
		conjuncts = list_delete(conjuncts, lfirst(lc));
	return conjuncts == NIL ? NULL : (Node *) make_ands_explicit(conjuncts);
}

/*
 * While a KNN Join's inner scan is planned (plan_inner_relation), its
 * relations have no approximate index (pgvector's hnsw or ivfflat): such an
 * index answers an ORDER BY on a distance (a tie key such as t.w <-> '[0,0]')
 * with only some of the rows, and the engine must see every row.
 */
static get_relation_info_hook_type prev_get_relation_info_hook = NULL;
static int	planning_inner_scans = 0;

static void
without_approximate_indexes(PlannerInfo *root, Oid relation, bool inhparent, RelOptInfo *rel)
{
	ListCell   *lc;

	if (prev_get_relation_info_hook)
		prev_get_relation_info_hook(root, relation, inhparent, rel);
	if (planning_inner_scans == 0)
		return;
	foreach(lc, rel->indexlist)
	{
		IndexOptInfo *index = lfirst_node(IndexOptInfo, lc);

		if (knn_is_approximate_index_am(index->relam))
			rel->indexlist = foreach_delete_current(rel->indexlist, lc);
	}
}

/*
 * Plans "SELECT <vector>, <needed columns> FROM <relation> WHERE ...
 * [ORDER BY <tie keys>]" from the user's subquery (inner_select_list).
 */
static Plan *
plan_inner_relation(PlannerInfo *root, KnnJoinPath *kp)
{
	RelOptInfo *subquery_rel = kp->subquery_rel;
	RangeTblEntry *rte = planner_rt_fetch(subquery_rel->relid, root);
	Query	   *scan_query = copyObject(rte->subquery);
	PlannerInfo *subroot;
	RelOptInfo *final_rel;
	Plan	   *plan;
	SubqueryScan *wrapper;
	ListCell   *lc;

	scan_query->targetList = inner_select_list(kp, scan_query->targetList);
	scan_query->jointree->quals = inner_where(kp, scan_query->jointree->quals);
	/*
	 * Scan order is the tie order: the engine breaks ties by target row.
	 * (With conditions after the self-exclusion the node evaluates them in
	 * the order PostgreSQL's scan reads the rows, so it sorts the rows
	 * after: knn_scan_exec.c.)
	 */
	scan_query->sortClause = kp->deferred_clauses != NIL ? NIL : copyObject(kp->tie_order);
	scan_query->limitCount = NULL;
	scan_query->limitOffset = NULL;

	/* Every row is wanted: tuple_fraction 0; no approximate index. */
	planning_inner_scans++;
	PG_TRY();
	{
		subroot = subquery_planner(root->glob, scan_query, root, false, 0.0);
	}
	PG_FINALLY();
	{
		planning_inner_scans--;
	}
	PG_END_TRY();
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

/* "t.id <> q.id" (or "t.g = q.g") for EXPLAIN, with the range tables' aliases. */
static char *
comparison_text(PlannerInfo *root, KnnJoinPath *kp, Var *target, Var *query, const char *op)
{
	RangeTblEntry *subquery_rte = planner_rt_fetch(kp->subquery_rel->relid, root);
	RangeTblEntry *target_rte = rt_fetch(target->varno, subquery_rte->subquery->rtable);
	RangeTblEntry *query_rte = planner_rt_fetch(query->varno, root);

	return psprintf("%s.%s %s %s.%s",
					quote_identifier(target_rte->eref->aliasname),
					quote_identifier(get_rte_attribute_name(target_rte, target->varattno)),
					op,
					quote_identifier(query_rte->eref->aliasname),
					quote_identifier(get_rte_attribute_name(query_rte, query->varattno)));
}

static char *
exclusion_text(PlannerInfo *root, KnnJoinPath *kp)
{
	return comparison_text(root, kp, kp->exclude_target, kp->exclude_query, "<>");
}

/*
 * The group keys for custom_private: their columns in the outer and the
 * inner rows (after the exclusion key: inner_select_list), types,
 * collations, and "t.g = q.g, t.h = q.h" for EXPLAIN.
 */
static void
group_private(PlannerInfo *root, KnnJoinPath *kp, Plan *outer_plan, CustomScan *cscan)
{
	List	   *query_columns = NIL;
	List	   *target_columns = NIL;
	List	   *types = NIL;
	List	   *collations = NIL;
	StringInfoData text;
	AttrNumber	inner = 2 + list_length(kp->needed_columns) + (kp->exclude_target != NULL ? 1 : 0);
	ListCell   *lt;
	ListCell   *lq;
	ListCell   *lcoll;

	initStringInfo(&text);
	forthree(lt, kp->group_targets, lq, kp->group_queries, lcoll, kp->group_collations)
	{
		Var		   *target = lfirst_node(Var, lt);
		Var		   *query = lfirst_node(Var, lq);

		query_columns = lappend_int(query_columns, outer_column(outer_plan, (Expr *) query));
		target_columns = lappend_int(target_columns, inner++);
		types = lappend_int(types, (int) target->vartype);
		collations = lappend_int(collations, (int) lfirst_oid(lcoll));
		appendStringInfo(&text, "%s%s", text.len > 0 ? ", " : "",
						 comparison_text(root, kp, target, query, "="));
	}
	cscan->custom_private = lappend(cscan->custom_private, query_columns);
	cscan->custom_private = lappend(cscan->custom_private, target_columns);
	cscan->custom_private = lappend(cscan->custom_private, types);
	cscan->custom_private = lappend(cscan->custom_private, collations);
	cscan->custom_private = lappend(cscan->custom_private, makeString(text.data));
}

/*
 * The ORDER BY keys after the distance, as columns of the inner rows (the
 * last ones: inner_select_list), with their sort and equality operators,
 * collations and NULLS FIRST.
 */
typedef struct TieOrder
{
	List	   *columns;
	List	   *sort_operators;
	List	   *equality;
	List	   *collations;
	List	   *nulls_first;
} TieOrder;

static void
tie_order(PlannerInfo *root, KnnJoinPath *kp, TieOrder *order)
{
	AttrNumber	inner = 2 + list_length(kp->needed_columns) +
		(kp->exclude_target != NULL ? 1 : 0) + list_length(kp->group_targets);
	List	   *subquery_tlist;
	ListCell   *lc;

	memset(order, 0, sizeof(*order));
	if (kp->tie_order == NIL)
		return;
	subquery_tlist = planner_rt_fetch(kp->subquery_rel->relid, root)->subquery->targetList;
	foreach(lc, kp->tie_order)
	{
		SortGroupClause *sort = lfirst_node(SortGroupClause, lc);
		TargetEntry *tle = get_sortgroupclause_tle(sort, subquery_tlist);

		order->columns = lappend_int(order->columns, inner++);
		order->sort_operators = lappend_int(order->sort_operators, (int) sort->sortop);
		order->equality = lappend_int(order->equality, (int) sort->eqop);
		order->collations = lappend_int(order->collations, (int) exprCollation((Node *) tle->expr));
		order->nulls_first = lappend_int(order->nulls_first, sort->nulls_first ? 1 : 0);
	}
}

/*
 * FETCH FIRST ... WITH TIES for custom_private: whether, and the ORDER BY
 * keys after the distance as columns of the inner rows, with the equality
 * operators and collations the Limit node would compare them with.
 */
static void
tie_private(const KnnJoinPath *kp, const TieOrder *order, CustomScan *cscan)
{
	cscan->custom_private = lappend(cscan->custom_private, makeInteger(kp->with_ties ? 1 : 0));
	cscan->custom_private = lappend(cscan->custom_private,
									kp->with_ties ? list_copy(order->columns) : NIL);
	cscan->custom_private = lappend(cscan->custom_private, kp->with_ties ? order->equality : NIL);
	cscan->custom_private = lappend(cscan->custom_private,
									kp->with_ties ? list_copy(order->collations) : NIL);
}

/*
 * The ORDER BY keys after the distance for custom_private (WITH TIES or
 * not): columns, sort operators, collations and NULLS FIRST. A sharded
 * inner relation merges its sources' rows by them (knn_scan_shard.h).
 */
static void
order_private(const TieOrder *order, CustomScan *cscan)
{
	cscan->custom_private = lappend(cscan->custom_private, order->columns);
	cscan->custom_private = lappend(cscan->custom_private, order->sort_operators);
	cscan->custom_private = lappend(cscan->custom_private, order->collations);
	cscan->custom_private = lappend(cscan->custom_private, order->nulls_first);
}

/* Replaces each Var of the relation by the inner rows' column holding it. */
typedef struct InnerColumns
{
	List	   *columns;		/* after_exclusion_columns */
	AttrNumber	first;			/* the first one's column in the inner rows */
} InnerColumns;

static Node *
as_inner_row_columns(Node *node, InnerColumns *inner)
{
	if (node != NULL && IsA(node, Var))
	{
		ListCell   *lc;

		foreach(lc, inner->columns)
		{
			if (equal(lfirst(lc), node))
			{
				Var		   *var = copyObject((Var *) node);

				var->varno = INNER_VAR;
				var->varattno = inner->first + foreach_current_index(lc);
				return (Node *) var;
			}
		}
		elog(ERROR, "KNN Join: a column of a condition after the self-exclusion was not planned");
	}
	return expression_tree_mutator(node, as_inner_row_columns, inner);
}

/*
 * The conditions evaluated after the self-exclusion for custom_private:
 * on the inner rows' columns (INNER_VAR; setrefs.c never sees them), and
 * as text for EXPLAIN, with the relation's alias.
 */
static void
after_exclusion_private(PlannerInfo *root, KnnJoinPath *kp, CustomScan *cscan)
{
	InnerColumns inner = {after_exclusion_columns(kp), first_after_exclusion_column(kp)};
	List	   *conditions = NIL;
	char	   *text = "";

	if (kp->deferred_clauses != NIL)
	{
		RangeTblEntry *subquery_rte = planner_rt_fetch(kp->subquery_rel->relid, root);
		Index		relid = linitial_node(RangeTblRef,
										  subquery_rte->subquery->jointree->fromlist)->rtindex;
		RangeTblEntry *rte = rt_fetch(relid, subquery_rte->subquery->rtable);
		Node	   *shown = copyObject((Node *) make_ands_explicit(kp->deferred_clauses));

		conditions = (List *) as_inner_row_columns((Node *) kp->deferred_clauses, &inner);
		fix_opfuncids((Node *) conditions);
		ChangeVarNodes(shown, relid, 1, 0);
		text = deparse_expression(shown, deparse_context_for(rte->eref->aliasname, rte->relid),
								  true, false);
	}
	cscan->custom_private = lappend(cscan->custom_private, conditions);
	cscan->custom_private = lappend(cscan->custom_private, makeString(pstrdup(text)));
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

/* A plain join: the column of the inner plan's rows that holds expr. */
static AttrNumber
inner_plan_column(Plan *inner_plan, Expr *expr)
{
	TargetEntry *tle = tlist_member(expr, inner_plan->targetlist);

	if (tle == NULL)
		elog(ERROR, "KNN Join: inner plan does not provide a needed column");
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

/*
 * The scan tuple: every Var of the join's output, the quals and the query
 * vector (computed from this tuple when it is an expression). Each comes
 * from the outer rows, the inner rows, or is the distance; *sources says
 * which (KNN_PRIVATE_SOURCES). (The path's target, not only tlist: with
 * CUSTOMPATH_SUPPORT_PROJECTION a projection above may pass no tlist and
 * set its own expressions of these Vars.)
 */
static List *
scan_tuple(KnnJoinPath *kp, Plan *outer_plan, Plan *inner_plan, List *tlist, List *quals,
		   List **sources)
{
	Index		subquery_relid = kp->subquery_rel != NULL ? kp->subquery_rel->relid : 0;
	List	   *scan_tlist;
	ListCell   *lc;

	scan_tlist = add_to_flat_tlist(NIL, pull_var_clause((Node *) kp->cpath.path.pathtarget->exprs, 0));
	scan_tlist = add_to_flat_tlist(scan_tlist, pull_var_clause((Node *) tlist, 0));
	scan_tlist = add_to_flat_tlist(scan_tlist, pull_var_clause((Node *) quals, 0));
	/* the columns a query vector that is an expression is computed from */
	if (!IsA(kp->query_vector, Var))
		scan_tlist = add_to_flat_tlist(scan_tlist, pull_var_clause((Node *) kp->query_vector, 0));
	*sources = NIL;
	foreach(lc, scan_tlist)
	{
		Var		   *var = castNode(Var, lfirst_node(TargetEntry, lc)->expr);
		int			source;

		if (kp->inner_path != NULL)
		{
			/* A plain join: a column of either side's rows. */
			TargetEntry *tle = tlist_member((Expr *) var, outer_plan->targetlist);

			source = tle != NULL ? tle->resno : -inner_plan_column(inner_plan, (Expr *) var);
		}
		else if (var->varno != subquery_relid)
			source = outer_column(outer_plan, (Expr *) var);
		else if (list_member_int(kp->distance_columns, var->varattno))
			source = 0;
		else
			source = -inner_column(kp, var->varattno);
		*sources = lappend_int(*sources, source);
	}
	return scan_tlist;
}

static Plan *
knn_join_plan_path(PlannerInfo *root, RelOptInfo *rel, CustomPath *best_path,
				   List *tlist, List *clauses, List *custom_plans)
{
	KnnJoinPath *kp = (KnnJoinPath *) best_path;
	Plan	   *outer_plan = linitial(custom_plans);
	Plan	   *inner_plan = kp->inner_path != NULL ? lsecond(custom_plans) :
		plan_inner_relation(root, kp);
	CustomScan *cscan = makeNode(CustomScan);
	List	   *join_quals;
	List	   *other_quals;
	List	   *sources;
	TieOrder	order;
	bool		exclude = kp->exclude_target != NULL;
	bool		query_is_column = IsA(kp->query_vector, Var);

	/* Whether a row matches (clauses is empty for a join rel), and after. */
	join_quals = get_actual_clauses(list_concat(list_copy(clauses), kp->join_clauses));
	other_quals = get_actual_clauses(kp->other_clauses);
	cscan->custom_scan_tlist = scan_tuple(kp, outer_plan, inner_plan, tlist,
										  list_concat(list_copy(join_quals), other_quals),
										  &sources);

	/*
	 * The quals go into custom_exprs rather than plan.qual, so that EXPLAIN
	 * can show them as a "Join Filter" with table names.
	 */
	cscan->scan.plan.targetlist = tlist;
	cscan->scan.plan.qual = NIL;
	cscan->scan.scanrelid = 0;
	cscan->flags = best_path->flags;
	cscan->custom_plans = list_make2(outer_plan, inner_plan);
	cscan->custom_exprs = list_make5(copyObject(kp->limit), copyObject(kp->offset),
									 join_quals, other_quals, copyObject(kp->radius));
	cscan->custom_exprs = lappend(cscan->custom_exprs,
								  query_is_column ? NULL : copyObject(kp->query_vector));
	cscan->custom_private = list_make5(makeInteger(kp->metric),
									   makeInteger(query_is_column ?
												   outer_column(outer_plan, kp->query_vector) : 0),
									   makeInteger(kp->inner_path != NULL ?
												   inner_plan_column(inner_plan, (Expr *) kp->target_vector) : 1),
									   makeInteger(kp->target_is_left ? 1 : 0),
									   sources);
	cscan->custom_private = lappend(cscan->custom_private, makeInteger(kp->jointype));
	cscan->custom_private = lappend(cscan->custom_private,
									makeInteger(exclude ? outer_column(outer_plan, (Expr *) kp->exclude_query) : 0));
	cscan->custom_private = lappend(cscan->custom_private,
									makeInteger(exclude ? 2 + list_length(kp->needed_columns) : 0));
	cscan->custom_private = lappend(cscan->custom_private,
									makeInteger(exclude ? (int) kp->exclude_target->vartype : 0));
	cscan->custom_private = lappend(cscan->custom_private,
									makeInteger((int) kp->exclude_collation));
	cscan->custom_private = lappend(cscan->custom_private,
									makeString(exclude ? exclusion_text(root, kp) : pstrdup("")));
	group_private(root, kp, outer_plan, cscan);
	cscan->custom_private = lappend(cscan->custom_private,
									makeInteger(kp->radius == NULL ? KNN_RANGE_NONE :
												kp->radius_inclusive ? KNN_RANGE_AT_MOST :
												KNN_RANGE_BELOW));
	tie_order(root, kp, &order);
	tie_private(kp, &order, cscan);
	cscan->custom_private = lappend(cscan->custom_private,
									makeInteger((int) kp->distance_operator));
	order_private(&order, cscan);
	after_exclusion_private(root, kp, cscan);
	cscan->custom_private = lappend(cscan->custom_private,
									makeString(pstrdup(kp->rewritten_from != NULL ?
													   kp->rewritten_from : "")));
	cscan->custom_private = lappend(cscan->custom_private, makeInteger(kp->rewrite_id));
	cscan->methods = &knn_join_scan_methods;
	return &cscan->scan.plan;
}

const CustomPathMethods knn_join_path_methods = {
	.CustomName = KNN_JOIN_NAME,
	.PlanCustomPath = knn_join_plan_path,
};

void
knn_scan_count_rewritten_joins(Plan *plan, int *run, int n_ids)
{
	List	   *children = NIL;
	ListCell   *lc;

	if (plan == NULL)
		return;
	check_stack_depth();
	if (IsA(plan, CustomScan))
	{
		CustomScan *cscan = (CustomScan *) plan;

		if (cscan->methods == &knn_join_scan_methods &&
			list_length(cscan->custom_private) > KNN_PRIVATE_REWRITE_ID)
		{
			int			id = intVal(list_nth(cscan->custom_private, KNN_PRIVATE_REWRITE_ID));

			if (id > 0 && id <= n_ids)
				run[id]++;
		}
		children = cscan->custom_plans;
	}
	else if (IsA(plan, Append))
		children = ((Append *) plan)->appendplans;
	else if (IsA(plan, MergeAppend))
		children = ((MergeAppend *) plan)->mergeplans;
	else if (IsA(plan, BitmapAnd))
		children = ((BitmapAnd *) plan)->bitmapplans;
	else if (IsA(plan, BitmapOr))
		children = ((BitmapOr *) plan)->bitmapplans;
	else if (IsA(plan, SubqueryScan))
		knn_scan_count_rewritten_joins(((SubqueryScan *) plan)->subplan, run, n_ids);
	foreach(lc, children)
		knn_scan_count_rewritten_joins((Plan *) lfirst(lc), run, n_ids);
	knn_scan_count_rewritten_joins(plan->lefttree, run, n_ids);
	knn_scan_count_rewritten_joins(plan->righttree, run, n_ids);
}

void
knn_scan_register_plan(void)
{
	RegisterCustomScanMethods(&knn_join_scan_methods);
	prev_get_relation_info_hook = get_relation_info_hook;
	get_relation_info_hook = without_approximate_indexes;
}
