/*
 * knn_scan_path.c -- recognising a LATERAL top-k distance join in the
 * planner and offering the KNN Join path beside PostgreSQL's nested loop.
 *
 * PostgreSQL plans
 *
 *     FROM queries q CROSS JOIN LATERAL
 *          (SELECT t.id, t.v <-> q.v AS dist FROM items t
 *           ORDER BY t.v <-> q.v LIMIT 10) n
 *
 * as a nested loop whose inner side, a SubqueryScan of n, sorts all of items
 * once per outer row. The subquery is not flattened (it has a LIMIT), so the
 * join of q and n reaches set_join_pathlist_hook with n as a RTE_SUBQUERY
 * base rel. There we check, on the subquery's parse tree, that it is exactly
 * "top k of one relation by distance to one outer column", and if so add a
 * CustomPath for the whole join; add_path keeps whichever is cheaper.
 *
 * Anything we cannot prove equivalent keeps PostgreSQL's plan, silently.
 */
#include "postgres.h"

#include "catalog/pg_amop.h"
#include "catalog/pg_operator.h"
#include "catalog/pg_type.h"
#include "nodes/nodeFuncs.h"
#include "optimizer/cost.h"
#include "optimizer/optimizer.h"
#include "optimizer/pathnode.h"
#include "optimizer/paths.h"
#include "optimizer/tlist.h"
#include "parser/parsetree.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"

#include "knn_scan.h"
#include "knn_settings.h"

/*
 * Cost model. The nested loop is charged, per pair, a tuple, one operator
 * call and the top-k sort's comparisons (about 0.04 with default settings,
 * which measured about right: 260 ns a pair on the 2-core development
 * machine, where one cost unit came to about 6 us). The engine computes the
 * same distance without executor overhead and usually skips most pairs
 * (triangle-inequality filtering): measured 1 to 12 ns a pair for 4-D data,
 * so a pair is charged a quarter of an operator call. Each input row is
 * stored and its vector copied once (measured about 100 ns). Starting an
 * engine job (threads, or the GPU) costs a fixed ~0.5 ms, which keeps the
 * nested loop for joins too small to amortise it: one outer row against a
 * few thousand rows, or a few outer rows against a few hundred.
 */
#define KNN_PAIR_COST_FRACTION	0.25	/* of cpu_operator_cost */
#define KNN_ENGINE_STARTUP_COST 100.0

static set_join_pathlist_hook_type prev_join_pathlist_hook = NULL;

/* Does the expression reference any query level above its own? */
static bool
references_upper_levels_walker(Node *node, void *context)
{
	if (node == NULL)
		return false;
	if (IsA(node, Var))
		return ((Var *) node)->varlevelsup > 0;
	if (IsA(node, PlaceHolderVar))
		return ((PlaceHolderVar *) node)->phlevelsup > 0;
	if (IsA(node, Aggref) || IsA(node, GroupingFunc) || IsA(node, SubLink))
		return true;			/* never in the shapes we accept */
	return expression_tree_walker(node, references_upper_levels_walker, context);
}

static bool
references_upper_levels(Node *node)
{
	return references_upper_levels_walker(node, NULL);
}

/* Does the value depend on a row (a Var of any level) or on the executor? */
static bool
varies_within_query_walker(Node *node, void *context)
{
	if (node == NULL)
		return false;
	if (IsA(node, Var) || IsA(node, PlaceHolderVar) || IsA(node, Aggref) ||
		IsA(node, SubLink) || IsA(node, SubPlan))
		return true;
	if (IsA(node, Param) && ((Param *) node)->paramkind != PARAM_EXTERN)
		return true;
	return expression_tree_walker(node, varies_within_query_walker, context);
}

/*
 * A LIMIT we can evaluate once when the node starts: constants, $n
 * parameters and stable or immutable functions of them.
 */
static bool
is_run_time_constant(Node *node)
{
	return node != NULL && !varies_within_query_walker(node, NULL) &&
		!contain_volatile_functions(node);
}

static bool
contains_placeholders_walker(Node *node, void *context)
{
	if (node == NULL)
		return false;
	if (IsA(node, PlaceHolderVar))
		return true;
	return expression_tree_walker(node, contains_placeholders_walker, context);
}

/* Same distance expression, either operand order (all four are symmetric)? */
static bool
is_same_distance(Node *node, OpExpr *distance)
{
	OpExpr	   *op;

	if (node == NULL || !IsA(node, OpExpr))
		return false;
	op = (OpExpr *) node;
	if (op->opno != distance->opno || list_length(op->args) != 2)
		return false;
	return (equal(linitial(op->args), linitial(distance->args)) &&
			equal(lsecond(op->args), lsecond(distance->args))) ||
		(equal(linitial(op->args), lsecond(distance->args)) &&
		 equal(lsecond(op->args), linitial(distance->args)));
}

/*
 * Checks the subquery's parse tree: one relation, WHERE on that relation
 * only, ORDER BY one ascending distance (a distance operator of knn_gpu or
 * pgvector, knn_catalog.h) between a column of it and a column of the outer
 * query, LIMIT a constant or parameter, nothing else. Fills
 * the path's shape fields; returns the subquery's relation index or 0.
 */
static Index
recognise_subquery(Query *sq, KnnJoinPath *kp)
{
	SortGroupClause *sort;
	TargetEntry *sort_tle;
	OpExpr	   *distance;
	RangeTblRef *rtr;
	RangeTblEntry *target_rte;
	Node	   *left;
	Node	   *right;
	Var		   *target_var;
	Var		   *query_var;
	ListCell   *lc;

	if (sq->commandType != CMD_SELECT || sq->utilityStmt != NULL ||
		sq->setOperations != NULL || sq->groupClause != NIL ||
		sq->groupingSets != NIL || sq->havingQual != NULL ||
		sq->hasAggs || sq->hasWindowFuncs || sq->hasTargetSRFs ||
		sq->hasSubLinks || sq->hasDistinctOn || sq->distinctClause != NIL ||
		sq->hasForUpdate || sq->rowMarks != NIL || sq->cteList != NIL ||
		sq->hasRecursive || sq->hasModifyingCTE || sq->windowClause != NIL ||
		sq->limitOffset != NULL || sq->limitCount == NULL ||
		sq->limitOption != LIMIT_OPTION_COUNT ||
		list_length(sq->sortClause) != 1)
		return 0;

	/* FROM one plain relation */
	if (list_length(sq->rtable) != 1 || sq->jointree == NULL ||
		list_length(sq->jointree->fromlist) != 1 ||
		!IsA(linitial(sq->jointree->fromlist), RangeTblRef))
		return 0;
	rtr = linitial_node(RangeTblRef, sq->jointree->fromlist);
	target_rte = rt_fetch(rtr->rtindex, sq->rtable);
	if (target_rte->rtekind != RTE_RELATION || target_rte->tablesample != NULL)
		return 0;

	/* WHERE on the inner relation only, same result every time */
	if (references_upper_levels(sq->jointree->quals) ||
		contain_volatile_functions(sq->jointree->quals))
		return 0;

	/* ORDER BY <distance> ASC NULLS LAST: float8's "<" */
	sort = linitial_node(SortGroupClause, sq->sortClause);
	if (sort->sortop != Float8LessOperator || sort->nulls_first)
		return 0;
	sort_tle = get_sortgroupclause_tle(sort, sq->targetList);
	if (!IsA(sort_tle->expr, OpExpr))
		return 0;
	distance = (OpExpr *) sort_tle->expr;
	if (list_length(distance->args) != 2 || distance->opresulttype != FLOAT8OID ||
		!knn_distance_operator_metric(distance->opno, &kp->metric))
		return 0;

	/* between a column of the relation and a column of the outer query */
	left = linitial(distance->args);
	right = lsecond(distance->args);
	if (!IsA(left, Var) || !IsA(right, Var))
		return 0;
	if (((Var *) left)->varlevelsup == 0 && ((Var *) right)->varlevelsup == 1)
	{
		target_var = (Var *) left;
		query_var = (Var *) right;
		kp->target_is_left = true;
	}
	else if (((Var *) left)->varlevelsup == 1 && ((Var *) right)->varlevelsup == 0)
	{
		target_var = (Var *) right;
		query_var = (Var *) left;
		kp->target_is_left = false;
	}
	else
		return 0;
	if (target_var->varno != rtr->rtindex || target_var->varattno <= 0 ||
		query_var->varattno <= 0 ||
		knn_vector_kind(target_var->vartype) != KNN_VECTOR_TYPE ||
		target_var->vartype != query_var->vartype)
		return 0;

	/*
	 * The select list: the distance (either operand order) or expressions of
	 * the relation alone, with no volatile functions (we evaluate them for
	 * every row of the relation, not only for the k kept).
	 */
	kp->distance_columns = NIL;
	foreach(lc, sq->targetList)
	{
		TargetEntry *tle = lfirst_node(TargetEntry, lc);

		if (tle == sort_tle || is_same_distance((Node *) tle->expr, distance))
		{
			if (!tle->resjunk)
				kp->distance_columns = lappend_int(kp->distance_columns, tle->resno);
			continue;
		}
		if (references_upper_levels((Node *) tle->expr) ||
			contain_volatile_functions((Node *) tle->expr))
			return 0;
	}

	/* LIMIT: evaluated once at run time (no references to any row) */
	if (!is_run_time_constant(sq->limitCount))
		return 0;

	kp->distance_operator = distance->opno;
	kp->target_vector = target_var;
	kp->query_vector = copyObject(query_var);
	kp->query_vector->varlevelsup = 0;
	return rtr->rtindex;
}

/*
 * Would PostgreSQL's own plan answer from an approximate index (pgvector's
 * hnsw or ivfflat) on the target column whose operator class orders by
 * this operator? Then the user's plan gives approximate results, which we keep
 * unless knn_gpu.exact_over_index asks for exact ones.
 */
static bool
has_approximate_index(RelOptInfo *target_rel, KnnJoinPath *kp)
{
	ListCell   *lc;

	foreach(lc, target_rel->indexlist)
	{
		IndexOptInfo *index = lfirst_node(IndexOptInfo, lc);

		if (!knn_is_approximate_index_am(index->relam))
			continue;
		if (index->nkeycolumns >= 1 &&
			index->indexkeys[0] == kp->target_vector->varattno &&
			SearchSysCacheExists3(AMOPOPID,
								  ObjectIdGetDatum(kp->distance_operator),
								  CharGetDatum(AMOP_ORDER),
								  ObjectIdGetDatum(index->opfamily[0])))
			return true;
	}
	return false;
}

/* Is the expression available in the outer path's rows? */
static bool
outer_provides(Path *outer_path, Expr *expr)
{
	ListCell   *lc;

	foreach(lc, outer_path->pathtarget->exprs)
		if (equal(lfirst(lc), expr))
			return true;
	return false;
}

/*
 * The subquery's columns used above the join (select list, join clauses,
 * filters on the subquery's output). Fails (returns false) for a whole-row
 * reference.
 */
static bool
collect_needed_columns(RelOptInfo *joinrel, RelOptInfo *subquery_rel,
					   List *join_clauses, Path *outer_path, KnnJoinPath *kp)
{
	Bitmapset  *attnos = NULL;
	List	   *vars;
	ListCell   *lc;
	int			attno = -1;

	vars = pull_var_clause((Node *) joinrel->reltarget->exprs, 0);
	vars = list_concat(vars, pull_var_clause((Node *) join_clauses, 0));
	foreach(lc, vars)
	{
		Var		   *var = lfirst_node(Var, lc);

		if (var->varno == subquery_rel->relid)
		{
			if (var->varattno <= 0)
				return false;
			attnos = bms_add_member(attnos, var->varattno);
		}
		else if (!outer_provides(outer_path, (Expr *) var))
			return false;
	}

	kp->needed_columns = NIL;
	while ((attno = bms_next_member(attnos, attno)) >= 0)
		if (!list_member_int(kp->distance_columns, attno))
			kp->needed_columns = lappend_int(kp->needed_columns, attno);
	return true;
}

static void
cost_knn_join(PlannerInfo *root, KnnJoinPath *kp, Path *outer_path,
			  RelOptInfo *joinrel, RelOptInfo *target_rel)
{
	double		n_queries = outer_path->rows;
	double		n_targets = target_rel->rows;
	QualCost	qual_cost;
	Cost		startup;

	cost_qual_eval(&qual_cost, kp->join_clauses, root);

	startup = outer_path->total_cost + target_rel->cheapest_total_path->total_cost;
	startup += (n_queries + n_targets) * (cpu_tuple_cost + cpu_operator_cost);
	startup += n_queries * n_targets * KNN_PAIR_COST_FRACTION * cpu_operator_cost;
	startup += KNN_ENGINE_STARTUP_COST + qual_cost.startup;

	kp->cpath.path.rows = joinrel->rows;
	kp->cpath.path.startup_cost = startup;
	kp->cpath.path.total_cost = startup +
		joinrel->rows * (cpu_tuple_cost + qual_cost.per_tuple);
}

static void
knn_join_pathlist_hook(PlannerInfo *root, RelOptInfo *joinrel,
					   RelOptInfo *outerrel, RelOptInfo *innerrel,
					   JoinType jointype, JoinPathExtraData *extra)
{
	RangeTblEntry *rte;
	PlannerInfo *subroot;
	RelOptInfo *target_rel;
	Path	   *outer_path;
	KnnJoinPath *kp;
	Index		target_rti;
	Expr	   *limit;
	List	   *clauses = NIL;
	ListCell   *lc;
	bool		approximate;

	if (prev_join_pathlist_hook)
		prev_join_pathlist_hook(root, joinrel, outerrel, innerrel, jointype, extra);

	if (!knn_gpu_enable_knn_join || jointype != JOIN_INNER ||
		joinrel->reloptkind != RELOPT_JOINREL ||
		innerrel->reloptkind != RELOPT_BASEREL ||
		innerrel->rtekind != RTE_SUBQUERY || innerrel->subroot == NULL ||
		IS_DUMMY_REL(innerrel) || root->rowMarks != NIL)
		return;

	/* The subquery may reference the outer side only, which must need nothing. */
	if (!bms_is_subset(innerrel->lateral_relids, outerrel->relids) ||
		bms_is_empty(innerrel->lateral_relids) ||
		!bms_is_empty(joinrel->lateral_relids))
		return;
	outer_path = outerrel->cheapest_total_path;
	if (outer_path == NULL || outer_path->param_info != NULL)
		return;

	rte = planner_rt_fetch(innerrel->relid, root);
	if (rte->rtekind != RTE_SUBQUERY || !rte->lateral || rte->subquery == NULL)
		return;

	kp = palloc0(sizeof(KnnJoinPath));
	target_rti = recognise_subquery(rte->subquery, kp);
	if (target_rti == 0)
		return;

	/* The outer operand must come from the outer side's rows. */
	if (!bms_is_member(kp->query_vector->varno, outerrel->relids) ||
		!outer_provides(outer_path, (Expr *) kp->query_vector))
		return;

	/*
	 * Clauses above the subquery's LIMIT: filters on its output and the join
	 * clauses. The nested loop checks them on each of the k rows; so do we.
	 * PlaceHolderVars would need evaluating at a level we do not model.
	 */
	kp->join_clauses = list_concat(list_copy(extra->restrictlist),
								   innerrel->baserestrictinfo);
	foreach(lc, kp->join_clauses)
		clauses = lappend(clauses, lfirst_node(RestrictInfo, lc)->clause);
	if (contains_placeholders_walker((Node *) joinrel->reltarget->exprs, NULL) ||
		contains_placeholders_walker((Node *) clauses, NULL))
		return;
	if (!collect_needed_columns(joinrel, innerrel, clauses, outer_path, kp))
		return;

	/* The LIMIT as planned in the subquery (constants folded, $n bound). */
	subroot = innerrel->subroot;
	limit = (Expr *) subroot->parse->limitCount;
	if (!is_run_time_constant((Node *) limit))
		return;
	kp->limit = limit;

	/* The inner relation as the subquery planned it, for costs and indexes. */
	if (target_rti >= (Index) subroot->simple_rel_array_size)
		return;
	target_rel = subroot->simple_rel_array[target_rti];
	if (target_rel == NULL || target_rel->cheapest_total_path == NULL)
		return;
	approximate = has_approximate_index(target_rel, kp);
	if (approximate && !knn_gpu_exact_over_index)
		return;

	kp->subquery_rel = innerrel;
	kp->cpath.path.type = T_CustomPath;
	kp->cpath.path.pathtype = T_CustomScan;
	kp->cpath.path.parent = joinrel;
	kp->cpath.path.pathtarget = joinrel->reltarget;
	kp->cpath.path.param_info = NULL;
	/* One backend reads everything and runs the engine: never in a worker. */
	kp->cpath.path.parallel_aware = false;
	kp->cpath.path.parallel_safe = false;
	kp->cpath.path.parallel_workers = 0;
	/* Rows come out in the outer side's order, as from the nested loop. */
	kp->cpath.path.pathkeys = build_join_pathkeys(root, joinrel, jointype,
												  outer_path->pathkeys);
	/* The node projects its output itself, like a join node. */
	kp->cpath.flags = CUSTOMPATH_SUPPORT_PROJECTION;
	kp->cpath.custom_paths = list_make1(outer_path);
	kp->cpath.custom_private = NIL;
	kp->cpath.methods = &knn_join_path_methods;
	cost_knn_join(root, kp, outer_path, joinrel, target_rel);

	/*
	 * Exact results were asked for over an approximate index: every other
	 * path of this join reads the subquery as planned, i.e. the index, so
	 * ours is the only one left, whatever the costs say.
	 */
	if (approximate)
	{
		joinrel->pathlist = NIL;
		joinrel->partial_pathlist = NIL;
	}
	add_path(joinrel, &kp->cpath.path);
}

void
knn_scan_register(void)
{
	knn_scan_register_plan();
	prev_join_pathlist_hook = set_join_pathlist_hook;
	set_join_pathlist_hook = knn_join_pathlist_hook;
}

/*
 * The planner support function of the distance functions behind <->, <=>,
 * <#> and <+>. It simplifies nothing; it exists so that planning a query
 * that uses a distance operator loads this library -- and installs the join
 * hook above -- before the planner's join search, even in a session where
 * no knn_gpu function has run yet. (Subqueries are planned, and their
 * expressions simplified, before the outer query's joins are searched.)
 */
PG_FUNCTION_INFO_V1(knn_distance_support);
Datum
knn_distance_support(PG_FUNCTION_ARGS)
{
	PG_RETURN_POINTER(NULL);
}
