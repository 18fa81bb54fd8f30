/*
 * knn_scan_shape.c -- is a LATERAL subquery a top-k distance query the KNN
 * Join can run? Checked on the subquery's parse tree:
 *
 *     SELECT <expressions of t>, <the distance> FROM <one relation> t
 *     [WHERE <conditions on t> [AND t.g = q.g ...] [AND t.id <> q.id]
 *            [AND <the distance> < (or <=) <run-time constant>]]
 *     ORDER BY <distance between a column of t and a vector of the outer query>
 *              [, <expressions of t>, ...]
 *     LIMIT <run-time constant> [OFFSET <run-time constant>]
 *     (or OFFSET ... FETCH FIRST <run-time constant> ROWS ONLY | WITH TIES)
 *
 * (With the radius condition, LIMIT is optional: every row within it.) The
 * relation is a table, or a view or subquery in FROM that selects from one
 * (is_simple_relation_query); the outer vector is a column of the outer
 * query or an expression of its columns.
 *
 * Anything else keeps PostgreSQL's plan. For subqueries ordered by a
 * distance, the reason is logged at DEBUG1 ("KNN Join not used: ...").
 */
#include "postgres.h"

#include "catalog/pg_operator.h"
#include "catalog/pg_type.h"
#include "nodes/makefuncs.h"
#include "nodes/nodeFuncs.h"
#include "optimizer/cost.h"
#include "optimizer/optimizer.h"
#include "optimizer/tlist.h"
#include "parser/parsetree.h"
#include "rewrite/rewriteManip.h"
#include "access/stratnum.h"
#include "utils/lsyscache.h"
#include "utils/typcache.h"

#include "knn_keys.h"
#include "knn_scan.h"

bool
knn_scan_reject(const char *reason)
{
	elog(DEBUG1, "KNN Join not used: %s", reason);
	return false;
}

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

/*
 * Does a query reference a level above its own, anywhere in it (its
 * sub-queries' references counted from their own levels)? *depth: the
 * sub-query levels entered so far.
 */
static bool
query_references_outside_walker(Node *node, int *depth)
{
	if (node == NULL)
		return false;
	if (IsA(node, Var))
		return (int) ((Var *) node)->varlevelsup > *depth;
	if (IsA(node, PlaceHolderVar))
		return (int) ((PlaceHolderVar *) node)->phlevelsup > *depth;
	if (IsA(node, Aggref))
		return (int) ((Aggref *) node)->agglevelsup > *depth;
	if (IsA(node, GroupingFunc))
		return (int) ((GroupingFunc *) node)->agglevelsup > *depth;
	if (IsA(node, Query))
	{
		bool		found;

		(*depth)++;
		found = query_tree_walker((Query *) node, query_references_outside_walker, depth, 0);
		(*depth)--;
		return found;
	}
	return expression_tree_walker(node, query_references_outside_walker, depth);
}

static bool
query_references_outside(Query *q)
{
	int			depth = 0;

	return query_tree_walker(q, query_references_outside_walker, &depth, 0);
}

/* The expression under relabellings and collations (nothing computes those). */
static Node *
under_relabellings(Node *node)
{
	for (;;)
	{
		if (node != NULL && IsA(node, RelabelType))
			node = (Node *) ((RelabelType *) node)->arg;
		else if (node != NULL && IsA(node, CollateExpr))
			node = (Node *) ((CollateExpr *) node)->arg;
		else
			return node;
	}
}

/*
 * May the executor compute the value for a row where PostgreSQL would not
 * (an outer row whose subquery sorts nothing, an inner row that a WHERE
 * clause or the LIMIT would have dropped first)? Only where doing so can
 * neither fail nor cost more than PostgreSQL spends: a column, a constant,
 * or a relabelling of one (no function runs).
 */
static bool
evaluates_nothing(Node *node)
{
	node = under_relabellings(node);
	return node != NULL && (IsA(node, Var) || IsA(node, Const));
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
 * A LIMIT or OFFSET we can evaluate once when the node starts: constants,
 * $n parameters and stable or immutable functions of them.
 */
bool
knn_scan_is_run_time_constant(Node *node)
{
	return node != NULL && !varies_within_query_walker(node, NULL) &&
		!contain_volatile_functions(node);
}

static bool
contains_distance_walker(Node *node, void *context)
{
	KnnMetric	metric;

	if (node == NULL)
		return false;
	if (IsA(node, OpExpr) && knn_distance_operator_metric(((OpExpr *) node)->opno, &metric))
		return true;
	return expression_tree_walker(node, contains_distance_walker, context);
}

bool
knn_scan_contains_distance(Node *node)
{
	return contains_distance_walker(node, NULL);
}

static bool looks_like_top_k(Query *sq);

bool
knn_scan_orders_by_distance(Query *sq)
{
	return looks_like_top_k(sq);
}

static bool
references_level_walker(Node *node, void *levels)
{
	if (node == NULL)
		return false;
	if (IsA(node, Var))
		return ((Var *) node)->varlevelsup >= *(Index *) levels;
	return expression_tree_walker(node, references_level_walker, levels);
}

bool
knn_scan_top_k_reaches_up(Query *sq, Index levels)
{
	TargetEntry *tle;

	if (sq->commandType != CMD_SELECT || sq->limitCount == NULL || sq->sortClause == NIL ||
		!looks_like_top_k(sq))
		return false;
	tle = get_sortgroupclause_tle(linitial_node(SortGroupClause, sq->sortClause), sq->targetList);
	return references_level_walker((Node *) tle->expr, &levels);
}

/* Is some ORDER BY key a distance? Only then do we say why we decline. */
static bool
looks_like_top_k(Query *sq)
{
	ListCell   *lc;

	foreach(lc, sq->sortClause)
	{
		TargetEntry *tle = get_sortgroupclause_tle(lfirst_node(SortGroupClause, lc),
												   sq->targetList);

		if (contains_distance_walker((Node *) tle->expr, NULL))
			return true;
	}
	return false;
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

/* The clauses we cannot run at all. */
static bool
recognise_clauses(Query *sq)
{
	if (sq->setOperations != NULL)
		return knn_scan_reject("the subquery is a set operation");
	if (sq->groupClause != NIL || sq->groupingSets != NIL || sq->havingQual != NULL ||
		sq->hasAggs)
		return knn_scan_reject("the subquery aggregates");
	if (sq->hasWindowFuncs || sq->windowClause != NIL)
		return knn_scan_reject("the subquery has window functions");
	if (sq->hasTargetSRFs)
		return knn_scan_reject("the subquery has a set-returning function in its select list");
	if (sq->hasSubLinks)
		return knn_scan_reject("the subquery has a sub-select");
	if (sq->hasDistinctOn || sq->distinctClause != NIL)
		return knn_scan_reject("the subquery has DISTINCT");
	if (sq->hasForUpdate || sq->rowMarks != NIL)
		return knn_scan_reject("the subquery locks rows");
	if (sq->cteList != NIL || sq->hasRecursive || sq->hasModifyingCTE)
		return knn_scan_reject("the subquery has WITH");
	if (sq->limitOption != LIMIT_OPTION_COUNT && sq->limitOption != LIMIT_OPTION_WITH_TIES)
		return knn_scan_reject("the subquery's LIMIT is of an unknown kind");
	return true;
}

/*
 * A view or a subquery in FROM that the inner scan may stand for: "SELECT
 * <expressions> FROM <one table, or one such view or subquery> [WHERE
 * ...]", the same rows every time it runs in the statement (no volatile
 * function, no LIMIT, no TABLESAMPLE) and nothing that combines rows (no
 * aggregate, window, DISTINCT, set operation, set-returning function or
 * sub-select). Such a subquery is planned by PostgreSQL as part of the
 * inner scan (knn_scan_plan.c), so its security barriers, row-level
 * security and permissions are PostgreSQL's. Sets *reason when not.
 */
static bool
is_simple_relation_query(Query *q, const char **reason)
{
	RangeTblEntry *rte;

	if (q->commandType != CMD_SELECT || q->utilityStmt != NULL || q->setOperations != NULL ||
		q->groupClause != NIL || q->groupingSets != NIL || q->havingQual != NULL ||
		q->hasAggs || q->hasWindowFuncs || q->hasTargetSRFs || q->hasSubLinks ||
		q->hasDistinctOn || q->distinctClause != NIL || q->cteList != NIL ||
		q->rowMarks != NIL || q->hasForUpdate)
	{
		*reason = "the subquery reads a view or subquery that is not a plain selection from one table (no aggregate, window, DISTINCT, set operation, sub-select, WITH or locking)";
		return false;
	}
	if (q->limitCount != NULL || q->limitOffset != NULL)
	{
		*reason = "the subquery reads a view or subquery with LIMIT or OFFSET";
		return false;
	}
	if (contain_volatile_functions((Node *) q))
	{
		*reason = "the subquery reads a view or subquery with a volatile function";
		return false;
	}
	/* (the inner scan is planned alone: nothing of an outer row reaches it) */
	if (query_references_outside(q))
	{
		*reason = "the subquery reads a view or subquery that references the outer query";
		return false;
	}
	if (q->jointree == NULL || list_length(q->jointree->fromlist) != 1 ||
		!IsA(linitial(q->jointree->fromlist), RangeTblRef))
	{
		*reason = "the subquery reads a view or subquery of more than one relation";
		return false;
	}
	rte = rt_fetch(linitial_node(RangeTblRef, q->jointree->fromlist)->rtindex, q->rtable);
	if (rte->rtekind == RTE_RELATION && rte->tablesample == NULL)
		return true;
	if (rte->rtekind == RTE_SUBQUERY && rte->subquery != NULL && !rte->lateral)
		return is_simple_relation_query(rte->subquery, reason);
	*reason = "the subquery reads a view or subquery of something other than a table";
	return false;
}

/*
 * FROM one relation: a table, or a view or subquery over one
 * (is_simple_relation_query). Its RangeTblRef, or NULL.
 */
static RangeTblRef *
recognise_relation(Query *sq)
{
	RangeTblRef *rtr;
	RangeTblEntry *rte;
	const char *reason = NULL;

	if (list_length(sq->rtable) != 1 || sq->jointree == NULL ||
		list_length(sq->jointree->fromlist) != 1 ||
		!IsA(linitial(sq->jointree->fromlist), RangeTblRef))
	{
		knn_scan_reject("the subquery reads more than one relation");
		return NULL;
	}
	rtr = linitial_node(RangeTblRef, sq->jointree->fromlist);
	rte = rt_fetch(rtr->rtindex, sq->rtable);
	if (rte->rtekind == RTE_RELATION && rte->tablesample == NULL)
		return rtr;
	if (rte->rtekind == RTE_RELATION)
	{
		knn_scan_reject("the subquery reads a table with TABLESAMPLE");
		return NULL;
	}
	if (rte->rtekind != RTE_SUBQUERY || rte->subquery == NULL || rte->lateral)
	{
		knn_scan_reject("the subquery reads something other than a table, a view or a subquery");
		return NULL;
	}
	if (!is_simple_relation_query(rte->subquery, &reason))
	{
		knn_scan_reject(reason);
		return NULL;
	}
	return rtr;
}

/*
 * The column of the table under the relation that the target vector is, 0
 * when a view or subquery computes it (an expression), for the
 * approximate-index check.
 */
static AttrNumber
relation_column(Query *sq, Index rtindex, AttrNumber attno)
{
	for (;;)
	{
		RangeTblEntry *rte = rt_fetch(rtindex, sq->rtable);
		TargetEntry *tle;
		Var		   *var;

		if (rte->rtekind == RTE_RELATION)
			return attno;
		tle = get_tle_by_resno(rte->subquery->targetList, attno);
		var = (Var *) (tle != NULL ? tle->expr : NULL);
		if (var == NULL || !IsA(var, Var) || var->varlevelsup != 0 || var->varattno <= 0)
			return 0;
		sq = rte->subquery;
		rtindex = var->varno;
		attno = var->varattno;
	}
}

/* The column types the node joins (the operator decided the metric). */
static bool
is_joinable_kind(KnnVectorKind kind)
{
	return kind == KNN_VECTOR_TYPE || kind == KNN_VECTOR_HALFVEC || kind == KNN_VECTOR_BIT;
}

/*
 * May the expression be the query vector: an expression of the outer query
 * alone (a column, or e.g. a cast of one, or a function of several), with
 * no volatile function, sub-select or set-returning function? Then the
 * node computes it from the outer row, for the outer rows PostgreSQL's
 * plan computes it for (knn_scan_exec.c).
 */
static bool
not_outer_operand_walker(Node *node, void *has_var)
{
	if (node == NULL)
		return false;
	if (IsA(node, Var))
	{
		*(bool *) has_var = true;
		return ((Var *) node)->varlevelsup != 1;
	}
	if (IsA(node, PlaceHolderVar) || IsA(node, Aggref) || IsA(node, GroupingFunc) ||
		IsA(node, SubLink) || IsA(node, SubPlan) || IsA(node, WindowFunc))
		return true;
	return expression_tree_walker(node, not_outer_operand_walker, has_var);
}

static bool
is_outer_operand(Node *node)
{
	bool		has_var = false;

	return !not_outer_operand_walker(node, &has_var) && has_var &&
		!contain_volatile_functions(node) && !expression_returns_set(node);
}

/*
 * The query vector as the node computes it: the outer operand at the outer
 * query's level, simplified as PostgreSQL's planning of the subquery
 * simplifies it (named and default arguments expanded, SQL functions
 * inlined, constants folded: the executor runs only such expressions).
 * A column, also under relabellings to its type from a domain over it,
 * is that column of the outer rows; anything else an expression the node
 * evaluates (KNN_EXPR_QUERY_VECTOR).
 */
static Expr *
query_vector_of(PlannerInfo *root, Node *query, Oid type)
{
	Node	   *expr = copyObject(query);
	Node	   *under;

	IncrementVarSublevelsUp(expr, -1, 1);
	expr = eval_const_expressions(root, expr);
	under = under_relabellings(expr);
	if (IsA(under, Var) && getBaseType(((Var *) under)->vartype) == type)
		return (Expr *) under;
	return (Expr *) expr;
}

/*
 * The first ORDER BY key: ascending, NULLS LAST (float8's "<"), a distance
 * operator (knn_catalog.h) between a column of the relation and a vector
 * of the outer query (a column, or an expression of its columns), each of
 * the operator's declared input type. Returns its OpExpr or NULL.
 */
static OpExpr *
recognise_distance(PlannerInfo *root, Query *sq, RangeTblRef *rtr, KnnJoinPath *kp)
{
	SortGroupClause *sort = linitial_node(SortGroupClause, sq->sortClause);
	TargetEntry *tle = get_sortgroupclause_tle(sort, sq->targetList);
	OpExpr	   *distance = (OpExpr *) tle->expr;
	Node	   *left;
	Node	   *right;
	Node	   *query;
	Oid			left_type;
	Oid			right_type;

	if (!IsA(distance, OpExpr) || list_length(distance->args) != 2 ||
		distance->opresulttype != FLOAT8OID ||
		!knn_distance_operator_metric(distance->opno, &kp->metric))
	{
		knn_scan_reject("the first ORDER BY key is not a distance operator");
		return NULL;
	}
	if (sort->sortop != Float8LessOperator || sort->nulls_first)
	{
		knn_scan_reject("the distance is not sorted ASC NULLS LAST");
		return NULL;
	}
	left = linitial(distance->args);
	right = lsecond(distance->args);
	kp->target_is_left = IsA(left, Var) && ((Var *) left)->varlevelsup == 0;
	if (!kp->target_is_left && !(IsA(right, Var) && ((Var *) right)->varlevelsup == 0))
	{
		knn_scan_reject("the distance is not between a column of the relation and the outer query");
		return NULL;
	}
	kp->target_vector = (Var *) (kp->target_is_left ? left : right);
	query = kp->target_is_left ? right : left;
	/* (knn_distance_operator_metric: both operands are of one type) */
	op_input_types(distance->opno, &left_type, &right_type);
	if (kp->target_vector->varno != rtr->rtindex || kp->target_vector->varattno <= 0 ||
		!is_joinable_kind(knn_vector_kind(kp->target_vector->vartype)) ||
		kp->target_vector->vartype != (kp->target_is_left ? left_type : right_type) ||
		!is_outer_operand(query) ||
		exprType(query) != (kp->target_is_left ? right_type : left_type))
	{
		knn_scan_reject("the distance is not between a vector column of the relation and a vector of the outer query (a column, or an expression of its columns without volatile or set-returning functions or sub-selects), each of the operator's type");
		return NULL;
	}
	kp->query_vector = query_vector_of(root, query, exprType(query));
	kp->target_relation_column = relation_column(sq, rtr->rtindex, kp->target_vector->varattno);
	kp->distance_operator = distance->opno;
	return distance;
}

/*
 * The expression with each column of a subquery in FROM (a view, say)
 * replaced by what the subquery computes for it, and a whole-row reference
 * by all its columns: the inner scan computes those for every row.
 */
static Node *
with_subquery_columns(Node *node, Query *sq)
{
	if (node == NULL)
		return NULL;
	if (IsA(node, Var) && ((Var *) node)->varlevelsup == 0)
	{
		Var		   *var = (Var *) node;
		RangeTblEntry *rte = rt_fetch(var->varno, sq->rtable);
		List	   *columns = NIL;
		ListCell   *lc;

		if (rte->rtekind != RTE_SUBQUERY || rte->subquery == NULL)
			return node;
		foreach(lc, rte->subquery->targetList)
		{
			TargetEntry *tle = lfirst_node(TargetEntry, lc);
			Node	   *column;

			if (tle->resjunk || (var->varattno != 0 && tle->resno != var->varattno))
				continue;
			column = with_subquery_columns((Node *) tle->expr, rte->subquery);
			if (var->varattno != 0)
				return column;
			columns = lappend(columns, column);
		}
		if (var->varattno != 0)
			return node;
		{
			RowExpr    *row = makeNode(RowExpr);

			row->args = columns;
			row->row_typeid = RECORDOID;
			row->row_format = COERCE_IMPLICIT_CAST;
			row->location = -1;
			return (Node *) row;
		}
	}
	return expression_tree_mutator(node, with_subquery_columns, sq);
}

/*
 * May the inner scan compute a select-list entry or an ORDER BY key for
 * every row of the relation, as it does? PostgreSQL computes it below the
 * sort for the rows its WHERE keeps, except that a costly select-list
 * entry under a LIMIT it computes after the LIMIT, for the k rows kept
 * (make_sort_input_target: more than 10 cpu_operator_cost). So: the same
 * rows and calls where the WHERE has no conjunct of the outer row's (the
 * inner scan keeps what PostgreSQL's scan keeps) and the expression is a
 * sort key or cheap; a column or a constant anywhere. Elsewhere a function
 * that fails for a row PostgreSQL never computes it for would fail here
 * alone.
 */
static bool
computed_where_postgresql_computes(PlannerInfo *root, Query *sq, Node *expr, bool sort_key,
								   const KnnJoinPath *kp)
{
	QualCost	cost;

	/*
	 * A column of a subquery in FROM is judged as what the subquery
	 * computes (review r13group: a view's "10 / x" failed for rows
	 * PostgreSQL's plan never computed it for).
	 */
	expr = with_subquery_columns(expr, sq);
	if (evaluates_nothing(expr))
		return true;
	if (kp->radius_qual != NULL || kp->exclude_qual != NULL || kp->group_targets != NIL)
		return false;
	if (sort_key)
		return true;
	cost_qual_eval_node(&cost, expr, root);
	return cost.per_tuple <= 10 * cpu_operator_cost;
}

/*
 * The ORDER BY keys after the distance break its ties: expressions of the
 * relation alone, evaluated by the inner scan plan, whose ORDER BY they
 * become (in the user's own SortGroupClauses, so the same operators,
 * directions and collations). The engine breaks ties by scan order.
 */
static bool
recognise_tie_order(PlannerInfo *root, Query *sq, const KnnJoinPath *kp)
{
	ListCell   *lc;

	for_each_from(lc, sq->sortClause, 1)
	{
		TargetEntry *tle = get_sortgroupclause_tle(lfirst_node(SortGroupClause, lc),
												   sq->targetList);

		if (references_upper_levels((Node *) tle->expr))
			return knn_scan_reject("an ORDER BY key after the distance references the outer query");
		if (contain_volatile_functions((Node *) tle->expr))
			return knn_scan_reject("an ORDER BY key after the distance is volatile");
		if (!computed_where_postgresql_computes(root, sq, (Node *) tle->expr, true, kp))
			return knn_scan_reject("an ORDER BY key after the distance is an expression and the subquery's WHERE references the outer query");
		/* WITH TIES compares the keys by their equality */
		if (sq->limitOption == LIMIT_OPTION_WITH_TIES &&
			!OidIsValid(lfirst_node(SortGroupClause, lc)->eqop))
			return knn_scan_reject("an ORDER BY key after the distance has no equality operator for WITH TIES");
	}
	return true;
}

/*
 * "t.id <> q.id": the negator of the default equality (type cache) of both
 * columns' type, which has a hash function, so that values map to keys.
 */
static bool
recognise_exclusion(Node *qual, RangeTblRef *rtr, KnnJoinPath *kp)
{
	OpExpr	   *op = (OpExpr *) qual;
	Var		   *left;
	Var		   *right;
	Var		   *target;
	Var		   *query;

	if (!IsA(op, OpExpr) || list_length(op->args) != 2 ||
		!IsA(linitial(op->args), Var) || !IsA(lsecond(op->args), Var))
		return false;
	left = linitial(op->args);
	right = lsecond(op->args);
	target = left->varlevelsup == 0 ? left : right;
	query = left->varlevelsup == 0 ? right : left;
	if (target->varlevelsup != 0 || query->varlevelsup != 1 ||
		target->varno != rtr->rtindex || target->varattno <= 0 || query->varattno <= 0 ||
		target->vartype != query->vartype ||
		!knn_keys_supported(target->vartype, op->opno))
		return false;
	kp->exclude_qual = qual;
	kp->exclude_target = target;
	kp->exclude_query = copyObject(query);
	kp->exclude_query->varlevelsup = 0;
	kp->exclude_collation = op->inputcollid;
	return true;
}

/* The expression under binary-compatible relabellings (a domain to its base). */
Node *
knn_scan_without_relabel(Node *node)
{
	while (node != NULL && IsA(node, RelabelType))
		node = (Node *) ((RelabelType *) node)->arg;
	return node;
}

/*
 * "t.g = q.g": the default equality (type cache) of both columns' type,
 * which has a hash function consistent with it, so that values map to
 * group ids (knn_group_keys.h).
 */
static bool
recognise_group(Node *qual, RangeTblRef *rtr, KnnJoinPath *kp)
{
	OpExpr	   *op = (OpExpr *) qual;
	Var		   *left;
	Var		   *right;
	Var		   *target;
	Var		   *query;
	TypeCacheEntry *entry;

	if (!IsA(op, OpExpr) || list_length(op->args) != 2)
		return false;
	/* a domain's column is relabelled to its base type: look through that */
	left = (Var *) knn_scan_without_relabel(linitial(op->args));
	right = (Var *) knn_scan_without_relabel(lsecond(op->args));
	if (!IsA(left, Var) || !IsA(right, Var))
		return false;
	target = left->varlevelsup == 0 ? left : right;
	query = left->varlevelsup == 0 ? right : left;
	if (target->varlevelsup != 0 || query->varlevelsup != 1 ||
		target->varno != rtr->rtindex || target->varattno <= 0 || query->varattno <= 0 ||
		target->vartype != query->vartype || !knn_keys_hashable(target->vartype))
		return false;
	entry = lookup_type_cache(target->vartype, TYPECACHE_EQ_OPR);
	if (entry->eq_opr != op->opno)
		return false;
	query = copyObject(query);
	query->varlevelsup = 0;
	kp->group_quals = lappend(kp->group_quals, qual);
	kp->group_targets = lappend(kp->group_targets, target);
	kp->group_queries = lappend(kp->group_queries, query);
	kp->group_collations = lappend_oid(kp->group_collations, op->inputcollid);
	return true;
}

/*
 * The float8 comparison "<" or "<=" (*inclusive) that opno is, read with
 * the distance on its left (*distance_left) or right ("r > d" is "d < r"),
 * by catalog identity: float8's default btree operator family.
 */
static bool
radius_comparison(Oid opno, bool distance_left, bool *inclusive)
{
	TypeCacheEntry *entry = lookup_type_cache(FLOAT8OID, TYPECACHE_BTREE_OPFAMILY);
	int			below = distance_left ? BTLessStrategyNumber : BTGreaterStrategyNumber;
	int			at_most = distance_left ? BTLessEqualStrategyNumber : BTGreaterEqualStrategyNumber;

	if (!OidIsValid(entry->btree_opf))
		return false;
	if (opno == get_opfamily_member(entry->btree_opf, FLOAT8OID, FLOAT8OID, below))
		*inclusive = false;
	else if (opno == get_opfamily_member(entry->btree_opf, FLOAT8OID, FLOAT8OID, at_most))
		*inclusive = true;
	else
		return false;
	return true;
}

/*
 * "<the distance> < r" or "<= r" (or "r > <the distance>", ">="), the
 * distance being the ORDER BY's and r a run-time constant: the radius.
 */
static bool
recognise_radius(Node *qual, OpExpr *distance, KnnJoinPath *kp)
{
	OpExpr	   *op = (OpExpr *) qual;
	bool		distance_left;
	bool		inclusive;
	Node	   *radius;

	if (!IsA(op, OpExpr) || list_length(op->args) != 2)
		return false;
	if (is_same_distance(linitial(op->args), distance))
		distance_left = true;
	else if (is_same_distance(lsecond(op->args), distance))
		distance_left = false;
	else
		return false;
	radius = distance_left ? lsecond(op->args) : linitial(op->args);
	if (!radius_comparison(op->opno, distance_left, &inclusive) ||
		exprType(radius) != FLOAT8OID || !knn_scan_is_run_time_constant(radius))
		return false;
	kp->radius_qual = qual;
	kp->radius = (Expr *) radius;
	kp->radius_inclusive = inclusive;
	return true;
}

/*
 * WHERE: conditions on the relation alone, same result every time, group
 * equalities, at most one self-exclusion and at most one radius.
 */
static bool
recognise_where(Query *sq, RangeTblRef *rtr, OpExpr *distance, KnnJoinPath *kp)
{
	ListCell   *lc;

	if (contain_volatile_functions(sq->jointree->quals))
		return knn_scan_reject("the subquery's WHERE is volatile");
	foreach(lc, make_ands_implicit((Expr *) sq->jointree->quals))
	{
		Node	   *qual = lfirst(lc);

		if (!references_upper_levels(qual) || recognise_group(qual, rtr, kp))
			continue;
		if (kp->radius_qual == NULL && recognise_radius(qual, distance, kp))
			continue;
		if (kp->exclude_qual == NULL && recognise_exclusion(qual, rtr, kp))
			continue;
		if (contains_distance_walker(qual, NULL))
			return knn_scan_reject("the subquery's WHERE uses a distance other than in one \"<the ORDER BY distance> < (or <=) <constant or parameter>\"");
		return knn_scan_reject("the subquery's WHERE references the outer query other than by \"inner column = outer column\" and one \"inner column <> outer column\", of one type with default hashable equality");
	}
	if (kp->radius_qual == NULL && sq->limitCount == NULL)
		return knn_scan_reject("the subquery has no LIMIT (and no radius: \"distance < constant\")");
	return true;
}

/*
 * The select list: the distance (either operand order), or expressions of
 * the relation that the inner scan may compute for every row of it
 * (computed_where_postgresql_computes).
 */
static bool
recognise_select_list(PlannerInfo *root, Query *sq, OpExpr *distance, KnnJoinPath *kp)
{
	ListCell   *lc;

	kp->distance_columns = NIL;
	foreach(lc, sq->targetList)
	{
		TargetEntry *tle = lfirst_node(TargetEntry, lc);

		if ((Expr *) distance == tle->expr || is_same_distance((Node *) tle->expr, distance))
		{
			if (!tle->resjunk)
				kp->distance_columns = lappend_int(kp->distance_columns, tle->resno);
			continue;
		}
		if (references_upper_levels((Node *) tle->expr))
			return knn_scan_reject("the subquery's select list references the outer query other than in the distance");
		if (contain_volatile_functions((Node *) tle->expr))
			return knn_scan_reject("the subquery's select list is volatile");
		if (!tle->resjunk &&
			!computed_where_postgresql_computes(root, sq, (Node *) tle->expr,
												tle->ressortgroupref != 0, kp))
			return knn_scan_reject("the subquery's select list computes a costly expression, or one where its WHERE references the outer query");
	}
	return true;
}

/*
 * A plain join's clause "a.v <op> b.v < r" (or <=, or "r > ..."): a
 * distance operator between a column of the inner relations (inner_relids)
 * and one of the outer ones, of one vector type, and r a run-time
 * constant. (A LATERAL subquery without ORDER BY and LIMIT is pulled up
 * into such a join.) Fills the distance and radius fields of kp.
 */
bool
knn_scan_recognise_radius_clause(Expr *clause, Relids inner_relids, Relids outer_relids,
								 KnnJoinPath *kp)
{
	OpExpr	   *op = (OpExpr *) clause;
	OpExpr	   *distance;
	Node	   *radius;
	Var		   *left;
	Var		   *right;
	bool		distance_left;
	bool		inclusive;
	KnnMetric	metric;

	if (!IsA(op, OpExpr) || list_length(op->args) != 2)
		return false;
	distance_left = IsA(linitial(op->args), OpExpr);
	distance = (OpExpr *) (distance_left ? linitial(op->args) : lsecond(op->args));
	radius = distance_left ? lsecond(op->args) : linitial(op->args);
	if (!IsA(distance, OpExpr) || list_length(distance->args) != 2 ||
		distance->opresulttype != FLOAT8OID ||
		!knn_distance_operator_metric(distance->opno, &metric) ||
		!IsA(linitial(distance->args), Var) || !IsA(lsecond(distance->args), Var) ||
		!radius_comparison(op->opno, distance_left, &inclusive) ||
		exprType(radius) != FLOAT8OID || !knn_scan_is_run_time_constant(radius))
		return false;
	left = linitial(distance->args);
	right = lsecond(distance->args);
	if (left->varlevelsup != 0 || right->varlevelsup != 0 ||
		left->varattno <= 0 || right->varattno <= 0 || left->vartype != right->vartype ||
		!is_joinable_kind(knn_vector_kind(left->vartype)))
		return false;
	if (bms_is_member(left->varno, inner_relids) && bms_is_member(right->varno, outer_relids))
		kp->target_is_left = true;
	else if (bms_is_member(right->varno, inner_relids) && bms_is_member(left->varno, outer_relids))
		kp->target_is_left = false;
	else
		return false;
	kp->metric = metric;
	kp->distance_operator = distance->opno;
	kp->target_vector = kp->target_is_left ? left : right;
	kp->query_vector = (Expr *) (kp->target_is_left ? right : left);
	kp->radius_qual = (Node *) clause;
	kp->radius = (Expr *) radius;
	kp->radius_inclusive = inclusive;
	return true;
}

/*
 * With a radius, the subquery's WHERE computes the query vector, and
 * PostgreSQL's scan evaluates its conditions cheapest first (after
 * row-level security's: order_qual_clauses). The node computes an
 * expression for the outer rows that meet an inner row passing the other
 * conditions (knn_scan_exec.c): the same rows only when the radius comes
 * after every other condition. So: a table (a view's conditions would join
 * the list unseen here) and every other condition strictly cheaper than
 * the radius, each costed as the subquery's planning costs it (after the
 * same simplification). A column needs none of this: reading one cannot
 * fail.
 */
static bool
radius_evaluated_last(PlannerInfo *root, Query *sq, RangeTblRef *rtr, const KnnJoinPath *kp)
{
	Node	   *quals;
	ListCell   *lc;
	Cost		radius_cost = -1;
	Cost		others_cost = -1;

	if (kp->radius_qual == NULL || IsA(kp->query_vector, Var))
		return true;
	if (rt_fetch(rtr->rtindex, sq->rtable)->rtekind != RTE_RELATION)
		return knn_scan_reject("the query vector is an expression and the radius is over a view or subquery, whose conditions PostgreSQL may evaluate after the radius");
	quals = eval_const_expressions(root, copyObject(sq->jointree->quals));
	foreach(lc, make_ands_implicit((Expr *) quals))
	{
		QualCost	cost;

		cost_qual_eval_node(&cost, lfirst(lc), root);
		if (knn_scan_contains_distance(lfirst(lc)))
			radius_cost = cost.per_tuple;
		else
			others_cost = Max(others_cost, cost.per_tuple);
	}
	if (radius_cost < 0 || others_cost >= radius_cost)
		return knn_scan_reject("the query vector is an expression and a condition of the subquery's WHERE is not cheaper than the radius (PostgreSQL may compute the radius, and the expression, first)");
	return true;
}

Index
knn_scan_recognise_subquery(PlannerInfo *root, Query *sq, KnnJoinPath *kp)
{
	RangeTblRef *rtr;
	OpExpr	   *distance;

	if (sq->commandType != CMD_SELECT || sq->utilityStmt != NULL || !looks_like_top_k(sq))
		return 0;
	if (!recognise_clauses(sq) || (rtr = recognise_relation(sq)) == NULL ||
		(distance = recognise_distance(root, sq, rtr, kp)) == NULL ||
		!recognise_where(sq, rtr, distance, kp) || !radius_evaluated_last(root, sq, rtr, kp) ||
		!recognise_tie_order(root, sq, kp) ||
		!recognise_select_list(root, sq, distance, kp))
		return 0;

	/* LIMIT and OFFSET: evaluated once at run time (no references to any row) */
	if ((sq->limitCount != NULL && !knn_scan_is_run_time_constant(sq->limitCount)) ||
		(sq->limitOffset != NULL && !knn_scan_is_run_time_constant(sq->limitOffset)))
		return knn_scan_reject("LIMIT or OFFSET is not a constant or parameter"), 0;
	kp->tie_order = list_copy_tail(sq->sortClause, 1);
	kp->with_ties = sq->limitOption == LIMIT_OPTION_WITH_TIES;
	return rtr->rtindex;
}
