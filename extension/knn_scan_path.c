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
 * "top k of one relation by distance to a vector of the outer row"
 * (knn_scan_shape.c), that the join is an inner or a left join we can
 * reproduce, and if so add a CustomPath for the whole join; add_path keeps
 * whichever is cheaper.
 *
 * Anything we cannot prove equivalent keeps PostgreSQL's plan; the reason
 * is logged at DEBUG1 (knn_scan_shape.c).
 */
#include "postgres.h"

#include "catalog/pg_amop.h"
#include "catalog/pg_operator.h"
#include "catalog/pg_type.h"
#include "nodes/makefuncs.h"
#include "nodes/nodeFuncs.h"
#include "optimizer/clauses.h"
#include "optimizer/cost.h"
#include "optimizer/optimizer.h"
#include "optimizer/pathnode.h"
#include "optimizer/paths.h"
#include "optimizer/restrictinfo.h"
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
static set_rel_pathlist_hook_type prev_rel_pathlist_hook = NULL;

static bool
contains_placeholders_walker(Node *node, void *context)
{
	if (node == NULL)
		return false;
	if (IsA(node, PlaceHolderVar))
		return true;
	return expression_tree_walker(node, contains_placeholders_walker, context);
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
		/*
		 * A vector that a view computes may be what an expression index
		 * indexes: any such index counts.
		 */
		if (index->nkeycolumns >= 1 &&
			(index->indexkeys[0] == kp->target_relation_column ||
			 (kp->target_relation_column == 0 && index->indexkeys[0] == 0)) &&
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

/* Are the expression's Vars available in the outer path's rows? */
static bool
outer_provides_vars(Path *outer_path, Node *expr)
{
	ListCell   *lc;

	foreach(lc, pull_var_clause(expr, PVC_RECURSE_PLACEHOLDERS))
		if (!outer_provides(outer_path, lfirst(lc)))
			return false;
	return true;
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
	QualCost	vector_cost;
	Cost		startup;

	cost_qual_eval(&qual_cost, list_concat(list_copy(kp->join_clauses), kp->other_clauses), root);
	/* a query vector that is an expression: computed once per outer row */
	cost_qual_eval_node(&vector_cost, (Node *) kp->query_vector, root);

	startup = outer_path->total_cost + target_rel->cheapest_total_path->total_cost;
	startup += (n_queries + n_targets) * (cpu_tuple_cost + cpu_operator_cost);
	startup += n_queries * n_targets * KNN_PAIR_COST_FRACTION * cpu_operator_cost;
	startup += KNN_ENGINE_STARTUP_COST + qual_cost.startup;
	startup += vector_cost.startup + n_queries * vector_cost.per_tuple;

	kp->cpath.path.rows = joinrel->rows;
	kp->cpath.path.startup_cost = startup;
	kp->cpath.path.total_cost = startup +
		joinrel->rows * (cpu_tuple_cost + qual_cost.per_tuple);
}

/*
 * Splits the join's clauses: those that decide whether a joined row is a
 * match (for an inner join, all; for a left join, the ON clauses and the
 * filters PostgreSQL pushed into the subquery's scan) and, for a left join,
 * the pushed-down ones, checked on null-extended rows too, as the nested
 * loop's "otherqual".
 */
static void
split_join_clauses(RelOptInfo *joinrel, RelOptInfo *innerrel, JoinType jointype,
				   JoinPathExtraData *extra, KnnJoinPath *kp)
{
	ListCell   *lc;

	kp->join_clauses = NIL;
	kp->other_clauses = NIL;
	foreach(lc, extra->restrictlist)
	{
		RestrictInfo *rinfo = lfirst_node(RestrictInfo, lc);

		if (jointype == JOIN_LEFT && RINFO_IS_PUSHED_DOWN(rinfo, joinrel->relids))
			kp->other_clauses = lappend(kp->other_clauses, rinfo);
		else
			kp->join_clauses = lappend(kp->join_clauses, rinfo);
	}
	kp->join_clauses = list_concat(kp->join_clauses, innerrel->baserestrictinfo);
}

/*
 * The join around the recognised subquery: inner or left, the outer
 * operands available in the outer side's rows, no PlaceHolderVars, no
 * whole-row reference, LIMIT and OFFSET as the subquery planned them.
 */
static bool
check_join(PlannerInfo *root, RelOptInfo *joinrel, RelOptInfo *outerrel,
		   RelOptInfo *innerrel, JoinType jointype, JoinPathExtraData *extra,
		   Path *outer_path, KnnJoinPath *kp)
{
	PlannerInfo *subroot = innerrel->subroot;
	List	   *clauses;
	ListCell   *lc;

	if (jointype != JOIN_INNER && jointype != JOIN_LEFT)
		return knn_scan_reject("the join is neither an inner nor a left join");
	if (root->rowMarks != NIL)
		return knn_scan_reject("the query locks rows");
	kp->jointype = jointype;

	/*
	 * The query vector: a column of the outer rows, or an expression of
	 * their columns that the node computes (only for the outer rows
	 * PostgreSQL's plan computes it for: knn_scan_exec.c).
	 */
	if (!bms_is_subset(pull_varnos(root, (Node *) kp->query_vector), outerrel->relids) ||
		!outer_provides_vars(outer_path, (Node *) kp->query_vector))
		return knn_scan_reject("the query vector is not computed from the outer side's rows");
	if ((kp->exclude_query != NULL &&
		 (!bms_is_member(kp->exclude_query->varno, outerrel->relids) ||
		  !outer_provides(outer_path, (Expr *) kp->exclude_query))))
		return knn_scan_reject("an outer operand is not a column of the outer side's rows");
	foreach(lc, kp->group_queries)
	{
		Var		   *query = lfirst_node(Var, lc);

		if (!bms_is_member(query->varno, outerrel->relids) ||
			!outer_provides(outer_path, (Expr *) query))
			return knn_scan_reject("an outer operand is not a column of the outer side's rows");
	}

	/*
	 * Clauses above the subquery's LIMIT: filters on its output and the join
	 * clauses. The nested loop checks them on each of the k rows; so do we.
	 * PlaceHolderVars would need evaluating at a level we do not model.
	 */
	split_join_clauses(joinrel, innerrel, jointype, extra, kp);
	clauses = get_actual_clauses(list_concat(list_copy(kp->join_clauses), kp->other_clauses));
	if (contains_placeholders_walker((Node *) joinrel->reltarget->exprs, NULL) ||
		contains_placeholders_walker((Node *) clauses, NULL))
		return knn_scan_reject("the join uses PlaceHolderVars");
	if (!collect_needed_columns(joinrel, innerrel, clauses, outer_path, kp))
		return knn_scan_reject("a whole-row reference to the subquery, or a column the outer side does not provide");

	/*
	 * LIMIT and OFFSET as planned in the subquery (constants folded, $n
	 * bound); the radius folded the same way. No LIMIT (only with a
	 * radius): every row within the radius.
	 */
	kp->limit = (Expr *) subroot->parse->limitCount;
	kp->offset = (Expr *) subroot->parse->limitOffset;
	if ((kp->limit != NULL && !knn_scan_is_run_time_constant((Node *) kp->limit)) ||
		(kp->offset != NULL && !knn_scan_is_run_time_constant((Node *) kp->offset)))
		return knn_scan_reject("LIMIT or OFFSET is not a constant or parameter");
	if (kp->radius != NULL)
	{
		kp->radius = (Expr *) eval_const_expressions(root, (Node *) copyObject(kp->radius));
		if (!knn_scan_is_run_time_constant((Node *) kp->radius))
			return knn_scan_reject("the radius is not a constant or parameter");
	}
	return true;
}

/* Fills in the path's generic fields; costs it. */
static void
build_path(PlannerInfo *root, RelOptInfo *joinrel, RelOptInfo *innerrel,
		   Path *outer_path, RelOptInfo *target_rel, KnnJoinPath *kp)
{
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
	kp->cpath.path.pathkeys = build_join_pathkeys(root, joinrel, kp->jointype,
												  outer_path->pathkeys);
	/* The node projects its output itself, like a join node. */
	kp->cpath.flags = CUSTOMPATH_SUPPORT_PROJECTION;
	kp->cpath.custom_paths = list_make1(outer_path);
	kp->cpath.custom_private = NIL;
	kp->cpath.methods = &knn_join_path_methods;
	cost_knn_join(root, kp, outer_path, joinrel, target_rel);
}

/* Is every Var of the expressions one of the two paths' output? */
static bool
paths_provide(List *exprs, Path *outer_path, Path *inner_path)
{
	List	   *vars = pull_var_clause((Node *) exprs, 0);
	ListCell   *lc;

	foreach(lc, vars)
		if (!outer_provides(outer_path, lfirst(lc)) && !outer_provides(inner_path, lfirst(lc)))
			return false;
	return true;
}

/*
 * A plain join of two relations of this query with a radius join clause
 * "a.v <op> b.v < r" (or <=): the lateral subquery with a radius and
 * without ORDER BY or LIMIT after PostgreSQL pulled it up, or the join
 * written so. The outer side's rows are the queries, the inner side's the
 * targets (the distances are symmetric, bit for bit, so either order is
 * the operator's value); the other clauses filter the engine's pairs.
 */
static void
try_plain_radius_join(PlannerInfo *root, RelOptInfo *joinrel, RelOptInfo *outerrel,
					  RelOptInfo *innerrel, JoinType jointype, JoinPathExtraData *extra)
{
	Path	   *outer_path = outerrel->cheapest_total_path;
	Path	   *inner_path = innerrel->cheapest_total_path;
	KnnJoinPath *kp = NULL;
	RestrictInfo *radius_rinfo = NULL;
	List	   *clauses;
	ListCell   *lc;

	bool		has_distance = false;

	foreach(lc, extra->restrictlist)
	{
		RestrictInfo *rinfo = lfirst_node(RestrictInfo, lc);

		if (jointype == JOIN_LEFT && RINFO_IS_PUSHED_DOWN(rinfo, joinrel->relids))
			continue;
		has_distance = has_distance || knn_scan_contains_distance((Node *) rinfo->clause);
		kp = palloc0(sizeof(KnnJoinPath));
		if (knn_scan_recognise_radius_clause(rinfo->clause, innerrel->relids, outerrel->relids, kp))
		{
			radius_rinfo = rinfo;
			break;
		}
		pfree(kp);
		kp = NULL;
	}
	if (kp == NULL)
	{
		/* (a join without any distance is no radius join: no message) */
		if (has_distance)
			knn_scan_reject("no join clause is \"<distance between a vector column of each side> < (or <=) <constant or parameter>\"");
		return;
	}
	if (jointype != JOIN_INNER && jointype != JOIN_LEFT)
	{
		knn_scan_reject("the radius join is neither an inner nor a left join");
		return;
	}
	if (root->rowMarks != NIL)
	{
		knn_scan_reject("the query locks rows");
		return;
	}
	if (outer_path == NULL || inner_path == NULL ||
		outer_path->param_info != NULL || inner_path->param_info != NULL ||
		!bms_is_empty(joinrel->lateral_relids) || !bms_is_empty(innerrel->lateral_relids) ||
		!bms_is_empty(outerrel->lateral_relids))
	{
		knn_scan_reject("a side of the radius join references a relation outside it (LATERAL)");
		return;
	}

	/* The other clauses: the join filter, and for a left join the filter. */
	kp->jointype = jointype;
	foreach(lc, extra->restrictlist)
	{
		RestrictInfo *rinfo = lfirst_node(RestrictInfo, lc);

		if (rinfo == radius_rinfo)
			continue;
		if (jointype == JOIN_LEFT && RINFO_IS_PUSHED_DOWN(rinfo, joinrel->relids))
			kp->other_clauses = lappend(kp->other_clauses, rinfo);
		else
			kp->join_clauses = lappend(kp->join_clauses, rinfo);
	}
	clauses = get_actual_clauses(list_concat(list_copy(kp->join_clauses), kp->other_clauses));
	if (contains_placeholders_walker((Node *) joinrel->reltarget->exprs, NULL) ||
		contains_placeholders_walker((Node *) clauses, NULL))
	{
		knn_scan_reject("the join uses PlaceHolderVars");
		return;
	}
	if (!outer_provides(outer_path, (Expr *) kp->query_vector) ||
		!outer_provides(inner_path, (Expr *) kp->target_vector) ||
		!paths_provide(joinrel->reltarget->exprs, outer_path, inner_path) ||
		!paths_provide(clauses, outer_path, inner_path))
	{
		knn_scan_reject("a column the join needs is not in its sides' rows");
		return;
	}
	kp->radius = (Expr *) eval_const_expressions(root, (Node *) copyObject(kp->radius));
	if (!knn_scan_is_run_time_constant((Node *) kp->radius))
	{
		knn_scan_reject("the radius is not a constant or parameter");
		return;
	}
	kp->inner_path = inner_path;
	build_path(root, joinrel, innerrel, outer_path, innerrel, kp);
	kp->subquery_rel = NULL;
	kp->cpath.custom_paths = list_make2(outer_path, inner_path);
	add_path(joinrel, &kp->cpath.path);
}

/* The one base relation of a planning, or NULL. */
static RelOptInfo *
single_base_relation(PlannerInfo *subroot)
{
	RelOptInfo *found = NULL;

	for (int i = 1; i < subroot->simple_rel_array_size; i++)
	{
		RelOptInfo *rel = subroot->simple_rel_array[i];

		if (rel == NULL || rel->reloptkind != RELOPT_BASEREL)
			continue;
		if (found != NULL)
			return NULL;
		found = rel;
	}
	return found;
}

/*
 * The table the subquery scans, as its planning saw it, for costs and
 * indexes: its one base relation (a view or a subquery in FROM over one
 * table is pulled up into it; one that is not is descended into). NULL if
 * there is no single one.
 */
static RelOptInfo *
scanned_relation(PlannerInfo *subroot)
{
	RelOptInfo *found = single_base_relation(subroot);

	if (found != NULL && found->rtekind == RTE_SUBQUERY && found->subroot != NULL)
		return scanned_relation(found->subroot);
	if (found == NULL || found->rtekind != RTE_RELATION || found->cheapest_total_path == NULL)
		return NULL;
	return found;
}

/* A condition of a scan, with what orders it (order_qual_clauses). */
typedef struct ScanCondition
{
	RestrictInfo *rinfo;
	Index		security_level;
	Cost		cost;
} ScanCondition;

/*
 * A scan's conditions in the order its plan evaluates them, as
 * order_qual_clauses (createplan.c) sorts them: by security level (a cheap
 * leakproof one counts as level 0), then by cost, keeping the list's order
 * among equals.
 */
static ScanCondition *
evaluation_order(PlannerInfo *subroot, List *restrictinfo)
{
	ScanCondition *order = palloc(sizeof(ScanCondition) * Max(1, list_length(restrictinfo)));
	int			n = 0;
	ListCell   *lc;

	foreach(lc, restrictinfo)
	{
		ScanCondition item;
		QualCost	cost;
		int			j;

		item.rinfo = lfirst_node(RestrictInfo, lc);
		cost_qual_eval_node(&cost, (Node *) item.rinfo, subroot);
		item.cost = cost.per_tuple;
		item.security_level = item.rinfo->leakproof && item.cost < 10 * cpu_operator_cost ?
			0 : item.rinfo->security_level;
		for (j = n; j > 0; j--)
		{
			if (item.security_level > order[j - 1].security_level ||
				(item.security_level == order[j - 1].security_level &&
				 item.cost >= order[j - 1].cost))
				break;
			order[j] = order[j - 1];
		}
		order[j] = item;
		n++;
	}
	return order;
}

/*
 * Does the scan apply an equality on the outer row before its filters: as
 * an index condition (a column of an index; of a child's too, for a
 * parent of others) or by pruning partitions? (Whether the plan does is a
 * matter of costs: assumed so.)
 */
static bool
outer_equality_applied_first(PlannerInfo *subroot, RelOptInfo *rel, List *outer_params)
{
	bool		has_children = planner_rt_fetch(rel->relid, subroot)->inh;
	ListCell   *lc;

	foreach(lc, rel->baserestrictinfo)
	{
		Expr	   *clause = lfirst_node(RestrictInfo, lc)->clause;
		OpExpr	   *op = (OpExpr *) clause;
		ListCell   *arg;

		if (!IsA(op, OpExpr) || list_length(op->args) != 2 ||
			!contain_exec_param((Node *) clause, outer_params) ||
			!op_hashjoinable(op->opno, exprType(linitial(op->args))))
			continue;
		if (has_children)
			return true;
		foreach(arg, op->args)
		{
			Var		   *var = (Var *) lfirst(arg);
			ListCell   *ix;

			while (var != NULL && IsA(var, RelabelType))
				var = (Var *) ((RelabelType *) var)->arg;
			if (var == NULL || !IsA(var, Var))
				continue;
			foreach(ix, rel->indexlist)
			{
				IndexOptInfo *index = lfirst_node(IndexOptInfo, ix);

				for (int c = 0; c < index->ncolumns; c++)
					if (index->indexkeys[c] == var->varattno)
						return true;
			}
		}
	}
	return false;
}

/* The parameters a lateral subquery's planning reads the outer row through. */
static List *
outer_row_params(RelOptInfo *subquery_rel)
{
	List	   *ids = NIL;
	ListCell   *lc;

	foreach(lc, subquery_rel->subplan_params)
		ids = lappend_int(ids, lfirst_node(PlannerParamItem, lc)->paramId);
	return ids;
}

/*
 * Can PostgreSQL's own planning of a condition of the WHERE on the relation
 * alone be evaluated on an inner row by the node: Vars of the relation
 * (relid) only, no sub-select, no parameter but a statement's ($1)?
 */
static bool
not_on_inner_row_walker(Node *node, void *relid)
{
	if (node == NULL)
		return false;
	if (IsA(node, Var))
		return ((Var *) node)->varlevelsup != 0 || ((Var *) node)->varno != *(Index *) relid;
	if (IsA(node, Param))
		return ((Param *) node)->paramkind != PARAM_EXTERN;
	if (IsA(node, SubPlan) || IsA(node, AlternativeSubPlan) || IsA(node, SubLink) ||
		IsA(node, PlaceHolderVar))
		return true;
	return expression_tree_walker(node, not_on_inner_row_walker, relid);
}

/* The conditions a conjunct of the subquery's WHERE becomes in its planning. */
static List *
planned_conditions(PlannerInfo *subroot, Node *conjunct)
{
	Node	   *expr = eval_const_expressions(subroot, copyObject(conjunct));

	return make_ands_implicit(canonicalize_qual((Expr *) expr, false));
}

/* Where a condition is in order (n of them), or -1. */
static int
position_in_order(const ScanCondition *order, int n, Node *condition)
{
	for (int i = 0; i < n; i++)
		if (equal(order[i].rinfo->clause, condition))
			return i;
	return -1;
}

/*
 * The conditions of rel from order[first] on -- the first that may fail
 * after the self-exclusion, and all after it -- evaluated by the node
 * after the self-exclusion, as PostgreSQL's plan does (KnnJoinPath's
 * deferred_clauses; knn_scan_exec.c evaluates them). Possible where the
 * self-exclusion is the WHERE's only condition on the outer row (a group
 * equality or a radius keeps other rows: declined), the subquery scans a
 * table with neither children (partitions, which may be shards) nor a
 * view in between, PostgreSQL's plan scans it sequentially (an index
 * applies its conditions first), and each condition is one of the
 * subquery's own WHERE (not a view's or row-level security's) whose
 * conjunct becomes conditions in that range only: the inner scan leaves
 * these conjuncts out. False (nothing set) where it is not.
 */
static bool
evaluate_after_exclusion(PlannerInfo *subroot, Query *sq, RelOptInfo *rel,
						 const ScanCondition *order, int first, KnnJoinPath *kp)
{
	int			n = list_length(rel->baserestrictinfo);
	bool	   *from_conjunct = palloc0(sizeof(bool) * n);
	List	   *conjuncts = NIL;
	ListCell   *lc;

	if (sq == NULL || kp->exclude_qual == NULL || kp->group_quals != NIL ||
		kp->radius_qual != NULL || rel->rtekind != RTE_RELATION ||
		planner_rt_fetch(rel->relid, subroot)->inh ||
		list_length(sq->jointree->fromlist) != 1 ||
		!IsA(linitial(sq->jointree->fromlist), RangeTblRef) ||
		((RangeTblRef *) linitial(sq->jointree->fromlist))->rtindex != rel->relid)
		return false;
	foreach(lc, rel->pathlist)
	{
		Path	   *path = lfirst(lc);

		/* (the planning of the subquery put its select list above each) */
		while (IsA(path, ProjectionPath))
			path = ((ProjectionPath *) path)->subpath;
		if (path->pathtype != T_SeqScan)
			return false;
	}

	/* which conjuncts of the WHERE the conditions from `first` on are */
	foreach(lc, make_ands_implicit((Expr *) sq->jointree->quals))
	{
		Node	   *conjunct = lfirst(lc);
		List	   *conditions;
		ListCell   *lcond;
		int			in_range = 0;

		if (conjunct == kp->exclude_qual)
			continue;
		conditions = planned_conditions(subroot, conjunct);
		foreach(lcond, conditions)
		{
			int			at = position_in_order(order, n, lfirst(lcond));

			if (at >= first)
			{
				in_range++;
				from_conjunct[at] = true;
			}
		}
		if (in_range == 0)
			continue;
		if (in_range != list_length(conditions))
			return false;
		conjuncts = lappend(conjuncts, conjunct);
	}
	kp->deferred_clauses = NIL;
	for (int i = first; i < n; i++)
	{
		Node	   *clause = (Node *) order[i].rinfo->clause;

		if (!from_conjunct[i] || not_on_inner_row_walker(clause, &rel->relid))
		{
			kp->deferred_clauses = NIL;
			return false;
		}
		kp->deferred_clauses = lappend(kp->deferred_clauses, copyObject(clause));
	}
	kp->deferred_quals = conjuncts;
	return true;
}

/*
 * PostgreSQL's plan of the subquery evaluates its conditions for each outer
 * row in evaluation_order, after the ones an index or the partitioning
 * applies, and those of a view it does not pull up (a security barrier)
 * before the ones above it. The node's inner scan evaluates the conditions
 * that do not refer to the outer row for every row of the relation
 * (knn_scan_plan.c). So one that may fail for some row (contain_leaked_vars:
 * a function that is not leakproof) must come before every condition on
 * the outer row (a group equality, self-exclusion or radius): after one,
 * PostgreSQL evaluates it only for the rows that condition keeps, and it
 * would fail here alone (review r15exprrev) -- unless the node evaluates
 * it, and those after it, for those rows only: after a self-exclusion
 * (evaluate_after_exclusion). sq: the subquery as written (NULL for a
 * view or subquery under it); outer_params: the outer row's parameters;
 * *outer_seen: a condition on the outer row came before.
 */
static bool
inner_conditions_come_first(PlannerInfo *subroot, Query *sq, List *outer_params,
							bool *outer_seen, KnnJoinPath *kp)
{
	RelOptInfo *rel = single_base_relation(subroot);
	ScanCondition *order;

	if (rel == NULL)
		return true;
	if (rel->rtekind == RTE_SUBQUERY && rel->subroot != NULL &&
		!inner_conditions_come_first(rel->subroot, NULL, outer_params, outer_seen, kp))
		return false;
	if (rel->rtekind == RTE_RELATION && outer_equality_applied_first(subroot, rel, outer_params))
		*outer_seen = true;
	order = evaluation_order(subroot, rel->baserestrictinfo);
	for (int i = 0; i < list_length(rel->baserestrictinfo); i++)
	{
		Node	   *clause = (Node *) order[i].rinfo->clause;

		if (contain_exec_param(clause, outer_params))
			*outer_seen = true;
		else if (*outer_seen && contain_leaked_vars(clause))
			return evaluate_after_exclusion(subroot, sq, rel, order, i, kp) ||
				knn_scan_reject("a condition of the subquery's WHERE that may fail (a function that is not leakproof) comes after one on the outer row, which PostgreSQL evaluates first (the cheaper one, or an equality an index or the partitioning applies), and it is not one the node can evaluate after a self-exclusion alone (of its own WHERE, over a table PostgreSQL scans sequentially)");
	}
	return true;
}

static void
knn_join_pathlist_hook(PlannerInfo *root, RelOptInfo *joinrel,
					   RelOptInfo *outerrel, RelOptInfo *innerrel,
					   JoinType jointype, JoinPathExtraData *extra)
{
	RangeTblEntry *rte;
	RelOptInfo *target_rel;
	Path	   *outer_path;
	KnnJoinPath *kp;
	bool		approximate;
	bool		outer_seen = false;

	if (prev_join_pathlist_hook)
		prev_join_pathlist_hook(root, joinrel, outerrel, innerrel, jointype, extra);

	if (!knn_gpu_enable_knn_join || joinrel->reloptkind != RELOPT_JOINREL ||
		IS_DUMMY_REL(innerrel) || IS_DUMMY_REL(outerrel))
		return;
	if (innerrel->reloptkind != RELOPT_BASEREL ||
		innerrel->rtekind != RTE_SUBQUERY || innerrel->subroot == NULL)
	{
		try_plain_radius_join(root, joinrel, outerrel, innerrel, jointype, extra);
		return;
	}

	/*
	 * A lateral subquery whose outer references this join's outer side
	 * provides (other join orders are considered too, so no message).
	 */
	rte = planner_rt_fetch(innerrel->relid, root);
	if (rte->rtekind != RTE_SUBQUERY || !rte->lateral || rte->subquery == NULL ||
		bms_is_empty(innerrel->lateral_relids) ||
		!bms_is_subset(innerrel->lateral_relids, outerrel->relids))
		return;

	kp = palloc0(sizeof(KnnJoinPath));
	if (knn_scan_recognise_subquery(root, rte->subquery, kp) == 0)
		return;
	kp->rewritten_from = knn_scan_rewritten_from(rte->subquery);
	kp->rewrite_id = knn_scan_rewrite_id(rte->subquery);
	if (!bms_is_empty(joinrel->lateral_relids))
	{
		knn_scan_reject("the join itself references a relation outside it (a LATERAL reference from further in)");
		return;
	}
	outer_path = outerrel->cheapest_total_path;
	if (outer_path == NULL || outer_path->param_info != NULL)
	{
		knn_scan_reject("the outer side has no unparameterized path");
		return;
	}
	if (!check_join(root, joinrel, outerrel, innerrel, jointype, extra, outer_path, kp))
		return;

	/* The inner relation as the subquery planned it, for costs and indexes. */
	target_rel = scanned_relation(innerrel->subroot);
	if (target_rel == NULL)
	{
		knn_scan_reject("the subquery's planning has no single table to scan");
		return;
	}
	if (!inner_conditions_come_first(innerrel->subroot, rte->subquery, outer_row_params(innerrel),
									 &outer_seen, kp))
		return;
	approximate = has_approximate_index(target_rel, kp);
	if (approximate && !knn_gpu_exact_over_index)
	{
		knn_scan_reject("an approximate index answers the subquery (knn_gpu.exact_over_index is off)");
		return;
	}

	build_path(root, joinrel, innerrel, outer_path, target_rel, kp);

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

/*
 * A top-k subquery written as a sub-select (in EXISTS, IN or a select
 * list) is planned on its own and run once per outer row: there is no join
 * for the KNN Join to replace. Says so, and how to write it: for a
 * sub-select that is itself the top-k query (planned while its parent
 * still preprocesses its expressions, before the parent's relations exist;
 * a LATERAL subquery is planned among them), and for a top-k subquery in
 * FROM that references a query further out than the one it is a relation of.
 */
static void
knn_sub_select_pathlist_hook(PlannerInfo *root, RelOptInfo *rel, Index rti,
							 RangeTblEntry *rte)
{
	if (prev_rel_pathlist_hook)
		prev_rel_pathlist_hook(root, rel, rti, rte);
	if (!knn_gpu_enable_knn_join || rel->reloptkind != RELOPT_BASEREL)
		return;
	if ((rte->rtekind == RTE_RELATION && root->parent_root != NULL &&
		 root->parent_root->simple_rel_array == NULL &&
		 root->parent_root->plan_params != NIL && root->parse->limitCount != NULL &&
		 knn_scan_orders_by_distance(root->parse)) ||
		(rte->rtekind == RTE_SUBQUERY && rte->subquery != NULL &&
		 knn_scan_top_k_reaches_up(rte->subquery, 2)))
		knn_scan_reject("the top-k subquery is inside a sub-select (in EXISTS, IN or a select list), not a join: write it as CROSS JOIN LATERAL or LEFT JOIN LATERAL");
}

void
knn_scan_register(void)
{
	knn_scan_register_plan();
	knn_scan_window_register();
	prev_join_pathlist_hook = set_join_pathlist_hook;
	set_join_pathlist_hook = knn_join_pathlist_hook;
	prev_rel_pathlist_hook = set_rel_pathlist_hook;
	set_rel_pathlist_hook = knn_sub_select_pathlist_hook;
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
