/*
 * knn_shard.c -- knn_join over foreign partitions of postgres_fdw servers
 * where knn_gpu is installed (knn_shard.h): which partitions can join on
 * their servers, the join of the others here, and the order of the work.
 *
 * Why from the plan: the targets text's own plan says which partitions
 * remain after pruning and what postgres_fdw sends for each one (its
 * remote SELECT, with every filter it could push down). A partition joins
 * on its server only when that SELECT is the whole of its part of the
 * plan: a ForeignScan of one foreign table whose output is two plain
 * columns and which filters nothing locally. Everything else (local
 * partitions, foreign partitions with local filters or computed columns,
 * servers without knn_gpu) runs here through the same plan with the pushed
 * partitions taken out, so its rows, visibility and filters are exactly
 * those of the text.
 *
 * Order of the work: the query rows are shipped to every shard, the shard
 * joins are sent, the local part is read and joined while the shards work,
 * then their results are collected and merged. All partitions of one user
 * mapping share postgres_fdw's one connection, so they form one shard
 * whose targets text is the UNION ALL of their SELECTs.
 */
#include "postgres.h"

#include "access/xact.h"
#include "executor/executor.h"
#include "executor/spi_priv.h"
#include "foreign/foreign.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "nodes/plannodes.h"
#include "parser/parsetree.h"
#include "portability/instr_time.h"
#include "tcop/dest.h"
#include "utils/builtins.h"
#include "common/jsonapi.h"
#include "mb/pg_wchar.h"
#include "utils/json.h"
#include "utils/plancache.h"
#include "utils/snapmgr.h"

#include "knn_input.h"
#include "knn_run.h"
#include "knn_shard.h"
#include "knn_shard_remote.h"
#include "knn_stats.h"
#include "knn_vocabulary.h"

/* postgres_fdw's ForeignScan.fdw_private: its remote SELECT, the columns it retrieves. */
#define FDW_PRIVATE_SELECT_SQL 0
#define FDW_PRIVATE_RETRIEVED_ATTRS 1

/* The partitions' scans under the top of the plan, or NIL where it is no such shape. */
static List *
partition_scans(Plan *top)
{
	if (IsA(top, Append))
		return ((Append *) top)->appendplans;
	if (IsA(top, MergeAppend))
		return ((MergeAppend *) top)->mergeplans;
	if (IsA(top, ForeignScan))
		return list_make1(top);
	return NIL;
}

/* Where in the remote SELECT's columns the scan's attribute attno is (1-based), or 0. */
static int
retrieved_position(List *retrieved_attrs, AttrNumber attno)
{
	ListCell   *lc;

	foreach(lc, retrieved_attrs)
		if (lfirst_int(lc) == attno)
			return foreach_current_index(lc) + 1;
	return 0;
}

/*
 * The targets text of one partition on its server when the scan can join
 * there: "SELECT s.c<id>, s.c<v> FROM (<remote select>) s(c1, ..., cn)";
 * NULL otherwise. The server is postgres_fdw's (checked by the caller).
 */
static char *
remote_select(ForeignScan *scan)
{
	List	   *fdw_private = scan->fdw_private;
	List	   *retrieved;
	int			positions[2];
	StringInfoData sql;

	if (scan->scan.scanrelid == 0 || scan->scan.plan.qual != NIL ||
		scan->fdw_scan_tlist != NIL || scan->fdw_exprs != NIL || scan->fsSystemCol ||
		list_length(scan->scan.plan.targetlist) != 2 || list_length(fdw_private) < 2 ||
		!IsA(list_nth(fdw_private, FDW_PRIVATE_SELECT_SQL), String) ||
		!IsA(list_nth(fdw_private, FDW_PRIVATE_RETRIEVED_ATTRS), IntList))
		return NULL;
	retrieved = list_nth(fdw_private, FDW_PRIVATE_RETRIEVED_ATTRS);
	for (int i = 0; i < 2; i++)
	{
		TargetEntry *tle = list_nth_node(TargetEntry, scan->scan.plan.targetlist, i);
		Var		   *var = (Var *) tle->expr;

		if (tle->resjunk || !IsA(var, Var) || var->varno != scan->scan.scanrelid ||
			var->varattno <= 0 ||
			(positions[i] = retrieved_position(retrieved, var->varattno)) == 0)
			return NULL;
	}
	initStringInfo(&sql);
	appendStringInfo(&sql, "SELECT s.c%d, s.c%d FROM (%s) s(", positions[0], positions[1],
					 strVal(list_nth(fdw_private, FDW_PRIVATE_SELECT_SQL)));
	for (int c = 1; c <= list_length(retrieved); c++)
		appendStringInfo(&sql, "%sc%d", c > 1 ? ", " : "", c);
	appendStringInfoChar(&sql, ')');
	return sql.data;
}

/* The user mapping a scan of the foreign table uses, as postgres_fdw picks it. */
static UserMapping *
scan_user_mapping(PlannedStmt *stmt, ForeignScan *scan)
{
	RangeTblEntry *rte = rt_fetch(scan->scan.scanrelid, stmt->rtable);
	Oid			userid = OidIsValid(rte->checkAsUser) ? rte->checkAsUser : GetUserId();

	return GetUserMapping(userid, scan->fs_server);
}

/* A plan's scans sorted into shards (one per user mapping) and local scans. */
typedef struct ShardPlan
{
	List	   *scans;			/* the top's children (or the top itself) */
	int			n_scans;
	int		   *shard_of;		/* per scan: its shard's index, -1 = local */
	KnnShardRemote **shards;
	int			n_shards;
} ShardPlan;

static void
classify_scans(PlannedStmt *stmt, ShardPlan *sp)
{
	ListCell   *lc;

	sp->n_scans = list_length(sp->scans);
	sp->shard_of = palloc(Max(sp->n_scans, 1) * sizeof(int));
	sp->shards = palloc(Max(sp->n_scans, 1) * sizeof(KnnShardRemote *));
	sp->n_shards = 0;
	foreach(lc, sp->scans)
	{
		int			i = foreach_current_index(lc);
		ForeignScan *scan = (ForeignScan *) lfirst(lc);
		ForeignServer *server;
		UserMapping *user;
		char	   *select;
		int			s;

		sp->shard_of[i] = -1;
		if (!IsA(scan, ForeignScan) || scan->scan.scanrelid == 0)
			continue;
		server = GetForeignServer(scan->fs_server);
		if (!knn_shard_is_postgres_fdw(server) || (select = remote_select(scan)) == NULL)
			continue;
		user = scan_user_mapping(stmt, scan);
		for (s = 0; s < sp->n_shards; s++)
			if (sp->shards[s]->user->umid == user->umid)
				break;
		if (s == sp->n_shards)
		{
			KnnShardRemote *shard = palloc0(sizeof(KnnShardRemote));

			shard->server = server;
			shard->user = user;
			initStringInfo(&shard->targets_sql);
			sp->shards[sp->n_shards++] = shard;
		}
		appendStringInfo(&sp->shards[s]->targets_sql, "%s%s",
						 sp->shards[s]->n_partitions > 0 ? " UNION ALL " : "", select);
		sp->shards[s]->n_partitions++;
		sp->shard_of[i] = s;
	}
}

/*
 * Opens every shard; a shard that cannot join (no knn_gpu there, another
 * version, no type for the rows) becomes local, with a NOTICE. Returns the
 * shards that join, compacted.
 */
static void
open_shards(ShardPlan *sp, KnnElement element, StringInfo fallbacks)
{
	char	   *version = NULL;
	int			kept = 0;
	int		   *new_index = palloc(Max(sp->n_shards, 1) * sizeof(int));

	if (SPI_execute("SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'knn_gpu'",
					true, 1) == SPI_OK_SELECT && SPI_processed == 1)
		version = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
	if (version == NULL)
		elog(ERROR, "knn_join: knn_gpu's version not found");

	for (int s = 0; s < sp->n_shards; s++)
	{
		KnnShardRemote *shard = sp->shards[s];
		const char *why = knn_shard_remote_open(shard, version, element);

		if (why != NULL)
		{
			ereport(NOTICE,
					(errmsg("knn_join reads the rows of foreign server \"%s\" here: %s",
							shard->server->servername, why)));
			appendStringInfo(fallbacks, "%s{", fallbacks->len > 0 ? "," : "");
			escape_json(fallbacks, "server");
			appendStringInfoChar(fallbacks, ':');
			escape_json(fallbacks, shard->server->servername);
			appendStringInfoChar(fallbacks, ',');
			escape_json(fallbacks, "reason");
			appendStringInfoChar(fallbacks, ':');
			escape_json(fallbacks, why);
			appendStringInfoChar(fallbacks, '}');
			new_index[s] = -1;
		}
		else
		{
			new_index[s] = kept;
			sp->shards[kept++] = shard;
		}
	}
	for (int i = 0; i < sp->n_scans; i++)
		if (sp->shard_of[i] >= 0)
			sp->shard_of[i] = new_index[sp->shard_of[i]];
	sp->n_shards = kept;
}

/*
 * Does a local scan use the connection of a shard (a foreign partition of
 * a shard's server that cannot join there)? Then the local part must wait
 * for the shards: one connection runs one statement at a time.
 */
static bool
local_part_needs_shard_connection(PlannedStmt *stmt, const ShardPlan *sp)
{
	for (int i = 0; i < sp->n_scans; i++)
	{
		ForeignScan *scan = list_nth(sp->scans, i);
		UserMapping *user;

		/* other wrappers' scans need no user mapping, and use no shard's connection */
		if (sp->shard_of[i] >= 0 || !IsA(scan, ForeignScan) || scan->scan.scanrelid == 0 ||
			!knn_shard_is_postgres_fdw(GetForeignServer(scan->fs_server)))
			continue;
		user = scan_user_mapping(stmt, scan);
		for (int s = 0; s < sp->n_shards; s++)
			if (sp->shards[s]->user->umid == user->umid)
				return true;
	}
	return false;
}

/* ---- the local part ---- */

/* Reads the rows of the local part into a matrix, as knn_join reads a set. */
typedef struct TargetReceiver
{
	DestReceiver pub;
	KnnMatrix  *matrix;
	const KnnVectorReader *reader;
	Oid			id_type;
} TargetReceiver;

static void
target_startup(DestReceiver *self, int operation, TupleDesc desc)
{
	((TargetReceiver *) self)->id_type = TupleDescAttr(desc, 0)->atttypid;
}

static bool
target_receive(TupleTableSlot *slot, DestReceiver *self)
{
	TargetReceiver *r = (TargetReceiver *) self;
	int64		id;

	slot_getsomeattrs(slot, 2);
	if (slot->tts_isnull[0])
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("targets returned a NULL id")));
	if (slot->tts_isnull[1])
		return true;			/* rows without a vector take no part */
	switch (r->id_type)
	{
		case INT2OID:
			id = DatumGetInt16(slot->tts_values[0]);
			break;
		case INT4OID:
			id = DatumGetInt32(slot->tts_values[0]);
			break;
		default:
			id = DatumGetInt64(slot->tts_values[0]);
			break;
	}
	knn_matrix_append(r->matrix, id, slot->tts_values[1], r->reader);
	CHECK_FOR_INTERRUPTS();
	return true;
}

static void
target_shutdown(DestReceiver *self)
{
}

static void
target_destroy(DestReceiver *self)
{
}

/*
 * Runs the targets' plan without the pushed partitions (a copy of it: the
 * cached plan stays as it was) and reads its rows into `targets`.
 */
static void
read_local_part(PlannedStmt *stmt, const char *sql, const ShardPlan *sp, KnnMatrix *targets,
				KnnVectorKind target_kind)
{
	PlannedStmt *local = copyObject(stmt);
	List	   *kept = NIL;
	List	   *copies = partition_scans(local->planTree);
	TargetReceiver receiver;
	QueryDesc  *query;

	for (int i = 0; i < sp->n_scans; i++)
		if (sp->shard_of[i] < 0)
			kept = lappend(kept, list_nth(copies, i));
	if (kept == NIL)
		return;
	if (IsA(local->planTree, Append))
	{
		Append	   *append = (Append *) local->planTree;
		ListCell   *lc;

		append->appendplans = kept;
		/* the scans' indexes changed: no run-time pruning (the scans' filters stay) */
		append->part_prune_info = NULL;
		append->first_partial_plan = list_length(kept);
		append->nasyncplans = 0;
		foreach(lc, kept)
			if (((Plan *) lfirst(lc))->async_capable)
				append->nasyncplans++;
	}
	else if (IsA(local->planTree, MergeAppend))
	{
		((MergeAppend *) local->planTree)->mergeplans = kept;
		((MergeAppend *) local->planTree)->part_prune_info = NULL;
	}

	memset(&receiver, 0, sizeof(receiver));
	receiver.pub.receiveSlot = target_receive;
	receiver.pub.rStartup = target_startup;
	receiver.pub.rShutdown = target_shutdown;
	receiver.pub.rDestroy = target_destroy;
	receiver.pub.mydest = DestNone;
	receiver.matrix = targets;
	receiver.reader = knn_vector_reader_for(target_kind, targets->element);
	if (receiver.reader == NULL)
		elog(ERROR, "knn_join: no reader for the targets");

	query = CreateQueryDesc(local, sql, GetActiveSnapshot(), InvalidSnapshot,
							&receiver.pub, NULL, NULL, 0);
	ExecutorStart(query, 0);
	ExecutorRun(query, ForwardScanDirection, 0L, true);
	ExecutorFinish(query);
	ExecutorEnd(query);
	FreeQueryDesc(query);
}

/* Joins the queries with the local part's rows; its lists, and its record. */
static void
join_local_part(KnnMatrix *queries, KnnMatrix *targets, int32 k, KnnMetric metric,
				bool exclude_self, KnnMethod method, KnnShardLists *lists,
				double seconds_read)
{
	KnnProblem	problem;
	KnnStats	stats;
	KnnJoinRecord record;
	int32		slots;
	int64	   *neighbors;
	double	   *distances;
	int64		n = 0;
	instr_time	start;
	double		seconds_sort;

	lists->n_queries = queries->n;
	lists->offsets = palloc_extended((queries->n + 1) * sizeof(int64), MCXT_ALLOC_HUGE | MCXT_ALLOC_ZERO);
	if (targets->n == 0)
		return;
	if (queries->dim != targets->dim)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 queries->element == KNN_ELEMENT_BIT
				 ? errmsg("different bit lengths: query bit strings have %d bits but target bit strings have %d",
						  queries->dim, targets->dim)
				 : errmsg("query vectors have %d dimensions but target vectors have %d",
						  queries->dim, targets->dim)));
	INSTR_TIME_SET_CURRENT(start);
	knn_matrix_sort_by_id(targets);
	seconds_sort = knn_seconds_since(start);

	slots = (int32) Min((int64) k, targets->n);
	neighbors = palloc_extended((Size) queries->n * slots * sizeof(int64), MCXT_ALLOC_HUGE);
	distances = palloc_extended((Size) queries->n * slots * sizeof(double), MCXT_ALLOC_HUGE);
	knn_matrix_problem(&problem, queries, targets, slots);
	problem.metric = metric;
	problem.method = method;
	if (exclude_self)
	{
		problem.query_keys = queries->ids;
		problem.target_keys = targets->ids;
	}
	knn_run_problem(&problem, neighbors, distances, &stats);
	knn_stats_record(&record, &problem, &stats, seconds_read, seconds_sort, 0.0);

	lists->target_ids = palloc_extended(Max((Size) queries->n * slots, 1) * sizeof(int64),
										MCXT_ALLOC_HUGE);
	lists->distances = palloc_extended(Max((Size) queries->n * slots, 1) * sizeof(double),
									   MCXT_ALLOC_HUGE);
	for (int64 q = 0; q < queries->n; q++)
	{
		for (int32 r = 0; r < slots; r++)
		{
			int64		t = neighbors[q * slots + r];

			if (t < 0)
				break;
			lists->target_ids[n] = targets->ids[t];
			lists->distances[n] = distances[q * slots + r];
			n++;
		}
		lists->offsets[q + 1] = n;
	}
	pfree(neighbors);
	pfree(distances);
}

/* ---- statistics ---- */

static void
json_key(StringInfo buf, const char *key)
{
	escape_json(buf, key);
	appendStringInfoChar(buf, ':');
}

/* Is the shard's statistics text one JSON value (it goes into ours as it is)? */
static bool
remote_stats_valid(const char *json)
{
	JsonLexContext *lex = makeJsonLexContextCstringLen((char *) json, strlen(json),
													   GetDatabaseEncoding(), false);

	return pg_parse_json(lex, &nullSemAction) == JSON_SUCCESS;
}

static void
record_stats(const ShardPlan *sp, const KnnMatrix *queries, const KnnMatrix *local, int32 k,
			 const char *fallbacks, double seconds_ship, double seconds_local,
			 double seconds_merge, double seconds_total, int64 rows)
{
	StringInfoData buf;

	initStringInfo(&buf);
	appendStringInfo(&buf, "{\"queries\":" INT64_FORMAT ",\"k\":%d,\"rows\":" INT64_FORMAT
					 ",\"shards\":[", queries->n, k, rows);
	for (int s = 0; s < sp->n_shards; s++)
	{
		const KnnShardRemote *shard = sp->shards[s];

		appendStringInfoString(&buf, s > 0 ? ",{" : "{");
		json_key(&buf, "server");
		escape_json(&buf, shard->server->servername);
		appendStringInfo(&buf, ",\"partitions\":%d,\"rows\":" INT64_FORMAT
						 ",\"seconds_join\":%.6f,",
						 shard->n_partitions, shard->lists.offsets[queries->n],
						 shard->seconds_join);
		json_key(&buf, "remote_sql");
		escape_json(&buf, shard->join_sql);
		appendStringInfoChar(&buf, ',');
		json_key(&buf, "remote_stats");
		if (shard->remote_stats != NULL && remote_stats_valid(shard->remote_stats))
			appendStringInfoString(&buf, shard->remote_stats);
		else
			appendStringInfoString(&buf, "null");
		appendStringInfoChar(&buf, '}');
	}
	appendStringInfo(&buf, "],\"fallback\":[%s],\"local\":", fallbacks);
	if (local->n > 0)
		appendStringInfo(&buf, "{\"targets\":" INT64_FORMAT "}", local->n);
	else
		appendStringInfoString(&buf, "null");
	appendStringInfo(&buf, ",\"seconds\":{\"ship\":%.6f,\"local\":%.6f,\"merge\":%.6f,\"total\":%.6f}}",
					 seconds_ship, seconds_local, seconds_merge, seconds_total);
	knn_shard_set_last_stats(buf.data);
	pfree(buf.data);
}

/* ---- the join ---- */

static bool
unique_sorted_ids(const KnnMatrix *m)
{
	for (int64 i = 1; i < m->n; i++)
		if (m->ids[i] == m->ids[i - 1])
			return false;
	return true;
}

bool
knn_shard_try_join(ReturnSetInfo *rsinfo, KnnMatrix *queries, SPIPlanPtr targets_plan,
				   const char *targets_sql, KnnVectorKind target_kind, int32 k,
				   KnnMetric metric, bool exclude_self, KnnMethod method)
{
	CachedPlan *cplan;
	ResourceOwner owner;
	PlannedStmt *stmt;
	ShardPlan	sp = {0};
	StringInfoData fallbacks;
	KnnMatrix	local;
	KnnShardLists *sources;
	bool		local_after;
	instr_time	start;
	instr_time	phase;
	double		seconds_ship;
	double		seconds_local = 0.0;
	double		seconds_merge;
	int64		rows;

	/* per-group joins, and queries that share an id, join the usual way */
	if (queries->grouped || queries->n == 0 ||
		list_length(SPI_plan_get_plan_sources(targets_plan)) != 1)
		return false;
	owner = targets_plan->saved ? CurrentResourceOwner : NULL;
	cplan = SPI_plan_get_cached_plan(targets_plan);
	if (cplan == NULL || list_length(cplan->stmt_list) != 1)
	{
		if (cplan != NULL)
			ReleaseCachedPlan(cplan, owner);
		return false;
	}
	stmt = linitial_node(PlannedStmt, cplan->stmt_list);
	sp.scans = list_length(stmt->planTree->targetlist) == 2 ? partition_scans(stmt->planTree) : NIL;
	/* the caller's rights on every relation of the text, before any user mapping is looked up */
	if (sp.scans != NIL)
		ExecCheckRTPerms(stmt->rtable, true);
	classify_scans(stmt, &sp);
	if (sp.n_shards == 0)
	{
		ReleaseCachedPlan(cplan, owner);
		return false;
	}
	knn_matrix_sort_by_id(queries);
	if (!unique_sorted_ids(queries))
	{
		ereport(DEBUG1, (errmsg_internal("knn_join: not pushed to the shards: query ids repeat")));
		ReleaseCachedPlan(cplan, owner);
		return false;
	}

	INSTR_TIME_SET_CURRENT(start);
	initStringInfo(&fallbacks);
	open_shards(&sp, queries->element, &fallbacks);
	if (sp.n_shards == 0)
	{
		ReleaseCachedPlan(cplan, owner);
		return false;
	}

	INSTR_TIME_SET_CURRENT(phase);
	knn_shard_remote_ship(sp.shards, sp.n_shards, queries);
	seconds_ship = knn_seconds_since(phase);
	for (int s = 0; s < sp.n_shards; s++)
		knn_shard_remote_send(sp.shards[s], k, metric, exclude_self, method);

	sources = palloc0((sp.n_shards + 1) * sizeof(KnnShardLists));
	knn_matrix_init(&local, "target", queries->element);
	local_after = local_part_needs_shard_connection(stmt, &sp);
	for (int pass = 0; pass < 2; pass++)
	{
		/* the local part runs while the shards work, unless it needs their connections */
		if (pass == (local_after ? 1 : 0))
		{
			double		seconds_read;

			INSTR_TIME_SET_CURRENT(phase);
			read_local_part(stmt, targets_sql, &sp, &local, target_kind);
			seconds_read = knn_seconds_since(phase);
			join_local_part(queries, &local, k, metric, exclude_self, method,
							&sources[sp.n_shards], seconds_read);
			seconds_local = knn_seconds_since(phase);
		}
		if (pass == 0)
			knn_shard_remote_collect(sp.shards, sp.n_shards, queries->ids, queries->n);
	}
	ReleaseCachedPlan(cplan, owner);

	INSTR_TIME_SET_CURRENT(phase);
	for (int s = 0; s < sp.n_shards; s++)
		sources[s] = sp.shards[s]->lists;
	rows = knn_shard_merge(rsinfo, queries->ids, queries->n, sources, sp.n_shards + 1, k);
	seconds_merge = knn_seconds_since(phase);
	record_stats(&sp, queries, &local, k, fallbacks.data, seconds_ship, seconds_local,
				 seconds_merge, knn_seconds_since(start), rows);
	return true;
}
