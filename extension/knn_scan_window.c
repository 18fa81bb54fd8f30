/*
 * knn_scan_window.c -- the top-k-per-row query written with a window
 * function or DISTINCT ON, rewritten before planning into the LATERAL form
 * that the KNN Join runs.
 *
 *     SELECT ... FROM (
 *       SELECT q.id AS query_id, t.id AS target_id, t.v <-> q.v AS d,
 *              row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v, t.id) AS rn
 *       FROM queries q, items t WHERE <conditions>) s
 *     WHERE rn <= 10
 *
 * PostgreSQL runs it as a join of every query row with every item, a sort
 * of all those pairs and a WindowAgg. When one partition is one row of q
 * (PARTITION BY a unique, NOT NULL key of q), the rows numbered 1 to k of a
 * partition are the first k items by the window's ORDER BY (with other
 * columns of q, those of its rows, see recognise_partition), which is what
 *
 *     SELECT q.id AS query_id, nearest.id AS target_id, nearest.distance AS d,
 *            row_number() OVER (PARTITION BY q.id
 *                               ORDER BY nearest.distance, nearest.id) AS rn
 *     FROM queries q CROSS JOIN LATERAL (
 *       SELECT t.v <-> q.v AS distance, t.id FROM items t WHERE <conditions>
 *       ORDER BY t.v <-> q.v, t.id LIMIT 10) nearest
 *
 * returns, with the same row numbers (the window now numbers k rows per
 * query row). The outer query and its filter stay as written. Likewise
 *
 *     SELECT DISTINCT ON (q.id) q.id, t.id, t.v <-> q.v FROM queries q, items t
 *     ORDER BY q.id, t.v <-> q.v, t.id
 *
 * is the same LATERAL join with LIMIT 1, ordered by q.id.
 *
 * rank() in place of row_number() ("rank <= k") is the LATERAL join with
 * FETCH FIRST k ROWS WITH TIES, rank() kept above. Why that is exact, where
 * "before" means before on all of the window's ORDER BY keys (the distance
 * and the tie keys; equal on all of them, NULLs equal to NULLs, is a tie,
 * as for the window's peers and for WITH TIES alike):
 *
 * - A row's rank is 1 + the number of rows of its partition before it, so
 *   rank <= k exactly where fewer than k rows of the partition are before
 *   it ("rank < k": fewer than k - 1, the LIMIT below).
 * - FETCH FIRST k ROWS WITH TIES returns exactly the rows with fewer than k
 *   rows before them: such a row's ties start at or before the k-th place,
 *   so the k-th row is before it or one of its ties; a row with k or more
 *   before it has the k-th row before it. (k = 0 returns nothing; fewer
 *   rows than k: all of them.)
 * - A partition's rows with rank <= k are therefore in the union of its q
 *   rows' lists: the rows of its own q row before such a row are among
 *   the rows of the partition before it, fewer than k. (With PARTITION BY
 *   a key of q, the union is one q row's list.)
 * - The rank() above counts, for such a row, the rows of the union before
 *   it; each row before it has fewer rows before it still, so it is in the
 *   union too: the same rank. A row of the union with rank > k has at
 *   least k rows before it, and the first k of those (in order) have fewer
 *   than k before them, so they are in the union: its rank above is > k
 *   too, and the filter, which keeps only rows with rank <= k (an upper
 *   bound on rn is one of its conjuncts), drops it as before.
 *
 * So the same rows pass, with the same ranks. dense_rank() <= k may need
 * rows past any q row's first k with ties (k distinct distances), and
 * percent_rank(), cume_dist() and ntile() count the whole partition: they
 * are declined, as are other window functions. The planner hook
 * below makes this change in the query tree before standard_planner runs,
 * so the KNN Join's own checks (knn_scan_shape.c, knn_scan_path.c) decide
 * as for a LATERAL query written so. The rewrite stands only where a KNN
 * Join runs it: where no KNN Join runs a rewritten subquery (the node
 * declined it or lost on cost), the statement is planned again as written
 * (knn_window_planner), so that the plan never changes silently, nor reads
 * an approximate index (pgvector's hnsw or ivfflat answers ORDER BY
 * distance LIMIT k, never the query as written).
 *
 * The rewrite is made only where it is provably equivalent; otherwise the
 * query is left alone and, for a query that looks like one of these
 * shapes, the reason is logged at DEBUG1 ("KNN Join not used: ...").
 * EXPLAIN shows "Rewritten From: row_number() window" (rank() window,
 * DISTINCT ON) on the KNN Join that runs a rewritten query.
 * knn_gpu.enable_knn_join = off turns it off with the node.
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "catalog/pg_class.h"
#include "catalog/pg_index.h"
#include "catalog/pg_operator.h"
#include "catalog/pg_type.h"
#include "nodes/makefuncs.h"
#include "nodes/nodeFuncs.h"
#include "optimizer/clauses.h"
#include "optimizer/optimizer.h"
#include "optimizer/paths.h"
#include "optimizer/planner.h"
#include "parser/parse_coerce.h"
#include "parser/parsetree.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/typcache.h"

#include "knn_scan.h"
#include "knn_settings.h"

static planner_hook_type prev_planner_hook = NULL;

/*
 * The query form a rewritten LATERAL subquery came from, for EXPLAIN's
 * "Rewritten From" on the KNN Join that runs it (no silent change of plan).
 * The subquery carries it in its queryId, the one field of a Query that
 * PostgreSQL leaves to plugins: copyObject and the planner's mutators keep
 * it, so the copies of the subquery that the planner plans keep it too.
 * PostgreSQL and pg_stat_statements set queryId on a statement's top-level
 * query only (a stored query, such as a view's, reads back 0), never on a
 * subquery written in FROM; only an inlined SQL function's body may carry a
 * query hash there, which equals one of these tags with odds of about 1 in 2^46.
 * The tag holds the form (byte 0) and which rewrite of the statement made
 * the subquery (1, 2, ...; bytes 1-2), so that the plan can be checked
 * rewrite by rewrite (knn_window_planner).
 */
typedef enum RewrittenForm
{
	WRITTEN_AS_LATERAL = 0,		/* not the rewrite's */
	FROM_ROW_NUMBER,
	FROM_RANK,
	FROM_DISTINCT_ON,
	REWRITTEN_FORM_COUNT
} RewrittenForm;

#define REWRITE_TAG UINT64CONST(0x6b6e6e5f67707500)	/* "knn_gpu\0", xor the form and id */
#define MAX_REWRITES 0xffff

static const char *const rewritten_form_names[REWRITTEN_FORM_COUNT] = {
	[FROM_ROW_NUMBER] = "row_number() window",
	[FROM_RANK] = "rank() window",
	[FROM_DISTINCT_ON] = "DISTINCT ON",
};

/*
 * The statement being planned: its query as written (copied before the
 * first rewrite changes it), how many subqueries were rewritten, and for
 * each rewrite (by id) each time the planner planned the subquery it made
 * (set_rel_pathlist_hook: a copy inlined twice counts twice, one the
 * planner dropped never), with the planning it was part of. A rewrite
 * stands only where a KNN Join runs each of those plans that the statement
 * keeps (knn_window_planner; not those of an alternative subplan that
 * setrefs dropped).
 */
typedef struct RewriteState
{
	Query	   *statement;
	Query	   *as_written;
	int			rewrites;
	bool		counting;		/* planning has begun */
	List	   *planned_ids;	/* each plan of a rewritten subquery: its id */
	List	   *planned_roots;	/* ... and its PlannerInfo */
} RewriteState;

/* The innermost statement being planned (planning may plan others). */
static RewriteState *planning = NULL;
static set_rel_pathlist_hook_type prev_rel_pathlist_hook = NULL;

/*
 * Called before each rewrite: keeps the statement as written, once.
 * Returns the rewrite's id, or 0 where there have been too many.
 */
static int
note_rewrite(RewriteState *state)
{
	if (state->rewrites >= MAX_REWRITES)
		return 0;
	if (state->as_written == NULL)
		state->as_written = copyObject(state->statement);
	return ++state->rewrites;
}

static uint64
rewrite_tag(RewrittenForm form, int id)
{
	return REWRITE_TAG ^ ((uint64) id << 8) ^ (uint64) form;
}

/* The form and id of sq's tag; false for a subquery written so. */
static bool
read_rewrite_tag(const Query *sq, RewrittenForm *form, int *id)
{
	uint64		bits = sq->queryId ^ REWRITE_TAG;

	*form = (RewrittenForm) (bits & 0xff);
	*id = (int) ((bits >> 8) & MAX_REWRITES);
	return (bits >> 24) == 0 && *form != WRITTEN_AS_LATERAL && *form < REWRITTEN_FORM_COUNT &&
		*id > 0;
}

/*
 * The form the rewrite turned into the LATERAL subquery sq, as EXPLAIN
 * names it, or NULL for a subquery written so.
 */
const char *
knn_scan_rewritten_from(const Query *sq)
{
	RewrittenForm form;
	int			id;

	return read_rewrite_tag(sq, &form, &id) ? rewritten_form_names[form] : NULL;
}

int
knn_scan_rewrite_id(const Query *sq)
{
	RewrittenForm form;
	int			id;

	return read_rewrite_tag(sq, &form, &id) ? id : 0;
}

/*
 * A recognised shape: the query of the pairs (the window's, or the DISTINCT
 * ON query itself) and what the LATERAL subquery is made of.
 */
typedef struct PairShape
{
	Query	   *query;			/* the query that joins q and t */
	Index		q_index;		/* the query relation in query->rtable */
	Index		t_index;		/* the target relation */
	OpExpr	   *distance;		/* the first ORDER BY key */
	List	   *order;			/* SortGroupClauses of the distance and the
								 * keys after it, in query's targetList */
	List	   *inner_conditions;	/* conjuncts on t (and q): the subquery's WHERE */
	List	   *outer_conditions;	/* conjuncts on q alone (or on nothing) */
	Expr	   *limit;			/* k, an int8 run-time constant */
	TargetEntry *rn;			/* the window form's row_number() or rank(),
								 * or NULL */
	bool		with_ties;		/* rank(): FETCH FIRST k ROWS WITH TIES */
} PairShape;

/* Which relations of the query level an expression references. */
typedef struct References
{
	Index		q_index;
	Index		t_index;
	bool		q;				/* a column of q */
	bool		t;				/* a column of t */
	bool		other;			/* another relation of the level, a level
								 * above, or a whole-row or system column of t */
} References;

static bool
references_walker(Node *node, References *refs)
{
	if (node == NULL)
		return false;
	if (IsA(node, Var))
	{
		Var		   *var = (Var *) node;

		if (var->varlevelsup != 0)
			refs->other = true;
		else if (var->varno == refs->t_index && var->varattno > 0)
			refs->t = true;
		else if (var->varno == refs->q_index)
			refs->q = true;
		else
			refs->other = true;
		return false;
	}
	if (IsA(node, PlaceHolderVar) || IsA(node, SubLink) || IsA(node, Aggref) ||
		IsA(node, GroupingFunc) || IsA(node, WindowFunc))
	{
		refs->other = true;
		return false;
	}
	return expression_tree_walker(node, references_walker, refs);
}

static References
references_of(Node *node, const PairShape *shape)
{
	References	refs = {shape->q_index, shape->t_index, false, false, false};

	references_walker(node, &refs);
	return refs;
}

/* The distance, operands in either order (the operators are symmetric)? */
static bool
is_the_distance(Node *node, const OpExpr *distance)
{
	OpExpr	   *op = (OpExpr *) node;

	if (node == NULL || !IsA(node, OpExpr) || op->opno != distance->opno ||
		list_length(op->args) != 2)
		return false;
	return equal(op->args, distance->args) ||
		(equal(linitial(op->args), lsecond(distance->args)) &&
		 equal(lsecond(op->args), linitial(distance->args)));
}

/* Does the expression contain a distance operator of knn_gpu or pgvector? */
static bool
first_key_is_distance(List *order, List *targetList)
{
	TargetEntry *tle;

	if (order == NIL)
		return false;
	tle = get_sortgroupclause_tle(linitial_node(SortGroupClause, order), targetList);
	return knn_scan_contains_distance((Node *) tle->expr);
}

/*
 * Do the key columns (attnos, with the equality operators and collations
 * the query compares them by) cover a unique index of the relation whose
 * columns are NOT NULL (or NULLS NOT DISTINCT), immediate, without
 * expressions or predicate, comparing by an equality that the query's
 * implies? Then no two rows have equal keys: one partition (one DISTINCT
 * ON group) is one row. A table with inheritance children read with them
 * is not covered by its own indexes; a partitioned table's unique index
 * covers its partitions.
 */
static bool
is_unique_key(RangeTblEntry *rte, List *attnos, List *eqops, List *collations)
{
	Relation	rel = table_open(rte->relid, NoLock);	/* locked by the parser */
	List	   *indexes;
	ListCell   *lc;
	bool		found = false;

	if (rel->rd_rel->relkind != RELKIND_RELATION &&
		rel->rd_rel->relkind != RELKIND_PARTITIONED_TABLE &&
		rel->rd_rel->relkind != RELKIND_MATVIEW)
	{
		table_close(rel, NoLock);
		return false;
	}
	if (rel->rd_rel->relkind == RELKIND_RELATION && rte->inh && rel->rd_rel->relhassubclass)
	{
		table_close(rel, NoLock);
		return false;
	}
	indexes = RelationGetIndexList(rel);
	foreach(lc, indexes)
	{
		Relation	index = index_open(lfirst_oid(lc), AccessShareLock);
		Form_pg_index form = index->rd_index;
		bool		covers = form->indisunique && form->indimmediate && form->indisvalid &&
			heap_attisnull(index->rd_indextuple, Anum_pg_index_indexprs, NULL) &&
			heap_attisnull(index->rd_indextuple, Anum_pg_index_indpred, NULL);

		for (int i = 0; covers && i < form->indnkeyatts; i++)
		{
			AttrNumber	attno = form->indkey.values[i];
			int			at = -1;
			Oid			collation;
			ListCell   *la;

			foreach(la, attnos)
				if (lfirst_int(la) == attno)
					at = foreach_current_index(la);
			if (at < 0 || attno <= 0)
			{
				covers = false;
				break;
			}
			collation = list_nth_oid(collations, at);
			covers = op_in_opfamily(list_nth_oid(eqops, at), index->rd_opfamily[i]) &&
				(TupleDescAttr(RelationGetDescr(rel), attno - 1)->attnotnull ||
				 form->indnullsnotdistinct) &&
			/* a deterministic collation's equality implies any other's */
				(collation == index->rd_indcollation[i] ||
				 (OidIsValid(collation) && get_collation_isdeterministic(collation)));
		}
		index_close(index, AccessShareLock);
		if (covers)
		{
			found = true;
			break;
		}
	}
	list_free(indexes);
	table_close(rel, NoLock);
	return found;
}

/*
 * The partitioning (or DISTINCT ON) keys: columns of one relation (q);
 * where one_row_per_key, a unique NOT NULL key of it. Sets q_index and
 * t_index.
 *
 * The window form needs no unique key: its window stays above the LATERAL
 * subquery and numbers each partition's rows again, and the first k of a
 * partition (rows of several q rows) by the window's order are among the
 * first k of their own q row, so the k rows per q row hold them. DISTINCT
 * ON keeps one row per key, which is one row per q row only for a key.
 */
static bool
recognise_partition(Query *query, List *keys, bool one_row_per_key, PairShape *shape)
{
	List	   *attnos = NIL;
	List	   *eqops = NIL;
	List	   *collations = NIL;
	ListCell   *lc;
	Index		q_index = 0;

	foreach(lc, keys)
	{
		SortGroupClause *key = lfirst_node(SortGroupClause, lc);
		Var		   *var = (Var *) get_sortgroupclause_expr(key, query->targetList);

		if (!IsA(var, Var) || var->varlevelsup != 0 || var->varattno <= 0 ||
			(q_index != 0 && var->varno != q_index) || !OidIsValid(key->eqop))
			return knn_scan_reject("the window's PARTITION BY (DISTINCT ON) is not columns of one relation");
		q_index = var->varno;
		attnos = lappend_int(attnos, var->varattno);
		eqops = lappend_oid(eqops, key->eqop);
		collations = lappend_oid(collations, var->varcollid);
	}
	shape->q_index = q_index;
	shape->t_index = q_index == 1 ? 2 : 1;
	if (q_index > 2)
		return knn_scan_reject("the window's PARTITION BY (DISTINCT ON) is not columns of one of the two relations");
	if (one_row_per_key &&
		!is_unique_key(rt_fetch(q_index, query->rtable), attnos, eqops, collations))
		return knn_scan_reject("the DISTINCT ON columns do not cover a unique index of NOT NULL columns of the query relation (without expressions, predicate or deferral; a table without inheritance children), so one DISTINCT ON group may hold several of its rows");
	return true;
}

/*
 * FROM exactly two tables (no TABLESAMPLE), as "q, t", "q CROSS JOIN t" or
 * "q JOIN t ON ...": the conjuncts of the WHERE and the ON.
 */
static bool
recognise_relations(Query *query, List **conditions)
{
	List	   *from = query->jointree->fromlist;
	Node	   *join_quals = NULL;

	if (list_length(from) == 1 && IsA(linitial(from), JoinExpr))
	{
		JoinExpr   *join = linitial_node(JoinExpr, from);

		if (join->jointype != JOIN_INNER || !IsA(join->larg, RangeTblRef) ||
			!IsA(join->rarg, RangeTblRef) || join->usingClause != NIL ||
			list_length(query->rtable) != 3)
			return knn_scan_reject("the window (DISTINCT ON) query's FROM is not two relations in an inner join");
		join_quals = join->quals;
		from = list_make2(join->larg, join->rarg);
	}
	else if (list_length(from) != 2 || list_length(query->rtable) != 2 ||
			 !IsA(linitial(from), RangeTblRef) || !IsA(lsecond(from), RangeTblRef))
		return knn_scan_reject("the window (DISTINCT ON) query's FROM is not exactly two relations");
	for (Index i = 1; i <= 2; i++)
	{
		RangeTblEntry *rte = rt_fetch(i, query->rtable);
		bool		listed = false;
		ListCell   *lc;

		foreach(lc, from)
			listed = listed || ((RangeTblRef *) lfirst(lc))->rtindex == i;
		if (!listed || rte->rtekind != RTE_RELATION || rte->tablesample != NULL)
			return knn_scan_reject("the window (DISTINCT ON) query's FROM is not exactly two tables (a view, function, subquery or TABLESAMPLE): the rewrite is made for two tables only; write the LATERAL form, whose inner relation may be a view or a subquery over one table");
	}
	/* a new list: the WHERE's own AND list stays as it is */
	*conditions = list_concat_copy(make_ands_implicit((Expr *) query->jointree->quals),
								   make_ands_implicit((Expr *) join_quals));
	return true;
}

/* Clauses that change what the pairs are. */
static bool
recognise_clauses(Query *query)
{
	if (query->commandType != CMD_SELECT || query->utilityStmt != NULL ||
		query->setOperations != NULL)
		return knn_scan_reject("the window (DISTINCT ON) query is not a plain SELECT");
	if (query->groupClause != NIL || query->groupingSets != NIL ||
		query->havingQual != NULL || query->hasAggs)
		return knn_scan_reject("the window (DISTINCT ON) query aggregates");
	if (query->hasTargetSRFs)
		return knn_scan_reject("the window (DISTINCT ON) query has a set-returning function in its select list");
	if (query->hasSubLinks)
		return knn_scan_reject("the window (DISTINCT ON) query has a sub-select");
	if (query->hasForUpdate || query->rowMarks != NIL)
		return knn_scan_reject("the window (DISTINCT ON) query locks rows");
	if (query->cteList != NIL || query->hasRecursive || query->hasModifyingCTE)
		return knn_scan_reject("the window (DISTINCT ON) query has WITH");
	if (contain_volatile_functions((Node *) query))
		return knn_scan_reject("the window (DISTINCT ON) query has a volatile function");
	return true;
}

/*
 * The ORDER BY: first the distance between a vector column of t and an
 * expression of q (knn_catalog.h's operators), ascending NULLS LAST as the
 * KNN Join needs; then expressions of t alone.
 */
static bool
recognise_order(Query *query, List *order, PairShape *shape)
{
	SortGroupClause *first = linitial_node(SortGroupClause, order);
	OpExpr	   *distance = (OpExpr *) get_sortgroupclause_expr(first, query->targetList);
	KnnMetric	metric;
	Var		   *target;
	Node	   *other;
	References	refs;
	ListCell   *lc;

	if (!IsA(distance, OpExpr) || list_length(distance->args) != 2 ||
		distance->opresulttype != FLOAT8OID ||
		!knn_distance_operator_metric(distance->opno, &metric))
		return knn_scan_reject("the window's (DISTINCT ON query's) first ORDER BY key after the partitioning is not a distance operator");
	if (first->sortop != Float8LessOperator || first->nulls_first)
		return knn_scan_reject("the window's (DISTINCT ON query's) distance is not sorted ASC NULLS LAST");
	target = (Var *) linitial(distance->args);
	other = lsecond(distance->args);
	if (!IsA(target, Var) || target->varno != shape->t_index)
	{
		target = (Var *) lsecond(distance->args);
		other = linitial(distance->args);
	}
	refs = references_of(other, shape);
	if (!IsA(target, Var) || target->varlevelsup != 0 || target->varno != shape->t_index ||
		target->varattno <= 0 || refs.t || refs.other || !refs.q)
		return knn_scan_reject("the window's (DISTINCT ON query's) distance is not between a column of the other relation and an expression of the partitioned one");
	shape->distance = distance;
	for_each_from(lc, order, 1)
	{
		Node	   *key = get_sortgroupclause_expr(lfirst_node(SortGroupClause, lc),
												   query->targetList);

		refs = references_of(key, shape);
		if (refs.q || refs.other)
			return knn_scan_reject("an ORDER BY key after the distance is not an expression of the target relation alone");
	}
	shape->order = order;
	return true;
}

/*
 * The conditions: on t, on q, or on both without a function that may fail
 * (leakproof: "t.id <> q.id", "t.g = q.g"). PostgreSQL's plan of the
 * window query evaluates those on t at t's scan, before those on both;
 * the LATERAL subquery's plan may evaluate them in another order, so one
 * on both that may fail could fail there for a row that one on t drops.
 */
static bool
recognise_conditions(List *conditions, PairShape *shape)
{
	ListCell   *lc;

	foreach(lc, conditions)
	{
		Node	   *condition = lfirst(lc);
		References	refs = references_of(condition, shape);

		if (refs.other)
			return knn_scan_reject("a condition of the window (DISTINCT ON) query references something other than the columns of its two relations");
		if (!refs.t)
			shape->outer_conditions = lappend(shape->outer_conditions, condition);
		else if (refs.q && contain_leaked_vars(condition))
			return knn_scan_reject("a condition of the window (DISTINCT ON) query on both relations may fail (a function that is not leakproof)");
		else
			shape->inner_conditions = lappend(shape->inner_conditions, condition);
	}
	return true;
}

/* Is the entry one of the ORDER BY keys (the distance or a key after it)? */
static bool
is_order_key(TargetEntry *tle, const PairShape *shape)
{
	ListCell   *lc;

	if (tle->ressortgroupref == 0)
		return false;
	foreach(lc, shape->order)
		if (lfirst_node(SortGroupClause, lc)->tleSortGroupRef == tle->ressortgroupref)
			return true;
	return false;
}

/*
 * The select list: rn (window form), the distance, the ORDER BY
 * keys, columns of either relation, and expressions without columns of t.
 * PostgreSQL's plan computes an expression of t for every pair (the
 * DISTINCT ON form) or for the rows numbered up to k (the window's run
 * condition); the rewritten query computes it for the k rows, so one that
 * may fail is left out, simply: write it in the outer query.
 */
static bool
recognise_select_list(Query *query, PairShape *shape)
{
	ListCell   *lc;

	foreach(lc, query->targetList)
	{
		TargetEntry *tle = lfirst_node(TargetEntry, lc);
		Node	   *expr = knn_scan_without_relabel((Node *) tle->expr);
		References	refs;

		if (tle == shape->rn || is_order_key(tle, shape) ||
			is_the_distance(expr, shape->distance))
			continue;
		refs = references_of(expr, shape);
		if (refs.other)
			return knn_scan_reject("the window (DISTINCT ON) query's select list references something other than the columns of its two relations");
		if (refs.t && !IsA(expr, Var))
			return knn_scan_reject("the window (DISTINCT ON) query's select list computes an expression of the target relation other than the distance (compute it in the outer query)");
	}
	return true;
}

/*
 * The window query's one window function: row_number() or rank() (see the
 * header for rank()) over its one window.
 */
static bool
window_function_walker(Node *node, List **found)
{
	if (node == NULL)
		return false;
	if (IsA(node, WindowFunc))
		*found = lappend(*found, node);
	return expression_tree_walker(node, window_function_walker, found);
}

static bool
recognise_rn(Query *query, PairShape *shape)
{
	List	   *found = NIL;
	WindowFunc *func;
	ListCell   *lc;

	window_function_walker((Node *) query->targetList, &found);
	if (list_length(found) != 1 || list_length(query->windowClause) != 1)
		return knn_scan_reject("the window query has more than one window function or window");
	func = linitial_node(WindowFunc, found);
	if ((func->winfnoid != F_ROW_NUMBER && func->winfnoid != F_RANK_) ||
		func->args != NIL || func->aggfilter != NULL)
		return knn_scan_reject("the window function is not row_number() or rank() (dense_rank(), percent_rank(), cume_dist(), ntile() and the others may need more than the first k rows of each query row)");
	shape->with_ties = func->winfnoid == F_RANK_;
	foreach(lc, query->targetList)
		if (lfirst_node(TargetEntry, lc)->expr == (Expr *) func)
			shape->rn = lfirst_node(TargetEntry, lc);
	if (shape->rn == NULL || shape->rn->resjunk)
		return knn_scan_reject("row_number() (rank()) is inside an expression of the window query's select list");
	return true;
}

/*
 * What the window query and the DISTINCT ON query have in common
 * (one_row_per_key: the partitioning keys must be a key of q).
 */
static bool
recognise_pairs(Query *query, List *partition, List *order, bool one_row_per_key,
				PairShape *shape)
{
	List	   *conditions = NIL;

	shape->query = query;
	return recognise_clauses(query) && recognise_relations(query, &conditions) &&
		recognise_partition(query, partition, one_row_per_key, shape) &&
		recognise_order(query, order, shape) &&
		recognise_conditions(conditions, shape) &&
		recognise_select_list(query, shape);
}

/* An int8 constant. */
static Expr *
int8_const(int64 value)
{
	return (Expr *) makeConst(INT8OID, -1, InvalidOid, sizeof(int64),
							  Int64GetDatum(value), false, FLOAT8PASSBYVAL);
}

/*
 * The LIMIT for "rn <= bound" (or "rn < bound"): GREATEST(bound, 0) (or
 * GREATEST(bound, 1) - 1), so that a bound below 1 or NULL, which keeps no
 * row, is LIMIT 0 rather than an error (WITH TIES refuses NULL too); the
 * filter stays above, so any LIMIT at least as large is exact (for rank(),
 * a larger WITH TIES list holds at least the rows the header's argument
 * needs).
 */
static Expr *
limit_of_bound(Expr *bound, bool inclusive)
{
	Node	   *k = coerce_to_target_type(NULL, (Node *) copyObject(bound), exprType((Node *) bound),
										  INT8OID, -1, COERCION_IMPLICIT,
										  COERCE_IMPLICIT_CAST, -1);
	MinMaxExpr *greatest = makeNode(MinMaxExpr);

	greatest->minmaxtype = INT8OID;
	greatest->op = IS_GREATEST;
	greatest->args = list_make2(k, int8_const(inclusive ? 0 : 1));
	greatest->location = -1;
	if (inclusive)
		return (Expr *) greatest;
	return (Expr *) makeFuncExpr(F_INT8MI, INT8OID, list_make2(greatest, int8_const(1)),
								 InvalidOid, InvalidOid, COERCE_EXPLICIT_CALL);
}

static bool
is_rn_var(Node *node, Index rtindex, AttrNumber attno)
{
	Var		   *var = (Var *) node;

	return IsA(var, Var) && var->varno == rtindex && var->varattno == attno &&
		var->varlevelsup == 0;
}

/*
 * "rn <= bound" or "rn < bound" (or "bound >= rn", "bound > rn"), of int8's
 * btree operator family (rn is bigint; bound an integer of any width), bound
 * a constant or parameter: the LIMIT it allows (limit_of_bound).
 */
static Expr *
upper_bound(Node *condition, Index rtindex, AttrNumber attno)
{
	OpExpr	   *op = (OpExpr *) condition;
	TypeCacheEntry *entry = lookup_type_cache(INT8OID, TYPECACHE_BTREE_OPFAMILY);
	int			strategy;
	Oid			left_type;
	Oid			right_type;
	bool		rn_left;
	Expr	   *bound;

	if (!IsA(op, OpExpr) || list_length(op->args) != 2 || !OidIsValid(entry->btree_opf) ||
		!op_in_opfamily(op->opno, entry->btree_opf))
		return NULL;
	get_op_opfamily_properties(op->opno, entry->btree_opf, false, &strategy,
							   &left_type, &right_type);
	rn_left = is_rn_var(linitial(op->args), rtindex, attno);
	if (!rn_left && !is_rn_var(lsecond(op->args), rtindex, attno))
		return NULL;
	bound = rn_left ? lsecond(op->args) : linitial(op->args);
	if (!knn_scan_is_run_time_constant((Node *) bound))
		return NULL;
	if (strategy == (rn_left ? BTLessEqualStrategyNumber : BTGreaterEqualStrategyNumber))
		return limit_of_bound(bound, true);
	if (strategy == (rn_left ? BTLessStrategyNumber : BTGreaterStrategyNumber))
		return limit_of_bound(bound, false);
	return NULL;
}

/* Does the condition read no column but rn (at rtindex, attno)? */
static bool
not_only_rn_walker(Node *node, void *rn)
{
	if (node == NULL)
		return false;
	if (IsA(node, Var))
		return !is_rn_var(node, ((Var *) rn)->varno, ((Var *) rn)->varattno);
	if (IsA(node, PlaceHolderVar) || IsA(node, SubLink) || IsA(node, Aggref) ||
		IsA(node, GroupingFunc) || IsA(node, WindowFunc) ||
		(IsA(node, Param) && ((Param *) node)->paramkind != PARAM_EXTERN))
		return true;
	return expression_tree_walker(node, not_only_rn_walker, rn);
}

/*
 * The outer query's WHERE: conditions on rn alone, one of them an upper
 * bound (upper_bound), so that no row past the k-th of a partition counts.
 */
static bool
recognise_rn_filter(Query *outer, Index rtindex, PairShape *shape)
{
	Var		   *rn = makeVar(rtindex, shape->rn->resno, INT8OID, -1, InvalidOid, 0);
	ListCell   *lc;

	foreach(lc, make_ands_implicit((Expr *) outer->jointree->quals))
	{
		Node	   *condition = lfirst(lc);

		if (not_only_rn_walker(condition, rn) ||
			contain_volatile_functions(condition))
			return knn_scan_reject("the query above the window query has a condition on something other than row_number()'s (rank()'s) column");
		if (shape->limit == NULL)
			shape->limit = upper_bound(condition, rtindex, shape->rn->resno);
	}
	if (shape->limit == NULL)
		return knn_scan_reject("the query above the window query has no condition \"rn <= k\" or \"rn < k\" (k a constant or parameter)");
	return true;
}

/*
 * Building the LATERAL subquery. Its columns: the distance, the ORDER BY
 * keys after it, then the columns of t used in the pairs' select list.
 */
typedef struct InnerColumns
{
	const PairShape *shape;
	List	   *targetList;		/* the subquery's */
	char	   *name;			/* the subquery's alias ("nearest": the table
								 * keeps its own in EXPLAIN) */
} InnerColumns;

/* An expression of the pairs' query as the LATERAL subquery computes it. */
static Node *
as_inner_mutator(Node *node, const PairShape *shape)
{
	if (node == NULL)
		return NULL;
	if (IsA(node, Var) && ((Var *) node)->varlevelsup == 0)
	{
		Var		   *var = (Var *) copyObject(node);

		if (var->varno == shape->t_index)
		{
			var->varno = 1;
			if (var->varnosyn == shape->t_index)
				var->varnosyn = 1;
		}
		else
			var->varlevelsup = 1;	/* q: the outer row */
		return (Node *) var;
	}
	return expression_tree_mutator(node, as_inner_mutator, (void *) shape);
}

static Node *
as_inner(Node *node, const PairShape *shape)
{
	return as_inner_mutator(copyObject(node), shape);
}

/* A column of the subquery, as a Var of the pairs' query (at t_index). */
static Var *
add_inner_column(InnerColumns *columns, Expr *expr, const char *name, Index sortgroupref)
{
	AttrNumber	resno = list_length(columns->targetList) + 1;
	TargetEntry *tle = makeTargetEntry(expr, resno, pstrdup(name), false);

	tle->ressortgroupref = sortgroupref;
	columns->targetList = lappend(columns->targetList, tle);
	return makeVar(columns->shape->t_index, resno, exprType((Node *) expr),
				   exprTypmod((Node *) expr), exprCollation((Node *) expr), 0);
}

/* The subquery's column holding t's column attno (added when new). */
static Var *
inner_column_of(InnerColumns *columns, Var *column, RangeTblEntry *t_rte)
{
	ListCell   *lc;

	foreach(lc, columns->targetList)
	{
		TargetEntry *tle = lfirst_node(TargetEntry, lc);
		Var		   *var = (Var *) tle->expr;

		if (IsA(var, Var) && var->varno == 1 && var->varlevelsup == 0 &&
			var->varattno == column->varattno)
			return makeVar(columns->shape->t_index, tle->resno, var->vartype,
						   var->vartypmod, var->varcollid, 0);
	}
	return add_inner_column(columns, (Expr *) as_inner((Node *) column, columns->shape),
							strVal(list_nth(t_rte->eref->colnames, column->varattno - 1)), 0);
}

typedef struct OuterContext
{
	InnerColumns *columns;
	RangeTblEntry *t_rte;
	Var		   *distance;		/* the subquery's distance column */
} OuterContext;

/* A select-list expression of the pairs' query over the subquery's columns. */
static Node *
as_outer_mutator(Node *node, OuterContext *context)
{
	const PairShape *shape = context->columns->shape;

	if (node == NULL)
		return NULL;
	if (is_the_distance(node, shape->distance))
		return (Node *) copyObject(context->distance);
	if (IsA(node, Var) && ((Var *) node)->varlevelsup == 0 &&
		((Var *) node)->varno == shape->t_index)
		return (Node *) inner_column_of(context->columns, (Var *) node, context->t_rte);
	return expression_tree_mutator(node, as_outer_mutator, context);
}

/*
 * Turns the pairs' query into "FROM q CROSS JOIN LATERAL (SELECT ... FROM t
 * WHERE <inner conditions> ORDER BY <the keys> LIMIT k) t WHERE <outer
 * conditions>", its select list over the subquery's columns. The
 * subquery's RTE takes t's place, so q's Vars keep theirs.
 */
static void
rewrite_as_lateral(PairShape *shape, RewrittenForm form, int id)
{
	Query	   *query = shape->query;
	RangeTblEntry *t_rte = rt_fetch(shape->t_index, query->rtable);
	Query	   *inner = makeNode(Query);
	RangeTblEntry *lateral = makeNode(RangeTblEntry);
	RangeTblRef *t_ref = makeNode(RangeTblRef);
	RangeTblEntry *inner_t = copyObject(t_rte);
	InnerColumns columns = {shape, NIL, "nearest"};
	OuterContext context = {&columns, t_rte, NULL};
	List	   *colnames = NIL;
	Index		sortgroupref = 0;
	ListCell   *lc;

	/*
	 * t's entry, now the subquery's only one: its row-level security
	 * policies' conditions (securityQuals) reference t at its new index
	 */
	inner_t->securityQuals = (List *) as_inner((Node *) t_rte->securityQuals, shape);

	/* the keys: the distance, then the keys after it */
	foreach(lc, shape->order)
	{
		SortGroupClause *key = copyObject(lfirst_node(SortGroupClause, lc));
		TargetEntry *tle = get_sortgroupclause_tle(key, query->targetList);
		Var		   *var = (Var *) knn_scan_without_relabel((Node *) tle->expr);
		const char *name = sortgroupref == 0 ? "distance" : "order_key";
		Var		   *column;

		if (sortgroupref > 0 && IsA(var, Var))
			name = strVal(list_nth(t_rte->eref->colnames, var->varattno - 1));
		column = add_inner_column(&columns, (Expr *) as_inner((Node *) tle->expr, shape),
								  name, sortgroupref + 1);
		if (context.distance == NULL)
			context.distance = column;
		key->tleSortGroupRef = ++sortgroupref;
		inner->sortClause = lappend(inner->sortClause, key);
	}
	/* the select list over them (a key's own entry is its column) */
	foreach(lc, query->targetList)
	{
		TargetEntry *tle = lfirst_node(TargetEntry, lc);
		int			key_number = 0;
		ListCell   *lk;

		foreach(lk, shape->order)
		{
			key_number++;
			if (tle->ressortgroupref != 0 &&
				lfirst_node(SortGroupClause, lk)->tleSortGroupRef == tle->ressortgroupref)
				break;
		}
		if (lk != NULL)
			tle->expr = (Expr *) makeVar(shape->t_index, key_number,
										 exprType((Node *) tle->expr),
										 exprTypmod((Node *) tle->expr),
										 exprCollation((Node *) tle->expr), 0);
		else
			tle->expr = (Expr *) as_outer_mutator((Node *) tle->expr, &context);
	}

	inner->commandType = CMD_SELECT;
	inner->querySource = QSRC_ORIGINAL;
	inner->queryId = rewrite_tag(form, id);
	inner->rtable = list_make1(inner_t);
	inner->hasRowSecurity = query->hasRowSecurity;
	t_ref->rtindex = 1;
	inner->jointree = makeFromExpr(list_make1(t_ref),
								   shape->inner_conditions == NIL ? NULL :
								   (Node *) make_ands_explicit((List *) as_inner((Node *) shape->inner_conditions,
																				   shape)));
	inner->targetList = columns.targetList;
	inner->limitCount = (Node *) shape->limit;
	inner->limitOption = shape->with_ties ? LIMIT_OPTION_WITH_TIES : LIMIT_OPTION_COUNT;

	foreach(lc, columns.targetList)
		colnames = lappend(colnames, makeString(pstrdup(lfirst_node(TargetEntry, lc)->resname)));
	lateral->rtekind = RTE_SUBQUERY;
	lateral->subquery = inner;
	lateral->lateral = true;
	lateral->inFromCl = true;
	lateral->alias = makeAlias(columns.name, NIL);
	lateral->eref = makeAlias(columns.name, colnames);
	list_nth_cell(query->rtable, shape->t_index - 1)->ptr_value = lateral;

	/* a JOIN's RTE, now outside the join tree, is referenced by nothing */
	foreach(lc, query->rtable)
		if (lfirst_node(RangeTblEntry, lc)->rtekind == RTE_JOIN)
			lfirst_node(RangeTblEntry, lc)->joinaliasvars = NIL;
	{
		RangeTblRef *q_ref = makeNode(RangeTblRef);
		RangeTblRef *lateral_ref = makeNode(RangeTblRef);

		q_ref->rtindex = shape->q_index;
		lateral_ref->rtindex = shape->t_index;
		query->jointree = makeFromExpr(list_make2(q_ref, lateral_ref),
									   shape->outer_conditions == NIL ? NULL :
									   (Node *) make_ands_explicit(shape->outer_conditions));
	}
}

/* Is it a window query whose window's first ORDER BY key is a distance? */
static bool
looks_like_window_query(Query *query)
{
	ListCell   *lc;

	if (query == NULL || query->commandType != CMD_SELECT || !query->hasWindowFuncs)
		return false;
	foreach(lc, query->windowClause)
		if (first_key_is_distance(lfirst_node(WindowClause, lc)->orderClause, query->targetList))
			return true;
	return false;
}

/*
 * The window form: outer is "SELECT ... FROM (<window query>) s WHERE <on
 * rn>" (or FROM a WITH query referenced once).
 */
static void
try_window_form(Query *outer, RewriteState *state)
{
	ListCell   *lc;

	foreach(lc, outer->rtable)
	{
		RangeTblEntry *rte = lfirst_node(RangeTblEntry, lc);
		Index		rtindex = foreach_current_index(lc) + 1;
		Query	   *window = NULL;
		PairShape	shape = {0};
		WindowClause *clause;
		int			id;

		if (rte->rtekind == RTE_SUBQUERY)
			window = rte->subquery;
		else if (rte->rtekind == RTE_CTE && rte->ctelevelsup == 0 && !rte->self_reference)
		{
			ListCell   *lcte;

			foreach(lcte, outer->cteList)
			{
				CommonTableExpr *cte = lfirst_node(CommonTableExpr, lcte);

				if (strcmp(cte->ctename, rte->ctename) == 0 && !cte->cterecursive &&
					cte->cterefcount == 1 && IsA(cte->ctequery, Query))
					window = (Query *) cte->ctequery;
			}
		}
		if (!looks_like_window_query(window))
			continue;

		/*
		 * Only a SELECT's WHERE drops the rows it rejects: MERGE keeps its
		 * ON condition in the same place, and a source row failing it is
		 * NOT MATCHED, not gone.
		 */
		if (outer->commandType != CMD_SELECT)
		{
			knn_scan_reject("the query above the window query is not a SELECT");
			continue;
		}
		if (outer->setOperations != NULL || list_length(outer->jointree->fromlist) != 1 ||
			!IsA(linitial(outer->jointree->fromlist), RangeTblRef) ||
			linitial_node(RangeTblRef, outer->jointree->fromlist)->rtindex != rtindex)
		{
			knn_scan_reject("the window query is not the only relation of the query above it");
			continue;
		}
		if (outer->hasForUpdate || outer->rowMarks != NIL)
		{
			knn_scan_reject("the query above the window query locks rows");
			continue;
		}
		if (window->distinctClause != NIL || window->limitCount != NULL ||
			window->limitOffset != NULL)
		{
			knn_scan_reject("the window query has DISTINCT, LIMIT or OFFSET");
			continue;
		}
		if (!recognise_rn(window, &shape))
			continue;
		clause = linitial_node(WindowClause, window->windowClause);
		if (clause->partitionClause == NIL)
		{
			knn_scan_reject("the window has no PARTITION BY");
			continue;
		}
		if (!first_key_is_distance(clause->orderClause, window->targetList) ||
			!recognise_pairs(window, clause->partitionClause, clause->orderClause, false, &shape) ||
			!recognise_rn_filter(outer, rtindex, &shape))
			continue;
		id = note_rewrite(state);
		if (id == 0)
			continue;
		elog(DEBUG1, "KNN Join: the %s window over \"%s\" is planned as a LATERAL top-k subquery%s",
			 shape.with_ties ? "rank()" : "row_number()",
			 rt_fetch(shape.t_index, window->rtable)->eref->aliasname,
			 shape.with_ties ? " WITH TIES" : "");
		rewrite_as_lateral(&shape, shape.with_ties ? FROM_RANK : FROM_ROW_NUMBER, id);
	}
}

/*
 * The DISTINCT ON form: "SELECT DISTINCT ON (<q's key>) ... FROM q, t
 * ORDER BY <q's key>, <distance> [, <keys of t>]" (its own LIMIT and
 * OFFSET apply after the DISTINCT ON, so they stay): LIMIT 1, ordered by
 * q's key.
 */
static void
try_distinct_on_form(Query *query, RewriteState *state)
{
	int			nkeys = list_length(query->distinctClause);
	PairShape	shape = {0};
	List	   *order;
	int			id;

	if (query->commandType != CMD_SELECT || !query->hasDistinctOn ||
		list_length(query->sortClause) <= nkeys)
		return;
	order = list_copy_tail(query->sortClause, nkeys);
	if (!first_key_is_distance(order, query->targetList))
		return;
	for (int i = 0; i < nkeys; i++)
		if (!list_member_ptr(query->distinctClause, list_nth(query->sortClause, i)) &&
			!list_member(query->distinctClause, list_nth(query->sortClause, i)))
		{
			knn_scan_reject("the DISTINCT ON keys are not the first ORDER BY keys");
			return;
		}
	if (query->hasWindowFuncs)
	{
		knn_scan_reject("the DISTINCT ON query has window functions");
		return;
	}
	if (!recognise_pairs(query, query->distinctClause, order, true, &shape))
		return;
	shape.limit = int8_const(1);
	id = note_rewrite(state);
	if (id == 0)
		return;
	elog(DEBUG1, "KNN Join: the DISTINCT ON query over \"%s\" is planned as a LATERAL top-1 subquery",
		 rt_fetch(shape.t_index, query->rtable)->eref->aliasname);
	rewrite_as_lateral(&shape, FROM_DISTINCT_ON, id);
	query->sortClause = list_truncate(query->sortClause, nkeys);
	query->distinctClause = NIL;
	query->hasDistinctOn = false;
}

/* Every query of the statement: the top one, those in FROM, WITH and sub-selects. */
static bool
rewrite_walker(Node *node, void *context)
{
	if (node == NULL)
		return false;
	if (IsA(node, Query))
	{
		Query	   *query = (Query *) node;

		try_window_form(query, (RewriteState *) context);
		try_distinct_on_form(query, (RewriteState *) context);
		return query_tree_walker(query, rewrite_walker, context, 0);
	}
	return expression_tree_walker(node, rewrite_walker, context);
}

static PlannedStmt *
plan_next(Query *parse, const char *query_string, int cursorOptions, ParamListInfo boundParams)
{
	if (prev_planner_hook)
		return prev_planner_hook(parse, query_string, cursorOptions, boundParams);
	return standard_planner(parse, query_string, cursorOptions, boundParams);
}

/* Notes each plan of a rewritten subquery (RewriteState.planned_ids). */
static void
count_planned_rewrite(PlannerInfo *root, RelOptInfo *rel, Index rti, RangeTblEntry *rte)
{
	int			id;

	if (prev_rel_pathlist_hook)
		prev_rel_pathlist_hook(root, rel, rti, rte);
	if (planning == NULL || !planning->counting || rte->rtekind != RTE_SUBQUERY ||
		IS_DUMMY_REL(rel))
		return;
	id = knn_scan_rewrite_id(rte->subquery);
	if (id > 0 && id <= planning->rewrites)
	{
		planning->planned_ids = lappend_int(planning->planned_ids, id);
		planning->planned_roots = lappend(planning->planned_roots, root);
	}
}

/*
 * Whether a planning (root) was part of a subplan the statement does not
 * keep: setrefs picks one plan of each AlternativeSubPlan (a correlated
 * EXISTS, hashed or not) and leaves NULL where the other was in
 * glob->subplans, whose subroots hold the plannings (one list index each).
 * setrefs never visits a plan it left out, so the alternatives inside one
 * (an EXISTS in that EXISTS) stay in the list, unresolved and unreferenced:
 * a planning under a left-out one (parent_root) is left out too.
 */
static bool
in_dropped_subplan(PlannerInfo *root, PlannedStmt *plan)
{
	for (PlannerInfo *r = root; r != NULL; r = r->parent_root)
	{
		ListCell   *subroot;
		ListCell   *subplan;

		forboth(subroot, root->glob->subroots, subplan, plan->subplans)
		{
			if (lfirst(subroot) == r)
			{
				if (lfirst(subplan) == NULL)
					return true;
				break;
			}
		}
	}
	return false;
}

/*
 * Plans with `planning` set to state, whose rewritten subqueries'
 * plans count_planned_rewrite counts (NULL: a statement that counts none,
 * also one planned while another is), and restored after, also on error.
 */
static PlannedStmt *
plan_counting(RewriteState *state, Query *parse, const char *query_string, int cursorOptions,
			  ParamListInfo boundParams)
{
	RewriteState *outer = planning;
	PlannedStmt *plan;

	planning = state;
	PG_TRY();
	{
		plan = plan_next(parse, query_string, cursorOptions, boundParams);
	}
	PG_FINALLY();
	{
		planning = outer;
	}
	PG_END_TRY();
	return plan;
}

/*
 * Rewrites, plans, and keeps the plan only where a KNN Join runs every
 * plan of every rewritten subquery. Where one does not (the node declined
 * it, or lost on cost), PostgreSQL's plan of the LATERAL form would differ
 * from the query as written without a word in EXPLAIN, and could read an
 * approximate index (pgvector's hnsw or ivfflat) that the query as written
 * never reads: the query as written is planned instead.
 */
static PlannedStmt *
knn_window_planner(Query *parse, const char *query_string, int cursorOptions,
				   ParamListInfo boundParams)
{
	RewriteState state = {parse, NULL, 0, false, NIL, NIL};
	PlannedStmt *plan;
	int		   *run;
	int		   *planned;
	ListCell   *id_cell;
	ListCell   *root_cell;
	int			missing = 0;

	if (knn_gpu_enable_knn_join)
		rewrite_walker((Node *) parse, &state);
	if (state.rewrites == 0)
		return plan_counting(NULL, parse, query_string, cursorOptions, boundParams);
	state.counting = true;
	plan = plan_counting(&state, parse, query_string, cursorOptions, boundParams);
	planned = palloc0(sizeof(int) * (state.rewrites + 1));
	forboth(id_cell, state.planned_ids, root_cell, state.planned_roots)
		if (!in_dropped_subplan((PlannerInfo *) lfirst(root_cell), plan))
			planned[lfirst_int(id_cell)]++;
	/*
	 * the KNN Joins of the plan kept: its tree and the subplans (sub-selects,
	 * initplans, CTEs) not left out, as the plannings above
	 */
	run = palloc0(sizeof(int) * (state.rewrites + 1));
	knn_scan_count_rewritten_joins(plan->planTree, run, state.rewrites);
	if (state.planned_roots != NIL)
	{
		PlannerGlobal *glob = ((PlannerInfo *) linitial(state.planned_roots))->glob;
		ListCell   *subroot;
		ListCell   *subplan;

		forboth(subroot, glob->subroots, subplan, plan->subplans)
			if (!in_dropped_subplan((PlannerInfo *) lfirst(subroot), plan))
				knn_scan_count_rewritten_joins((Plan *) lfirst(subplan), run, state.rewrites);
	}
	for (int id = 1; id <= state.rewrites; id++)
		if (run[id] < planned[id])
			missing++;
	if (missing == 0)
		return plan;
	elog(DEBUG1, "KNN Join not used: no KNN Join runs %d of the %d rewritten LATERAL subqueries; the query is planned as written",
		 missing, state.rewrites);
	return plan_counting(NULL, state.as_written, query_string, cursorOptions, boundParams);
}

void
knn_scan_window_register(void)
{
	prev_planner_hook = planner_hook;
	planner_hook = knn_window_planner;
	prev_rel_pathlist_hook = set_rel_pathlist_hook;
	set_rel_pathlist_hook = count_planned_rewrite;
}
