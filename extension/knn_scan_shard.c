/*
 * knn_scan_shard.c -- the KNN Join node over a sharded inner relation
 * (knn_scan_shard.h).
 *
 * What each shard runs, per partition of its own (UNION ALL), is the
 * user's LATERAL query over postgres_fdw's remote SELECT of that partition
 * (with the filters postgres_fdw pushed down), so that the shard's own
 * KNN Join node (or its nested loop) answers it:
 *
 *     SELECT q.qid, n.d, n.a2 ... FROM pg_temp.<queries> q
 *     CROSS JOIN LATERAL (SELECT s.c1 AS a2, ..., s.c2 OPERATOR(public.<->) q.v AS d
 *                         FROM (<remote select>) s(c1, ..., cn)
 *                         WHERE s.c3 OPERATOR(pg_catalog.<>) q.x1     -- self-exclusion
 *                           AND s.c4 OPERATOR(pg_catalog.=) q.x2      -- group keys
 *                               [COLLATE pg_catalog."C"]              -- (collatable ones)
 *                           AND (s.c2 OPERATOR(public.<->) q.v) OPERATOR(pg_catalog.<) $2 -- radius
 *                         ORDER BY s.c2 OPERATOR(public.<->) q.v, s.c1 ASC NULLS LAST
 *                         LIMIT $1) n                                 -- OFFSET + LIMIT
 *
 * Exactness: the operator there is found by catalog identity (the same
 * extension at the same version, the same C function, the same operand
 * type: knn_shard_remote_operator), the query vectors go in their
 * type's binary send form, and the columns the join computes with are of
 * the declared types there (knn_shard_types.c; else read here), so the
 * shard computes the very distances this server would. Self-exclusion and group values go the same way; they are
 * pushed only for PostgreSQL's own types, whose equality is the same on
 * every server (and under a deterministic collation, bytewise: compared
 * there under "C", whatever the collation of the shard's column). ORDER BY
 * keys after the distance are pushed only for PostgreSQL's own types in
 * their default order and without a collation that could sort otherwise
 * there (none, "C" or "POSIX"). Anything else keeps the node's plan here,
 * with a NOTICE.
 *
 * Each shard returns at most OFFSET + LIMIT rows per outer row and
 * partition (and, WITH TIES, those tied with the last); the node's own
 * answer is among their union with the local part's, so merging them by
 * the ORDER BY (then source and rank, for rows the ORDER BY leaves tied)
 * and taking the node's OFFSET and LIMIT gives it. Nor need all of them
 * be held: as they come, an outer row's shard rows are cut back, now and
 * then, to its first OFFSET + LIMIT of them in that order (WITH TIES, and
 * those tied with the last): the node's rows among the shards' are among
 * those, whatever the local part brings (more rows only move the last
 * one up). Results come in text,
 * each column through this server's input function of its type, as
 * postgres_fdw reads them (extra_float_digits = 3: distances exactly).
 */
#include "postgres.h"

#include <math.h>

#include "access/detoast.h"
#include "access/htup_details.h"
#include "access/stratnum.h"
#include "access/tupdesc.h"
#include "catalog/pg_am.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_type.h"
#include "commands/defrem.h"
#include "executor/tuptable.h"
#include "lib/stringinfo.h"
#include "libpq/pqformat.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "nodes/nodeFuncs.h"
#include "parser/parsetree.h"
#include "portability/instr_time.h"
#include "utils/builtins.h"
#include "utils/float.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/sortsupport.h"
#include "utils/typcache.h"

#include "knn_scan_shard.h"
#include "knn_settings.h"
#include "knn_shard.h"
#include "knn_stats.h"

/* An ORDER BY key after the distance. */
typedef struct TieKey
{
	AttrNumber	column;			/* in the inner rows */
	Oid			type;
	Oid			sort_operator;
	Oid			collation;
	bool		nulls_first;
	SortSupportData sort;
} TieKey;

/* A shard's candidate while the shards' rows arrive, with its row read back. */
typedef struct HeldCandidate
{
	KnnScanCandidate c;
	MinimalTuple row;
} HeldCandidate;

/*
 * An outer row's shard candidates kept so far: when they reach prune_at
 * they are cut back to those that can still be among its first `want`
 * rows.
 */
typedef struct HeldRows
{
	HeldCandidate *items;
	int64		n;
	int64		capacity;
	int64		prune_at;
} HeldRows;

/* What the node knows of one shard. */
typedef struct ShardOperator
{
	char	   *schema;			/* the distance operator's there, quoted */
	char	   *operand_type;	/* its operands' type there, qualified */
} ShardOperator;

/* A value shipped with each query: its column in the outer rows and how it is sent. */
typedef struct ShippedValue
{
	AttrNumber	column;
	FmgrInfo	send;
	bool		collatable;		/* compared there under "C" (compared_there) */
} ShippedValue;

struct KnnScanShards
{
	KnnShardPlan sp;
	KnnOperatorIdentity identity;
	bool		target_is_left;
	AttrNumber	target_column;
	AttrNumber	exclude_target_column;	/* 0: none */
	int			n_group_columns;
	const AttrNumber *group_target_columns;
	KnnRange	radius_mode;
	bool		has_limit;
	bool		with_ties;
	int			n_ties;
	TieKey	   *ties;
	int			n_read_back;
	AttrNumber *read_back;		/* ascending */

	/* the query rows: qid, vector, [exclusion value], [group values] */
	int			n_shipped;
	ShippedValue *shipped;		/* from the vector on */
	List	   *shipped_type_names;	/* after the vector's: x1, x2, ... */

	/* one run */
	int64		n_outer;
	MinimalTuple *outer_rows;
	TupleTableSlot *outer_slot;
	MemoryContext row_cxt;
	Oid			param_types[2];
	char	   *param_values[2];
	int			n_params;
	/* ... and for collect */
	TupleDesc	inner_desc;
	FmgrInfo   *inputs;			/* per column read back */
	Oid		   *ioparams;
	HeldRows   *held;			/* per outer row: its shard rows kept so far */
	MemoryContext held_cxt;		/* held and its arrays (their rows in cxt) */
	TupleTableSlot *held_slot_a;	/* to compare them by their ORDER BY keys */
	TupleTableSlot *held_slot_b;
	KnnScanCandidates *candidates;
	MemoryContext cxt;
	Datum	   *values;			/* a row read back (inner_desc's columns) */
	bool	   *nulls;
	int64	  **next_rank;		/* per shard: per outer row, its rows so far */
	int64	   *received;		/* per shard: its rows so far */

	/* for EXPLAIN ANALYZE and knn_gpu_last_shard_stats() */
	StringInfoData fallbacks;
	int64		want;
	instr_time	started;
	bool		ran;
	double		seconds_ship;
	double		seconds_local;
	double		seconds_merge;
	int64		local_targets;
	int64		merged;
	bool		local_after;
	KnnShardSummary *totals;	/* every run of the statement, summed (NULL: none) */
	MemoryContext node_cxt;		/* the node's: what outlives a run (totals) */
	MemoryContext run_cxt;		/* one run's scratch (its SQL, the shards' statistics) */
};

/* ---- which joins can go to the shards ---- */

/*
 * Binary send functions write text in this session's client encoding
 * (pq_sendtext), while the shard's connection reads it in the database's:
 * keys of such types travel only where the two encodings agree.
 */
static const char *
encoding_blocks_shipping(Oid type)
{
	char		category;
	bool		preferred;

	get_type_category_preferred(type, &category, &preferred);
	if ((category == TYPCATEGORY_STRING || type == JSONBOID || type == JSONOID || type == XMLOID) &&
		pg_get_client_encoding() != GetDatabaseEncoding())
		return "a text key would travel in the client encoding, which is not the database's";
	return NULL;
}

/* Is equality of this type the same on every server (PostgreSQL's own type and operator)? */
static bool
equality_travels(Oid type, Oid collation)
{
	TypeCacheEntry *entry;

	type = getBaseType(type);
	if (type >= FirstNormalObjectId)
		return false;
	entry = lookup_type_cache(type, TYPECACHE_EQ_OPR);
	if (!OidIsValid(entry->eq_opr) || entry->eq_opr >= FirstNormalObjectId)
		return false;
	return !OidIsValid(collation) || get_collation_isdeterministic(collation);
}

/* Does this ORDER BY key sort the same on every server? Then its SQL, else NULL. */
static char *
tie_key_order(TieKey *key, Oid type, const char *column)
{
	Oid			opfamily;
	Oid			opcintype;
	int16		strategy;
	Oid			opclass;

	type = getBaseType(type);
	if (type >= FirstNormalObjectId || key->sort_operator >= FirstNormalObjectId ||
		!get_ordering_op_properties(key->sort_operator, &opfamily, &opcintype, &strategy))
		return NULL;
	opclass = GetDefaultOpClass(type, BTREE_AM_OID);
	if (!OidIsValid(opclass) || get_opclass_family(opclass) != opfamily)
		return NULL;
	if (type_is_collatable(type) &&
		key->collation != C_COLLATION_OID && key->collation != POSIX_COLLATION_OID)
		return NULL;
	/* (the COLLATE belongs to the expression: before DESC and NULLS) */
	return psprintf("%s%s %s NULLS %s", column,
					type_is_collatable(type) ? " COLLATE pg_catalog.\"C\"" : "",
					strategy == BTGreaterStrategyNumber ? "DESC" : "ASC",
					key->nulls_first ? "FIRST" : "LAST");
}

static Oid	inner_column_type(Plan *top, AttrNumber column);

/* The ORDER BY keys after the distance (the node's subquery's). */
static void
find_tie_keys(KnnScanShards *sh, const KnnScanShardSpec *spec, Plan *top)
{
	sh->n_ties = spec->n_order_keys;
	sh->ties = palloc0(Max(sh->n_ties, 1) * sizeof(TieKey));
	for (int i = 0; i < sh->n_ties; i++)
	{
		TieKey	   *key = &sh->ties[i];

		key->column = spec->order_columns[i];
		key->type = inner_column_type(top, key->column);
		key->sort_operator = spec->order_operators[i];
		key->collation = spec->order_collations[i];
		key->nulls_first = spec->order_nulls_first[i];
		key->sort.ssup_cxt = CurrentMemoryContext;
		key->sort.ssup_collation = key->collation;
		key->sort.ssup_nulls_first = key->nulls_first;
		PrepareSortSupportFromOrderingOp(key->sort_operator, &key->sort);
	}
}

/* The type of an inner column. */
static Oid
inner_column_type(Plan *top, AttrNumber column)
{
	TargetEntry *tle = list_nth_node(TargetEntry, top->targetlist, column - 1);

	return exprType((Node *) tle->expr);
}

/* Adds an inner column to the typed ones, once. */
static void
add_typed_column(AttrNumber *columns, int *n, AttrNumber column)
{
	for (int i = 0; i < *n; i++)
		if (columns[i] == column)
			return;
	columns[(*n)++] = column;
}

/*
 * The inner columns the shards' join computes with (the vector, the
 * self-exclusion, the group keys, the ORDER BY keys after the distance):
 * each must have there the type declared here (knn_shard_types.c). The
 * columns only read back travel as text through this server's input
 * functions, as postgres_fdw reads them.
 */
static void
typed_columns(KnnScanShards *sh)
{
	AttrNumber *columns = palloc((2 + sh->n_group_columns + sh->n_ties) * sizeof(AttrNumber));
	int			n = 0;

	add_typed_column(columns, &n, sh->target_column);
	if (sh->exclude_target_column > 0)
		add_typed_column(columns, &n, sh->exclude_target_column);
	for (int g = 0; g < sh->n_group_columns; g++)
		add_typed_column(columns, &n, sh->group_target_columns[g]);
	for (int i = 0; i < sh->n_ties; i++)
		add_typed_column(columns, &n, sh->ties[i].column);
	sh->sp.typed_columns = columns;
	sh->sp.n_typed_columns = n;
}

/*
 * Why the node's join cannot go to shards, or NULL; fills the query rows'
 * values and the node's settings in.
 */
static const char *
not_pushable(KnnScanShards *sh, const KnnScanShardSpec *spec, Plan *top)
{
	Oid			send;
	bool		varlena;
	const char *why;

	if (!knn_distance_operator_identity(spec->distance_operator, &sh->identity))
		return "its distance operator is not found by catalog identity";
	/* (the node computes it for the outer rows that meet a row of the relation) */
	if (spec->query_column == 0)
		return "the query vector is an expression of the outer row";
	sh->target_is_left = spec->target_is_left;
	sh->target_column = spec->target_column;
	sh->radius_mode = spec->radius_mode;
	sh->has_limit = spec->has_limit;
	sh->with_ties = spec->with_ties;

	sh->shipped = palloc0((2 + spec->n_group_columns) * sizeof(ShippedValue));
	sh->shipped[0].column = spec->query_column;
	getTypeBinaryOutputInfo(getBaseType(TupleDescAttr(spec->outer_desc, spec->query_column - 1)->atttypid),
							&send, &varlena);
	fmgr_info(send, &sh->shipped[0].send);
	sh->n_shipped = 1;
	if (spec->exclude_query_column > 0)
	{
		Oid			type = getBaseType(spec->exclude_type);

		if (!equality_travels(type, spec->exclude_collation))
			return "the self-exclusion compares values of a type other than PostgreSQL's own";
		if ((why = encoding_blocks_shipping(type)) != NULL)
			return why;
		sh->exclude_target_column = spec->exclude_target_column;
		sh->shipped[sh->n_shipped].column = spec->exclude_query_column;
		sh->shipped[sh->n_shipped].collatable = type_is_collatable(type);
		getTypeBinaryOutputInfo(type, &send, &varlena);
		fmgr_info(send, &sh->shipped[sh->n_shipped].send);
		sh->shipped_type_names = lappend(sh->shipped_type_names, format_type_be_qualified(type));
		sh->n_shipped++;
	}
	for (int g = 0; g < spec->n_group_columns; g++)
	{
		Oid			type = getBaseType(spec->group_types[g]);

		if (!equality_travels(type, spec->group_collations[g]))
			return "a group key is of a type other than PostgreSQL's own";
		if ((why = encoding_blocks_shipping(type)) != NULL)
			return why;
		sh->shipped[sh->n_shipped].column = spec->group_query_columns[g];
		sh->shipped[sh->n_shipped].collatable = type_is_collatable(type);
		getTypeBinaryOutputInfo(type, &send, &varlena);
		fmgr_info(send, &sh->shipped[sh->n_shipped].send);
		sh->shipped_type_names = lappend(sh->shipped_type_names, format_type_be_qualified(type));
		sh->n_shipped++;
	}
	sh->n_group_columns = spec->n_group_columns;
	sh->group_target_columns = spec->group_target_columns;

	find_tie_keys(sh, spec, top);
	for (int i = 0; i < sh->n_ties; i++)
		if (tie_key_order(&sh->ties[i], sh->ties[i].type, "x") == NULL)
			return "an ORDER BY key after the distance may sort otherwise on another server";

	typed_columns(sh);

	sh->n_read_back = 0;
	sh->read_back = palloc(Max(bms_num_members(spec->read_back), 1) * sizeof(AttrNumber));
	{
		int			column = -1;

		while ((column = bms_next_member(spec->read_back, column)) >= 0)
			sh->read_back[sh->n_read_back++] = (AttrNumber) column;
	}
	return NULL;
}

/* knn_shard_open's check: the distance operator there. */
static const char *
check_operator(void *arg, KnnShardRemote *shard)
{
	KnnScanShards *sh = (KnnScanShards *) arg;
	ShardOperator *op = palloc0(sizeof(ShardOperator));
	const char *why = NULL;

	op->schema = knn_shard_remote_operator(shard, &sh->identity, &op->operand_type, &why);
	/* bit strings of any length ("bit" alone would be bit(1)); they pass as bit, binary-coercibly */
	if (sh->identity.type_extension == NULL)
		op->operand_type = "pg_catalog.varbit";
	shard->caller = op;
	return op->schema != NULL ? NULL : why;
}

/* ---- the shards' SQL ---- */

/* "s.c<i>": inner column `column` in a partition's rows there. */
static char *
remote_column(const KnnShardScan *scan, AttrNumber column)
{
	return psprintf("s.c%d", scan->positions[column - 1]);
}

/*
 * "s.c<i> OPERATOR(pg_catalog.<op>) q.x<shipped>": a shipped value compared
 * with the inner column there. Equality here is under a deterministic
 * collation (equality_travels), which compares bytewise, as "C" does; the
 * shard's column may have a collation of its own (nondeterministic:
 * case-insensitive, say), which would win over the query table's default
 * one there: so "C", explicitly.
 */
static char *
compared_there(KnnScanShards *sh, const KnnShardScan *scan, AttrNumber column, const char *op,
			   int shipped)
{
	return psprintf("%s OPERATOR(pg_catalog.%s) q.x%d%s", remote_column(scan, column), op, shipped,
					sh->shipped[shipped].collatable ? " COLLATE pg_catalog.\"C\"" : "");
}

static void
compose_join_sql(KnnScanShards *sh, KnnShardRemote *shard)
{
	ShardOperator *op = (ShardOperator *) shard->caller;
	StringInfoData sql;
	ListCell   *lc;
	int			radius_param = sh->has_limit ? 2 : 1;

	initStringInfo(&sql);
	foreach(lc, shard->scans)
	{
		KnnShardScan *scan = lfirst(lc);
		char	   *target = remote_column(scan, sh->target_column);
		char	   *distance = sh->target_is_left ?
			psprintf("%s OPERATOR(%s.%s) q.v", target, op->schema, sh->identity.name) :
			psprintf("q.v OPERATOR(%s.%s) %s", op->schema, sh->identity.name, target);
		List	   *where = NIL;
		ListCell   *lc_where;
		int			shipped = 1;

		appendStringInfo(&sql, "%sSELECT q.qid, n.d", sql.len > 0 ? " UNION ALL " : "");
		for (int i = 0; i < sh->n_read_back; i++)
			appendStringInfo(&sql, ", n.a%d", sh->read_back[i]);
		appendStringInfo(&sql, " FROM %s q CROSS JOIN LATERAL (SELECT ", shard->temp_table);
		for (int i = 0; i < sh->n_read_back; i++)
			appendStringInfo(&sql, "%s AS a%d, ", remote_column(scan, sh->read_back[i]),
							 sh->read_back[i]);
		appendStringInfo(&sql, "%s AS d FROM %s", distance, knn_shard_scan_from(scan, "s"));
		if (sh->exclude_target_column > 0)
			where = lappend(where, compared_there(sh, scan, sh->exclude_target_column, "<>",
												  shipped++));
		for (int g = 0; g < sh->n_group_columns; g++)
			where = lappend(where, compared_there(sh, scan, sh->group_target_columns[g], "=",
												  shipped++));
		if (sh->radius_mode != KNN_RANGE_NONE)
			where = lappend(where, psprintf("(%s) OPERATOR(pg_catalog.%s) $%d", distance,
											sh->radius_mode == KNN_RANGE_AT_MOST ? "<=" : "<",
											radius_param));
		foreach(lc_where, where)
			appendStringInfo(&sql, " %s %s", foreach_current_index(lc_where) == 0 ? "WHERE" : "AND",
							 (char *) lfirst(lc_where));
		appendStringInfo(&sql, " ORDER BY %s", distance);
		for (int i = 0; i < sh->n_ties; i++)
			appendStringInfo(&sql, ", %s",
							 tie_key_order(&sh->ties[i], sh->ties[i].type,
										   remote_column(scan, sh->ties[i].column)));
		if (sh->has_limit)
			appendStringInfoString(&sql, sh->with_ties ? " FETCH FIRST $1 ROWS WITH TIES" :
								   " LIMIT $1");
		appendStringInfoString(&sql, ") n");
	}
	shard->join_sql = sql.data;
	shard->binary_result = false;
	/* read row by row as it arrives: the limit is checked as they come */
	shard->stream_result = true;
}

/* The query table's columns there: qid, v, then x1, x2, ... */
static char *
column_definitions(KnnScanShards *sh, KnnShardRemote *shard)
{
	StringInfoData columns;
	ListCell   *lc;

	initStringInfo(&columns);
	appendStringInfo(&columns, "qid pg_catalog.int8, v %s",
					 ((ShardOperator *) shard->caller)->operand_type);
	shard->vector_column = "v";
	foreach(lc, sh->shipped_type_names)
		appendStringInfo(&columns, ", x%d %s", foreach_current_index(lc) + 1,
						 (char *) lfirst(lc));
	return columns.data;
}

/* ---- starting ---- */

/* A plan that returns no row, of the inner plan's columns: all partitions joined on their servers. */
static Plan *
empty_plan(Plan *top)
{
	Result	   *result = makeNode(Result);
	ListCell   *lc;

	foreach(lc, top->targetlist)
	{
		TargetEntry *tle = lfirst_node(TargetEntry, lc);
		Node	   *expr = (Node *) tle->expr;

		result->plan.targetlist =
			lappend(result->plan.targetlist,
					makeTargetEntry((Expr *) makeNullConst(exprType(expr), exprTypmod(expr),
														   exprCollation(expr)),
									tle->resno, tle->resname, false));
	}
	result->resconstantqual = (Node *) list_make1(makeBoolConst(false, false));
	result->plan.plan_width = top->plan_width;
	return &result->plan;
}

/* Is there a postgres_fdw scan anywhere in the plan (a shape we do not push)? */
static bool
has_postgres_fdw_scan(Plan *plan)
{
	ListCell   *lc;

	if (plan == NULL)
		return false;
	if (IsA(plan, ForeignScan) &&
		knn_shard_is_postgres_fdw(GetForeignServer(((ForeignScan *) plan)->fs_server)))
		return true;
	if (IsA(plan, Append))
	{
		foreach(lc, ((Append *) plan)->appendplans)
			if (has_postgres_fdw_scan(lfirst(lc)))
				return true;
	}
	else if (IsA(plan, MergeAppend))
	{
		foreach(lc, ((MergeAppend *) plan)->mergeplans)
			if (has_postgres_fdw_scan(lfirst(lc)))
				return true;
	}
	else if (IsA(plan, SubqueryScan))
		return has_postgres_fdw_scan(((SubqueryScan *) plan)->subplan);
	return has_postgres_fdw_scan(plan->lefttree) || has_postgres_fdw_scan(plan->righttree);
}

Plan *
knn_scan_shards_begin(Plan *inner_plan, List *rtable, const KnnScanShardSpec *spec,
					  KnnScanShards **shards)
{
	KnnScanShards *sh = palloc0(sizeof(KnnScanShards));
	Plan	   *base = inner_plan;
	Plan	   *local;
	const char *why;

	*shards = NULL;
	sh->node_cxt = CurrentMemoryContext;
	/* the partitions' scans, under the sort by the ORDER BY keys after the distance */
	if (IsA(base, Sort))
		base = outerPlan(base);
	sh->sp.who = "KNN Join";
	sh->sp.scans = knn_shard_partition_scans(base);
	if (sh->sp.scans == NIL)
	{
		if (has_postgres_fdw_scan(inner_plan))
			ereport(NOTICE,
					(errmsg("KNN Join reads the rows of its foreign tables here: its inner plan is not a scan of partitions")));
		return inner_plan;
	}
	knn_shard_classify(&sh->sp, rtable);
	if (sh->sp.n_shards == 0)
		return inner_plan;
	initStringInfo(&sh->fallbacks);
	if ((why = not_pushable(sh, spec, inner_plan)) != NULL)
	{
		ereport(NOTICE,
				(errmsg("KNN Join reads the rows of foreign server \"%s\"%s here: %s",
						sh->sp.shards[0]->server->servername,
						sh->sp.n_shards > 1 ? " and others" : "", why)));
		return inner_plan;
	}
	knn_shard_open(&sh->sp,
				   sh->identity.type_extension == NULL ? KNN_ELEMENT_BIT :
				   knn_vector_kind(sh->identity.operand_type) == KNN_VECTOR_HALFVEC ?
				   KNN_ELEMENT_FLOAT16 : KNN_ELEMENT_FLOAT32,
				   check_operator, sh, &sh->fallbacks);
	if (sh->sp.n_shards == 0)
		return inner_plan;

	for (int s = 0; s < sh->sp.n_shards; s++)
	{
		KnnShardRemote *shard = sh->sp.shards[s];

		knn_shard_remote_name_table(shard);
		shard->temp_columns = column_definitions(sh, shard);
		compose_join_sql(sh, shard);
	}
	sh->local_after = knn_shard_local_needs_shard_connection(&sh->sp, inner_plan, rtable);

	local = knn_shard_local_plan(base, &sh->sp);
	if (local == NULL)
		local = empty_plan(base);
	if (base != inner_plan)
	{
		Sort	   *sort = copyObject((Sort *) inner_plan);

		outerPlan(sort) = local;
		local = &sort->plan;
	}
	*shards = sh;
	return local;
}

bool
knn_scan_shards_local_after(const KnnScanShards *shards)
{
	return shards->local_after;
}

/* The query rows: (qid, vector, values of the self-exclusion and groups), binary. */
static void
encode_outer_row(void *arg, int64 row, StringInfo buf)
{
	KnnScanShards *sh = (KnnScanShards *) arg;
	MemoryContext old = MemoryContextSwitchTo(sh->row_cxt);

	MemoryContextReset(sh->row_cxt);
	pq_sendint32(buf, 8);
	pq_sendint64(buf, row);
	ExecStoreMinimalTuple(sh->outer_rows[row], sh->outer_slot, false);
	for (int i = 0; i < sh->n_shipped; i++)
	{
		bool		isnull;
		Datum		value = slot_getattr(sh->outer_slot, sh->shipped[i].column, &isnull);

		if (isnull)
			knn_shard_copy_field(buf, NULL, 0);
		else
		{
			bytea	   *sent = SendFunctionCall(&sh->shipped[i].send, value);

			knn_shard_copy_field(buf, VARDATA(sent), VARSIZE(sent) - VARHDRSZ);
		}
	}
	MemoryContextSwitchTo(old);
	CHECK_FOR_INTERRUPTS();
}

/* The largest query vector's size (the shipped column 0), header included; 0 if none. */
static int64
largest_query_vector(KnnScanShards *sh)
{
	int64		largest = 0;

	for (int64 row = 0; row < sh->n_outer; row++)
	{
		bool		isnull;
		Datum		value;

		ExecStoreMinimalTuple(sh->outer_rows[row], sh->outer_slot, false);
		value = slot_getattr(sh->outer_slot, sh->shipped[0].column, &isnull);
		if (!isnull)
			largest = Max(largest, (int64) toast_raw_datum_size(value));
		if (row % 65536 == 0)
			CHECK_FOR_INTERRUPTS();
	}
	return largest;
}

void
knn_scan_shards_start(KnnScanShards *sh, MinimalTuple *outer_rows, int64 n_outer,
					  TupleTableSlot *outer_slot, int64 want, double radius)
{
	KnnShardRows rows = {0};
	instr_time	start;
	MemoryContext old;

	sh->outer_rows = outer_rows;
	sh->n_outer = n_outer;
	sh->outer_slot = outer_slot;
	if (sh->row_cxt == NULL)
	{
		sh->row_cxt = AllocSetContextCreate(sh->node_cxt, "KNN Join shipping",
											ALLOCSET_DEFAULT_SIZES);
		sh->run_cxt = AllocSetContextCreate(sh->node_cxt, "KNN Join shard run",
											ALLOCSET_SMALL_SIZES);
	}

	/*
	 * What the shards' calls allocate (their SQL texts, their statistics)
	 * lives until the next run: a node rescanned once per outer row must
	 * not pile it up in the query's memory.
	 */
	MemoryContextReset(sh->run_cxt);
	for (int s = 0; s < sh->sp.n_shards; s++)
		sh->sp.shards[s]->remote_stats = NULL;	/* the last run's, in run_cxt */
	old = MemoryContextSwitchTo(sh->run_cxt);
	sh->n_params = 0;
	if (sh->has_limit)
	{
		/* all rows: a count no table reaches (a NULL count is an error WITH TIES) */
		sh->param_types[sh->n_params] = INT8OID;
		sh->param_values[sh->n_params++] = psprintf(INT64_FORMAT, want < 0 ? PG_INT64_MAX : want);
	}
	if (sh->radius_mode != KNN_RANGE_NONE)
	{
		sh->param_types[sh->n_params] = FLOAT8OID;
		sh->param_values[sh->n_params++] = knn_shard_float8_text(radius);
	}

	/*
	 * The connections were opened when the node started (a cursor's
	 * DECLARE); this run may be in a subtransaction begun since, whose
	 * rollback must stop its work there and drop its table.
	 */
	for (int s = 0; s < sh->sp.n_shards; s++)
		knn_shard_remote_take_again(sh->sp.shards[s]);
	INSTR_TIME_SET_CURRENT(start);
	sh->started = start;
	sh->want = want;
	rows.n = n_outer;
	rows.n_fields = 1 + sh->n_shipped;
	rows.max_vector_bytes = largest_query_vector(sh);
	rows.encode = encode_outer_row;
	rows.arg = sh;
	knn_shard_remote_ship(sh->sp.shards, sh->sp.n_shards, &rows);
	sh->seconds_ship = knn_seconds_since(start);
	for (int s = 0; s < sh->sp.n_shards; s++)
	{
		KnnShardRemote *shard = sh->sp.shards[s];

		shard->n_params = sh->n_params;
		shard->param_types = sh->param_types;
		shard->param_values = (const char *const *) sh->param_values;
	}
	knn_shard_remote_send(sh->sp.shards, sh->sp.n_shards);
	sh->ran = true;
	MemoryContextSwitchTo(old);
}

/* ---- the subquery's order ---- */

/* 0: a number, 1: NaN, 2: NULL, as ORDER BY float8 ASC sorts them. */
static int
distance_class(const KnnScanCandidate *c)
{
	return c->distance_null ? 2 : isnan(c->distance) ? 1 : 0;
}

/*
 * The subquery's ORDER BY of two candidates (the keys after the distance
 * read from their rows through the slots): 0 for rows it leaves tied.
 */
static int
compare_order(KnnScanShards *sh, const KnnScanCandidate *x, MinimalTuple row_x,
			  const KnnScanCandidate *y, MinimalTuple row_y,
			  TupleTableSlot *slot_a, TupleTableSlot *slot_b)
{
	int			cx = distance_class(x);
	int			cy = distance_class(y);

	if (cx != cy)
		return cx < cy ? -1 : 1;
	if (cx == 0 && x->distance != y->distance)
		return x->distance < y->distance ? -1 : 1;
	if (sh->n_ties > 0)
	{
		ExecStoreMinimalTuple(row_x, slot_a, false);
		ExecStoreMinimalTuple(row_y, slot_b, false);
		for (int i = 0; i < sh->n_ties; i++)
		{
			TieKey	   *key = &sh->ties[i];
			bool		null_a;
			bool		null_b;
			Datum		va = slot_getattr(slot_a, key->column, &null_a);
			Datum		vb = slot_getattr(slot_b, key->column, &null_b);
			int			order = ApplySortComparator(va, null_a, vb, null_b, &key->sort);

			if (order != 0)
				return order;
		}
	}
	return 0;
}

/* The merge's order: the ORDER BY, then source and rank (no two candidates tie). */
static int
compare_merge_order(KnnScanShards *sh, const KnnScanCandidate *x, MinimalTuple row_x,
					const KnnScanCandidate *y, MinimalTuple row_y,
					TupleTableSlot *slot_a, TupleTableSlot *slot_b)
{
	int			order = compare_order(sh, x, row_x, y, row_y, slot_a, slot_b);

	if (order != 0)
		return order;
	if (x->source != y->source)
		return x->source < y->source ? -1 : 1;
	if (x->rank != y->rank)
		return x->rank < y->rank ? -1 : 1;
	return 0;
}

/* ---- collecting ---- */

void
knn_scan_candidates_hold(KnnScanCandidates *candidates, int64 bytes)
{
	knn_scan_check_result_memory((double) candidates->held_bytes + (double) bytes);
	candidates->held_bytes += bytes;
}

void
knn_scan_candidates_begin(KnnScanCandidates *candidates)
{
	memset(candidates, 0, sizeof(KnnScanCandidates));
}

/* Room for `more` candidates: the array doubled, within what the limit leaves. */
static void
reserve_candidates(KnnScanCandidates *candidates, int64 more)
{
	int64		needed = candidates->n + more;
	int64		room;
	int64		capacity;

	if (needed <= candidates->capacity)
		return;
	room = (knn_result_memory_bytes() - candidates->held_bytes) / (int64) sizeof(KnnScanCandidate);
	capacity = Max(needed, Min(Max(candidates->capacity * 2, 1024),
							   candidates->capacity + Max(room, 0)));
	knn_scan_candidates_hold(candidates, (capacity - candidates->capacity) * (int64) sizeof(KnnScanCandidate));
	candidates->items = candidates->items == NULL ?
		palloc_extended(capacity * sizeof(KnnScanCandidate), MCXT_ALLOC_HUGE) :
		repalloc_huge(candidates->items, capacity * sizeof(KnnScanCandidate));
	candidates->capacity = capacity;
}

void
knn_scan_candidates_add(KnnScanCandidates *candidates, const KnnScanCandidate *item)
{
	reserve_candidates(candidates, 1);
	candidates->items[candidates->n++] = *item;
}

/*
 * When an outer row's kept shard rows are next cut back, `kept` of them
 * left by the last cut (or `want` before any): at half as many again, so
 * that each cut sorts a few times the rows it drops. Never where every
 * row is wanted (want < 0: a radius without a LIMIT).
 */
static int64
prune_threshold(int64 want, int64 kept)
{
	if (want < 0 || kept > PG_INT64_MAX / 4)
		return PG_INT64_MAX;
	return kept + Max(kept / 2, 1);
}

static int
compare_held(const void *a, const void *b, void *arg)
{
	KnnScanShards *sh = (KnnScanShards *) arg;
	const HeldCandidate *x = (const HeldCandidate *) a;
	const HeldCandidate *y = (const HeldCandidate *) b;

	return compare_merge_order(sh, &x->c, x->row, &y->c, y->row, sh->held_slot_a,
							   sh->held_slot_b);
}

/*
 * Cuts an outer row's kept shard rows back to its first `want` of them in
 * the merge's order (WITH TIES, and those tied with the last of them): a
 * row after them has `want` rows before it here alone, so it is not among
 * the node's first `want` rows, nor tied with the last of those (which is
 * no later than the `want`-th here).
 */
static void
prune_held(KnnScanShards *sh, HeldRows *held)
{
	int64		keep = Min(sh->want, held->n);

	qsort_interruptible(held->items, held->n, sizeof(HeldCandidate), compare_held, sh);
	if (sh->with_ties && keep > 0)
	{
		const HeldCandidate *last = &held->items[keep - 1];

		while (keep < held->n &&
			   compare_order(sh, &last->c, last->row, &held->items[keep].c, held->items[keep].row,
							 sh->held_slot_a, sh->held_slot_b) == 0)
			keep++;
	}
	for (int64 i = keep; i < held->n; i++)
	{
		sh->candidates->held_bytes -= GetMemoryChunkSpace(held->items[i].row);
		pfree(held->items[i].row);
	}
	held->n = keep;
	held->prune_at = prune_threshold(sh->want, keep);
}

/* Keeps a shard's candidate (row in sh->cxt, counted) with its outer row's, cut back when due. */
static void
keep_held(KnnScanShards *sh, const KnnScanCandidate *item, MinimalTuple row)
{
	HeldRows   *held = &sh->held[item->outer_row];

	if (held->n == held->capacity)
	{
		/* (n < prune_at: the array grows) */
		int64		capacity = Min(Max(held->capacity * 2, 4), held->prune_at);
		int64		before = held->items == NULL ? 0 : GetMemoryChunkSpace(held->items);

		held->items = held->items == NULL ?
			MemoryContextAllocHuge(sh->held_cxt, capacity * sizeof(HeldCandidate)) :
			repalloc_huge(held->items, capacity * sizeof(HeldCandidate));
		held->capacity = capacity;
		knn_scan_candidates_hold(sh->candidates, GetMemoryChunkSpace(held->items) - before);
	}
	held->items[held->n].c = *item;
	held->items[held->n++].row = row;
	if (held->n >= held->prune_at)
		prune_held(sh, held);
}

/*
 * Rows of a shard's result as they arrived (a batch of its cursor; the reader
 * takes any number): (qid, distance, the columns read back) in text, the
 * rows of one outer row and partition in the subquery's order.
 */
static void
read_shard_rows(void *arg, KnnShardRemote *shard, const KnnShardResult *result)
{
	KnnScanShards *sh = (KnnScanShards *) arg;
	int			n = knn_shard_result_rows(result);
	int			natts = sh->inner_desc->natts;
	int			s = 0;
	int64	   *next_rank;
	/* the batch is held (libpq's memory) while its rows are kept */
	int64		batch_bytes = (int64) knn_shard_result_bytes(result);

	while (sh->sp.shards[s] != shard)
		s++;
	knn_scan_candidates_hold(sh->candidates, batch_bytes);
	if (sh->next_rank[s] == NULL)
		sh->next_rank[s] = MemoryContextAllocExtended(sh->cxt, Max(sh->n_outer, 1) * sizeof(int64),
													  MCXT_ALLOC_HUGE | MCXT_ALLOC_ZERO);
	next_rank = sh->next_rank[s];
	if (knn_shard_result_columns(result) != 2 + sh->n_read_back)
		ereport(ERROR,
				(errcode(ERRCODE_FDW_INVALID_DATA_TYPE),
				 errmsg("KNN Join on foreign server \"%s\" returned %d columns, not %d",
						shard->server->servername, knn_shard_result_columns(result),
						2 + sh->n_read_back)));
	for (int r = 0; r < n; r++)
	{
		KnnScanCandidate item = {0};
		int			len;
		const char *qid = knn_shard_result_value(result, r, 0, &len);
		const char *distance = knn_shard_result_value(result, r, 1, &len);
		MinimalTuple row;
		MemoryContext old;

		if (qid == NULL ||
			(item.outer_row = pg_strtoint64(qid)) < 0 || item.outer_row >= sh->n_outer)
			ereport(ERROR,
					(errcode(ERRCODE_FDW_INVALID_DATA_TYPE),
					 errmsg("KNN Join on foreign server \"%s\" returned a query row that was not sent",
							shard->server->servername)));
		item.distance_null = distance == NULL;
		item.distance = distance == NULL ? 0.0 : float8in_internal((char *) distance, NULL,
																   "double precision",
																   distance);
		item.source = s + 1;
		/* arrival order: the shard's partitions in turn, each in its subquery's order */
		item.rank = next_rank[item.outer_row]++;
		/* each partition's subquery returns at most its LIMIT per query (but WITH TIES) */
		if (sh->want >= 0 && !sh->with_ties &&
			item.rank / list_length(shard->scans) >= sh->want)
			ereport(ERROR,
					(errcode(ERRCODE_FDW_INVALID_DATA_TYPE),
					 errmsg("KNN Join on foreign server \"%s\" returned more rows for a query row than its LIMIT",
							shard->server->servername)));

		MemoryContextReset(sh->row_cxt);
		old = MemoryContextSwitchTo(sh->row_cxt);
		memset(sh->nulls, true, natts * sizeof(bool));
		for (int i = 0; i < sh->n_read_back; i++)
		{
			AttrNumber	column = sh->read_back[i];
			const char *text = knn_shard_result_value(result, r, 2 + i, &len);
			Form_pg_attribute attr = TupleDescAttr(sh->inner_desc, column - 1);

			sh->nulls[column - 1] = text == NULL;
			sh->values[column - 1] = InputFunctionCall(&sh->inputs[i], (char *) text,
													   sh->ioparams[i], attr->atttypmod);
		}
		MemoryContextSwitchTo(sh->cxt);
		row = heap_form_minimal_tuple(sh->inner_desc, sh->values, sh->nulls);
		/* counted (ERROR 54000 past the limit) as it is kept */
		knn_scan_candidates_hold(sh->candidates, GetMemoryChunkSpace(row));
		keep_held(sh, &item, row);
		MemoryContextSwitchTo(old);
		sh->received[s]++;
		if ((sh->received[s] & 1023) == 0)
			CHECK_FOR_INTERRUPTS();
	}
	MemoryContextReset(sh->row_cxt);
	sh->candidates->held_bytes -= batch_bytes;
}

/*
 * At the end of the shards' rows: each outer row's kept rows cut back to
 * its first `want`, their rows in one array and their candidates added,
 * inner_row numbering that array (in cxt).
 */
static void
finish_held(KnnScanShards *sh, MinimalTuple **rows, int64 *n_rows)
{
	KnnScanCandidates *candidates = sh->candidates;
	int64		n = 0;

	for (int64 o = 0; o < sh->n_outer; o++)
	{
		if (sh->want >= 0 && sh->held[o].n > sh->want)
			prune_held(sh, &sh->held[o]);
		n += sh->held[o].n;
	}
	*rows = NULL;
	*n_rows = 0;
	if (n > 0)
	{
		knn_scan_candidates_hold(candidates, n * (int64) sizeof(MinimalTuple));
		*rows = palloc_extended(n * sizeof(MinimalTuple), MCXT_ALLOC_HUGE);
		reserve_candidates(candidates, n);
	}
	for (int64 o = 0; o < sh->n_outer; o++)
	{
		HeldRows   *held = &sh->held[o];

		for (int64 i = 0; i < held->n; i++)
		{
			held->items[i].c.inner_row = *n_rows;
			(*rows)[(*n_rows)++] = held->items[i].row;
			candidates->items[candidates->n++] = held->items[i].c;
		}
		if (held->items != NULL)
			candidates->held_bytes -= GetMemoryChunkSpace(held->items);
	}
	candidates->held_bytes -= GetMemoryChunkSpace(sh->held);
	/* (their blocks given back whole, for the merge's arrays) */
	MemoryContextDelete(sh->held_cxt);
	sh->held_cxt = NULL;
	sh->held = NULL;
}

void
knn_scan_shards_collect(KnnScanShards *sh, TupleDesc inner_desc, MemoryContext cxt,
						MinimalTuple **rows, int64 *n_rows, KnnScanCandidates *candidates)
{
	int			n_shards = sh->sp.n_shards;
	MemoryContext old;

	sh->inner_desc = inner_desc;
	sh->cxt = cxt;
	sh->candidates = candidates;
	if (sh->inputs == NULL)
	{
		sh->inputs = MemoryContextAlloc(sh->node_cxt, Max(sh->n_read_back, 1) * sizeof(FmgrInfo));
		sh->ioparams = MemoryContextAlloc(sh->node_cxt, Max(sh->n_read_back, 1) * sizeof(Oid));
		for (int i = 0; i < sh->n_read_back; i++)
		{
			Oid			input;

			getTypeInputInfo(TupleDescAttr(inner_desc, sh->read_back[i] - 1)->atttypid, &input,
							 &sh->ioparams[i]);
			fmgr_info_cxt(input, &sh->inputs[i], sh->node_cxt);
		}
	}
	sh->values = MemoryContextAlloc(cxt, Max(inner_desc->natts, 1) * sizeof(Datum));
	sh->nulls = MemoryContextAlloc(cxt, Max(inner_desc->natts, 1) * sizeof(bool));
	sh->next_rank = MemoryContextAllocZero(cxt, n_shards * sizeof(int64 *));
	sh->received = MemoryContextAllocZero(cxt, n_shards * sizeof(int64));
	old = MemoryContextSwitchTo(cxt);
	sh->held_cxt = AllocSetContextCreate(cxt, "KNN Join shard rows kept", ALLOCSET_DEFAULT_SIZES);
	sh->held = MemoryContextAllocExtended(sh->held_cxt, Max(sh->n_outer, 1) * sizeof(HeldRows),
										  MCXT_ALLOC_HUGE | MCXT_ALLOC_ZERO);
	knn_scan_candidates_hold(candidates, GetMemoryChunkSpace(sh->held));
	for (int64 o = 0; o < sh->n_outer; o++)
		sh->held[o].prune_at = prune_threshold(sh->want, sh->want);
	if (sh->n_ties > 0)
	{
		sh->held_slot_a = MakeSingleTupleTableSlot(inner_desc, &TTSOpsMinimalTuple);
		sh->held_slot_b = MakeSingleTupleTableSlot(inner_desc, &TTSOpsMinimalTuple);
	}
	/* (the rows and candidates go to cxt; the calls' scratch to the run's) */
	MemoryContextSwitchTo(sh->run_cxt);
	knn_shard_remote_collect_rows(sh->sp.shards, n_shards, read_shard_rows, sh);
	MemoryContextSwitchTo(cxt);
	finish_held(sh, rows, n_rows);
	if (sh->n_ties > 0)
	{
		ExecDropSingleTupleTableSlot(sh->held_slot_a);
		ExecDropSingleTupleTableSlot(sh->held_slot_b);
		sh->held_slot_a = sh->held_slot_b = NULL;
	}
	MemoryContextSwitchTo(old);
	for (int s = 0; s < n_shards; s++)
	{
		sh->sp.shards[s]->rows = sh->received[s];
		if (sh->next_rank[s] != NULL)
			pfree(sh->next_rank[s]);
	}
}

void
knn_scan_shards_note_local(KnnScanShards *sh, int64 local_targets, double seconds_local)
{
	sh->local_targets = local_targets;
	sh->seconds_local = seconds_local;
}

/* What the shards did, for EXPLAIN and the statistics. */
static void
summarize(const KnnScanShards *sh, KnnShardSummary *summary)
{
	knn_shard_summarize(summary, &sh->sp);
	summary->ran = sh->ran;
	summary->local_targets = sh->local_targets;
	summary->local_after = sh->local_after;
	summary->rows = sh->merged;
	summary->seconds_ship = sh->seconds_ship;
	summary->seconds_local = sh->seconds_local;
	summary->seconds_merge = sh->seconds_merge;
}

/* ---- merging ---- */

typedef struct MergeContext
{
	KnnScanShards *sh;
	MinimalTuple *inner_rows;
	TupleTableSlot *slot_a;
	TupleTableSlot *slot_b;
} MergeContext;

static int
compare_candidates(const void *a, const void *b, void *arg)
{
	const KnnScanCandidate *x = (const KnnScanCandidate *) a;
	const KnnScanCandidate *y = (const KnnScanCandidate *) b;
	MergeContext *context = (MergeContext *) arg;

	return compare_merge_order(context->sh, x, context->inner_rows[x->inner_row],
							   y, context->inner_rows[y->inner_row],
							   context->slot_a, context->slot_b);
}

int64 *
knn_scan_shards_merge(KnnScanShards *sh, KnnScanCandidates *candidates, int64 n_outer,
					  MinimalTuple *inner_rows, TupleTableSlot *slot_a, TupleTableSlot *slot_b,
					  MemoryContext cxt)
{
	int64		begin_bytes = (n_outer + 1) * (int64) sizeof(int64);
	int64		fill_bytes = Max(n_outer, 1) * (int64) sizeof(int64);
	int64		sorted_bytes = Max(candidates->n, 1) * (int64) sizeof(KnnScanCandidate);
	int64	   *begin;
	int64	   *fill;
	KnnScanCandidate *sorted;
	MergeContext context = {sh, inner_rows, slot_a, slot_b};
	instr_time	start;

	/* the sorted copy is held beside the candidates until they are freed */
	knn_scan_candidates_hold(candidates, begin_bytes + fill_bytes + sorted_bytes);
	begin = MemoryContextAllocHuge(cxt, begin_bytes);
	fill = palloc_extended(fill_bytes, MCXT_ALLOC_HUGE);
	sorted = MemoryContextAllocHuge(cxt, sorted_bytes);
	INSTR_TIME_SET_CURRENT(start);
	memset(begin, 0, (n_outer + 1) * sizeof(int64));
	for (int64 i = 0; i < candidates->n; i++)
		begin[candidates->items[i].outer_row + 1]++;
	for (int64 o = 0; o < n_outer; o++)
		begin[o + 1] += begin[o];
	memcpy(fill, begin, n_outer * sizeof(int64));
	for (int64 i = 0; i < candidates->n; i++)
		sorted[fill[candidates->items[i].outer_row]++] = candidates->items[i];
	for (int64 o = 0; o < n_outer; o++)
	{
		/* an outer row's millions of candidates (a radius's) take seconds: a cancel is checked in the sort */
		qsort_interruptible(sorted + begin[o], begin[o + 1] - begin[o], sizeof(KnnScanCandidate),
							compare_candidates, &context);
		if ((o & 1023) == 0)
			CHECK_FOR_INTERRUPTS();
	}
	pfree(fill);
	if (candidates->items != NULL)
		pfree(candidates->items);
	candidates->held_bytes -= fill_bytes + candidates->capacity * (int64) sizeof(KnnScanCandidate);
	candidates->items = sorted;
	candidates->capacity = Max(candidates->n, 1);
	sh->merged = candidates->n;
	sh->seconds_merge = knn_seconds_since(start);
	{
		/* the run's summary: the statistics, and EXPLAIN ANALYZE's sums (its names, short-lived) */
		KnnShardSummary summary;
		MemoryContext old = MemoryContextSwitchTo(sh->row_cxt);

		summarize(sh, &summary);
		knn_shard_record_stats(&sh->sp, &summary, n_outer, sh->want, sh->fallbacks.data,
							   knn_seconds_since(sh->started));
		sh->totals = knn_shard_summary_add(sh->totals, &summary, sh->node_cxt);
		MemoryContextSwitchTo(old);
		MemoryContextReset(sh->row_cxt);
	}
	return begin;
}

/* ---- EXPLAIN, end ---- */

void
knn_scan_shards_explain(const KnnScanShards *sh, ExplainState *es)
{
	KnnShardSummary summary;

	if (sh == NULL)
		return;
	/* the runs' sums; before any (plain EXPLAIN), what the node would run */
	if (sh->totals != NULL)
	{
		knn_shard_explain(sh->totals, es);
		return;
	}
	summarize(sh, &summary);
	knn_shard_explain(&summary, es);
}

void
knn_scan_shards_end(KnnScanShards *sh)
{
	if (sh == NULL)
		return;
	for (int s = 0; s < sh->sp.n_shards; s++)
		knn_shard_remote_release(sh->sp.shards[s]);
}
