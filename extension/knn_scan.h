/*
 * knn_scan.h -- the KNN Join custom scan: plans pgvector-style
 *
 *     SELECT ... FROM queries q
 *     CROSS JOIN LATERAL (SELECT ..., t.v <-> q.v AS dist FROM items t
 *                         ORDER BY t.v <-> q.v LIMIT k) n
 *
 * (and a plain join "FROM queries q JOIN items t ON t.v <-> q.v < r", which is
 * what such a subquery with a radius and without ORDER BY or LIMIT becomes)
 * and its variants: LEFT JOIN LATERAL (...) ON ..., "WHERE t.id <> q.id"
 * in the subquery (the engine's self-exclusion, keys from knn_keys.h),
 * "WHERE t.g = q.g [AND t.h = q.h ...]" (the engine's per-group join, group
 * ids from knn_group_keys.h),
 * further ORDER BY keys after the distance (the inner scan's order, which
 * is the tie order), OFFSET, a radius "WHERE t.v <-> q.v < r" (or <=;
 * r a run-time constant), with or without LIMIT (the engine's range join),
 * FETCH FIRST ... WITH TIES, a view or a subquery over one table in place
 * of items, and a query vector that is an expression of the outer row,
 *
 * as one batched join: every outer row and every row of items is read once,
 * all vectors go to the engine in one call, and the rows come back per
 * outer row in distance order, as the nested loop would return them.
 *
 * knn_scan_shape.c recognises the subquery's shape;
 * knn_scan_path.c  checks the join (set_join_pathlist_hook), costs it
 *                  and adds a KnnJoinPath beside PostgreSQL's nested loop;
 * knn_scan_plan.c  turns the path into a CustomScan: the outer side's plan
 *                  and a plain scan plan of the inner relation as children;
 * knn_scan_exec.c  runs it: reads both children, calls the engine, emits;
 * knn_scan_ties.c  the engine's rows for FETCH FIRST ... WITH TIES;
 * knn_scan_shard.c the inner relation's partitions that join on their own
 *                  servers (knn_scan_shard.h);
 * knn_scan_window.c the same query written with row_number(), rank() or DISTINCT ON,
 *                  rewritten into the LATERAL form before planning.
 */
#ifndef KNN_SCAN_H
#define KNN_SCAN_H

#include "postgres.h"

#include "nodes/extensible.h"
#include "nodes/pathnodes.h"

#include "knn_catalog.h"
#include "knn_matrix.h"
#include "knn_run.h"

#define KNN_JOIN_NAME "KNN Join"

/* Registers the custom scan methods and planner hook; called from _PG_init. */
extern void knn_scan_register(void);

/*
 * The path: PostgreSQL never copies paths, so the recognised shape rides
 * along after the CustomPath. custom_paths holds the outer path only; the
 * inner relation's scan is planned when the path is turned into a plan
 * (knn_scan_plan.c says why).
 */
typedef struct KnnJoinPath
{
	CustomPath	cpath;			/* must be first */
	RelOptInfo *subquery_rel;	/* the lateral subquery: the join's inner rel
								 * (NULL for a plain radius join) */
	Path	   *inner_path;		/* a plain radius join "a.v <op> b.v < r" of
								 * two relations of this query: the inner
								 * side's path (custom_paths' second);
								 * NULL for a lateral subquery */
	Var		   *target_vector;	/* inner operand: a Var of the subquery's one
								 * relation, as it appears in the subquery */
	AttrNumber	target_relation_column; /* that column in the table under a
										 * view or subquery (0: computed) */
	Expr	   *query_vector;	/* outer operand: a Var of this query, or an
								 * expression of its Vars that the node
								 * computes (simplified as the planner does) */
	bool		target_is_left; /* ORDER BY target <op> query (for messages) */
	Oid			distance_operator;	/* <->, <=>, <#> or <+> */
	KnnMetric	metric;
	List	   *distance_columns;	/* IntList: subquery columns that are the
									 * ORDER BY distance */
	List	   *needed_columns; /* IntList: the other subquery columns used
								 * above the join, ascending */
	Expr	   *limit;			/* the LIMIT count as the subquery planned it */
	Expr	   *offset;			/* the OFFSET, or NULL */
	bool		with_ties;		/* FETCH FIRST ... WITH TIES: also the rows
								 * that tie with the last one on every ORDER
								 * BY key */
	List	   *tie_order;		/* SortGroupClauses after the distance's */
	JoinType	jointype;		/* JOIN_INNER or JOIN_LEFT */
	List	   *join_clauses;	/* RestrictInfos that decide a match (all of
								 * them for an inner join) */
	List	   *other_clauses;	/* JOIN_LEFT: pushed-down ones, checked after
								 * null-extension too */

	/* Self-exclusion "exclude_target <> exclude_query", or all NULL/0. */
	Node	   *exclude_qual;	/* the conjunct of the subquery's WHERE */
	Var		   *exclude_target; /* inner operand, as in the subquery */
	Var		   *exclude_query;	/* outer operand, as a Var of this query */
	Oid			exclude_collation;

	/*
	 * Conditions of the WHERE on the relation alone that may fail (not
	 * leakproof) and that PostgreSQL evaluates after the self-exclusion,
	 * the WHERE's only condition on the outer row: PostgreSQL evaluates them
	 * for an inner row only when it meets an outer row of another, non-NULL
	 * key. The inner scan leaves them out; the node evaluates them for
	 * those rows only (knn_scan_exec.c). NIL: none.
	 */
	List	   *deferred_quals; /* the conjuncts of the subquery's WHERE they
								 * are (left out of the inner scan) */
	List	   *deferred_clauses;	/* the conditions as planned, in the order
									 * PostgreSQL evaluates them */

	/*
	 * Group equalities "group_targets[i] = group_queries[i]": a query meets
	 * only targets whose group columns all equal its own.
	 */
	List	   *group_quals;	/* the conjuncts of the subquery's WHERE */
	List	   *group_targets;	/* Vars: inner operands, as in the subquery */
	List	   *group_queries;	/* Vars: outer operands, as Vars of this query */
	List	   *group_collations;	/* OidList: each operator's collation */

	/* The form the subquery was rewritten from (knn_scan_window.c), or NULL. */
	const char *rewritten_from;
	int			rewrite_id;		/* which rewrite of the statement, or 0 */

	/* Radius "<distance> < radius" (or <=), or NULL. */
	Node	   *radius_qual;	/* the conjunct of the subquery's WHERE, or
								 * a plain join's clause */
	Expr	   *radius;			/* the run-time constant */
	bool		radius_inclusive;	/* <= rather than < */
} KnnJoinPath;

/* knn_scan_shape.c */
extern Index knn_scan_recognise_subquery(PlannerInfo *root, Query *sq, KnnJoinPath *kp);
extern bool knn_scan_is_run_time_constant(Node *node);
extern bool knn_scan_reject(const char *reason);	/* DEBUG1; returns false */
extern bool knn_scan_contains_distance(Node *node); /* a distance operator in it? */
extern Node *knn_scan_without_relabel(Node *node);	/* under binary-compatible relabellings */
extern bool knn_scan_orders_by_distance(Query *sq); /* some ORDER BY key a distance? */
/* A top-k subquery whose first ORDER BY key references `levels` query levels up? */
extern bool knn_scan_top_k_reaches_up(Query *sq, Index levels);
extern bool knn_scan_recognise_radius_clause(Expr *clause, Relids inner_relids,
											 Relids outer_relids, KnnJoinPath *kp);

/* knn_scan_window.c: installs the planner hook; called by knn_scan_register. */
extern void knn_scan_window_register(void);
/*
 * "row_number() window", "rank() window" or "DISTINCT ON" for a LATERAL
 * subquery that the planner hook rewrote from that form; NULL: written so.
 */
extern const char *knn_scan_rewritten_from(const Query *sq);
/* The statement's rewrite (1, 2, ...) that made sq, or 0: written so. */
extern int	knn_scan_rewrite_id(const Query *sq);

/* knn_scan_plan.c */
extern const CustomPathMethods knn_join_path_methods;
extern void knn_scan_register_plan(void);
/*
 * Counts the KNN Join nodes of a plan tree (not the statement's subplans,
 * which the caller picks) that run a rewritten subquery: run[id] for
 * rewrite id (1..n_ids), ids beyond n_ids not counted.
 */
extern void knn_scan_count_rewritten_joins(Plan *plan, int *run, int n_ids);

/* knn_scan_exec.c */
extern Node *knn_join_create_scan_state(CustomScan *cscan);

/* knn_scan_ties.c */

/* Runs a k-nearest problem (problem->k set) whose query rows are queries'. */
typedef void (*KnnTopKRun) (void *arg, KnnProblem *problem, const KnnMatrix *queries,
							int64 *neighbors, double *distances, KnnStats *stats);

/*
 * FETCH FIRST wanted ROWS WITH TIES: hands sink, per query of problem, its
 * first `wanted` rows and every further one whose distance equals the
 * wanted-th's, in the engine's order, each query's rows in one call
 * (through run, again for the queries whose ties go on). stats are the
 * first run's, with the distance computations of all.
 */
extern void knn_scan_run_with_ties(const KnnProblem *problem, const KnnMatrix *queries,
								   int64 wanted, KnnTopKRun run, void *run_arg,
								   KnnPairSink sink, void *sink_arg, KnnStats *stats);

/*
 * The CustomScan's custom_private: a List of these, in this order. Scan
 * columns (custom_scan_tlist) each name their source: >0 is that column of
 * the outer child's rows, <0 is column -source of the inner child's rows,
 * 0 is the distance.
 */
typedef enum KnnJoinPrivate
{
	KNN_PRIVATE_METRIC = 0,		/* Integer: KnnMetric */
	KNN_PRIVATE_QUERY_COLUMN,	/* Integer: query vector column in outer rows,
								 * 0 = the expression KNN_EXPR_QUERY_VECTOR */
	KNN_PRIVATE_TARGET_COLUMN,	/* Integer: target vector column in inner rows */
	KNN_PRIVATE_TARGET_IS_LEFT, /* Integer: 1 when ORDER BY target <op> query */
	KNN_PRIVATE_SOURCES,		/* IntList: one source per scan column */
	KNN_PRIVATE_JOIN_TYPE,		/* Integer: JoinType, inner or left */
	KNN_PRIVATE_EXCLUDE_QUERY,	/* Integer: key column in outer rows, 0 = none */
	KNN_PRIVATE_EXCLUDE_TARGET, /* Integer: key column in inner rows */
	KNN_PRIVATE_EXCLUDE_TYPE,	/* Integer: the keys' type (an Oid) */
	KNN_PRIVATE_EXCLUDE_COLLATION,	/* Integer: the operator's collation */
	KNN_PRIVATE_EXCLUDE_TEXT,	/* String: "t.id <> q.id" for EXPLAIN */
	KNN_PRIVATE_GROUP_QUERY,	/* IntList: group key columns in outer rows, NIL = none */
	KNN_PRIVATE_GROUP_TARGET,	/* IntList: group key columns in inner rows */
	KNN_PRIVATE_GROUP_TYPES,	/* IntList: the keys' types (Oids) */
	KNN_PRIVATE_GROUP_COLLATIONS,	/* IntList: the operators' collations */
	KNN_PRIVATE_GROUP_TEXT,		/* String: "t.g = q.g, ..." for EXPLAIN */
	KNN_PRIVATE_RADIUS,			/* Integer: KnnRange, KNN_RANGE_NONE = no radius */
	KNN_PRIVATE_WITH_TIES,		/* Integer: 1 for FETCH FIRST ... WITH TIES */
	KNN_PRIVATE_TIE_COLUMNS,	/* IntList: the ORDER BY keys after the distance,
								 * as columns of the inner rows */
	KNN_PRIVATE_TIE_EQUALITY,	/* IntList: their equality operators (Oids) */
	KNN_PRIVATE_TIE_COLLATIONS, /* IntList: their collations */
	KNN_PRIVATE_OPERATOR,		/* Integer: the distance operator (an Oid) */
	KNN_PRIVATE_ORDER_COLUMNS,	/* IntList: the ORDER BY keys after the distance
								 * (WITH TIES or not), as columns of the inner rows */
	KNN_PRIVATE_ORDER_OPERATORS,	/* IntList: their sort operators (Oids) */
	KNN_PRIVATE_ORDER_COLLATIONS,	/* IntList: their collations */
	KNN_PRIVATE_ORDER_NULLS_FIRST,	/* IntList: 1 for NULLS FIRST */
	KNN_PRIVATE_AFTER_EXCLUSION,	/* List: the conditions evaluated after the
									 * self-exclusion (KnnJoinPath's
									 * deferred_clauses), their Vars INNER_VAR
									 * columns of the inner rows; NIL = none */
	KNN_PRIVATE_AFTER_EXCLUSION_TEXT,	/* String: them, for EXPLAIN */
	KNN_PRIVATE_REWRITTEN_FROM, /* String: the query form knn_scan_window.c
								 * rewrote into the LATERAL subquery, for
								 * EXPLAIN; "" = written as LATERAL */
	KNN_PRIVATE_REWRITE_ID,		/* Integer: which rewrite of the statement
								 * (knn_scan_rewrite_id), 0 = none */
	KNN_PRIVATE_COUNT
} KnnJoinPrivate;

/*
 * custom_exprs: the LIMIT count (NULL: none), the OFFSET (or NULL), the
 * join filter (a List, implicitly ANDed: clauses that decide whether a
 * joined row is a match -- filters above the subquery's LIMIT and the
 * join's clauses), the filter (a List, JOIN_LEFT only: pushed-down
 * clauses, checked on matches and null-extended rows alike), the radius
 * (or NULL) and the query vector when it is an expression of the outer row
 * (or NULL: a column, KNN_PRIVATE_QUERY_COLUMN).
 */
typedef enum KnnJoinExpr
{
	KNN_EXPR_LIMIT = 0,
	KNN_EXPR_OFFSET,
	KNN_EXPR_JOIN_FILTER,
	KNN_EXPR_FILTER,
	KNN_EXPR_RADIUS,
	KNN_EXPR_QUERY_VECTOR
} KnnJoinExpr;

/* custom_plans: the outer side's plan, then the inner relation's scan. */
#define KNN_OUTER_CHILD 0
#define KNN_INNER_CHILD 1

#endif							/* KNN_SCAN_H */
