/*
 * knn_shard.c -- the shards of a plan (knn_shard.h): which partitions can
 * join on their servers; and knn_join over them: the join of the others
 * here, the order of the work, the merge.
 *
 * Why from the plan: the plan of the targets (knn_join's text, the KNN
 * Join node's inner relation) says which partitions remain after pruning
 * and what postgres_fdw sends for each one (its remote SELECT, with every
 * filter it could push down). A partition joins on its server only when
 * that SELECT is the whole of its part of the plan: a ForeignScan of one
 * foreign table whose output is plain columns and which filters nothing
 * locally. Everything else (local partitions, foreign partitions with
 * local filters or computed columns, servers without knn_gpu) runs here
 * through the same plan with the pushed partitions taken out, so its
 * rows, visibility and filters are exactly those of the plan.
 *
 * Order of the work: the query rows are shipped to every shard (where the
 * shards read their targets ahead and receive in blocks: block by block
 * while the rows are read, knn_shard_queries_added), the shard joins are
 * sent, the local part is read and joined while the shards work, then
 * their results are collected and merged. The shards' pairs name their
 * query by id, so the order the rows were shipped in does not matter. All partitions of one user
 * mapping share postgres_fdw's one connection, so they form one shard
 * (knn_join: whose targets text is the UNION ALL of their SELECTs).
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/dependency.h"
#include "catalog/pg_class.h"
#include "catalog/pg_language.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "common/int.h"
#include "common/shortest_dec.h"
#include "executor/executor.h"
#include "executor/spi_priv.h"
#include "foreign/foreign.h"
#include "lib/stringinfo.h"
#include "libpq/pqformat.h"
#include "miscadmin.h"
#include "nodes/nodeFuncs.h"
#include "nodes/plannodes.h"
#include "parser/parsetree.h"
#include "portability/instr_time.h"
#include "tcop/dest.h"
#include "utils/builtins.h"
#include "utils/float.h"
#include "utils/fmgroids.h"
#include "funcapi.h"
#include "utils/json.h"
#include "utils/lsyscache.h"
#include "utils/plancache.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "knn_catalog.h"
#include "knn_input.h"
#include "knn_join_function_scan.h"
#include "knn_progress.h"
#include "knn_run.h"
#include "knn_settings.h"
#include "knn_shard.h"
#include "knn_shard_receive.h"
#include "knn_shard_packed.h"
#include "knn_shard_relay.h"
#include "knn_shard_remote.h"
#include "knn_shard_spill.h"
#include "knn_stats.h"
#include "knn_vocabulary.h"

/* postgres_fdw's ForeignScan.fdw_private: its remote SELECT, the columns it retrieves. */
#define FDW_PRIVATE_SELECT_SQL 0
#define FDW_PRIVATE_RETRIEVED_ATTRS 1

List *
knn_shard_partition_scans(Plan *top)
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
 * The scan as it would run on its server, or NULL with *why set: a scan of
 * one foreign table (postgres_fdw's, checked by the caller) whose output
 * columns are plain columns of its remote SELECT and which runs nothing
 * here.
 */
static KnnShardScan *
shard_scan(ForeignScan *scan, List *rtable, const char **why)
{
	List	   *fdw_private = scan->fdw_private;
	List	   *retrieved;
	KnnShardScan *result;
	ListCell   *lc;

	*why = NULL;
	if (scan->scan.scanrelid == 0 || scan->fdw_scan_tlist != NIL)
	{
		*why = "its scan is a join pushed down to its server";
		return NULL;
	}
	if (scan->fdw_exprs != NIL)
	{
		*why = "its remote SELECT takes values from here (parameters)";
		return NULL;
	}
	if (scan->scan.plan.qual != NIL || scan->fsSystemCol)
	{
		*why = "a filter of its rows runs here";
		return NULL;
	}
	if (list_length(fdw_private) < 2 ||
		!IsA(list_nth(fdw_private, FDW_PRIVATE_SELECT_SQL), String) ||
		!IsA(list_nth(fdw_private, FDW_PRIVATE_RETRIEVED_ATTRS), IntList))
	{
		*why = "its scan is not postgres_fdw's plain remote SELECT";
		return NULL;
	}
	retrieved = list_nth(fdw_private, FDW_PRIVATE_RETRIEVED_ATTRS);
	result = palloc0(sizeof(KnnShardScan));
	result->n_columns = list_length(scan->scan.plan.targetlist);
	result->positions = palloc(Max(result->n_columns, 1) * sizeof(int));
	result->attnos = palloc(Max(result->n_columns, 1) * sizeof(AttrNumber));
	result->types = palloc(Max(result->n_columns, 1) * sizeof(Oid));
	result->typmods = palloc(Max(result->n_columns, 1) * sizeof(int32));
	foreach(lc, scan->scan.plan.targetlist)
	{
		TargetEntry *tle = lfirst_node(TargetEntry, lc);
		Var		   *var = (Var *) tle->expr;
		int			i = foreach_current_index(lc);

		if (tle->resjunk || !IsA(var, Var) || var->varno != scan->scan.scanrelid ||
			var->varattno <= 0 ||
			(result->positions[i] = retrieved_position(retrieved, var->varattno)) == 0)
		{
			*why = "a column of its rows is computed here";
			return NULL;
		}
		result->attnos[i] = var->varattno;
		result->types[i] = var->vartype;
		result->typmods[i] = var->vartypmod;
	}
	result->remote_select = strVal(list_nth(fdw_private, FDW_PRIVATE_SELECT_SQL));
	result->n_retrieved = list_length(retrieved);
	result->relid = rt_fetch(scan->scan.scanrelid, rtable)->relid;
	result->relation = get_rel_name(result->relid);
	return result;
}

char *
knn_shard_scan_from(const KnnShardScan *scan, const char *alias)
{
	StringInfoData sql;

	initStringInfo(&sql);
	appendStringInfo(&sql, "(%s) %s(", scan->remote_select, alias);
	for (int c = 1; c <= scan->n_retrieved; c++)
		appendStringInfo(&sql, "%sc%d", c > 1 ? ", " : "", c);
	appendStringInfoChar(&sql, ')');
	return sql.data;
}

/*
 * (float8out's text follows extra_float_digits: at 0 or less only 15
 * significant digits, so a radius sent so would be another number there,
 * keeping or dropping a pair at its boundary that this server would not.)
 */
char *
knn_shard_float8_text(double value)
{
	char	   *text = palloc(DOUBLE_SHORTEST_DECIMAL_LEN);

	double_to_shortest_decimal_buf(value, text);
	return text;
}

/* The user mapping a scan of the foreign table uses, as postgres_fdw picks it. */
static UserMapping *
scan_user_mapping(List *rtable, ForeignScan *scan)
{
	RangeTblEntry *rte = rt_fetch(scan->scan.scanrelid, rtable);
	Oid			userid = OidIsValid(rte->checkAsUser) ? rte->checkAsUser : GetUserId();

	return GetUserMapping(userid, scan->fs_server);
}

void
knn_shard_classify(KnnShardPlan *sp, List *rtable)
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
		KnnShardScan *shard_part;
		const char *why;
		int			s;

		sp->shard_of[i] = -1;
		if (!IsA(scan, ForeignScan))
			continue;
		server = GetForeignServer(scan->fs_server);
		if (!knn_shard_is_postgres_fdw(server))
			continue;
		if ((shard_part = shard_scan(scan, rtable, &why)) == NULL)
		{
			if (scan->scan.scanrelid > 0)
				ereport(NOTICE,
						(errmsg("%s reads the rows of foreign table \"%s\" of server \"%s\" here: %s",
								sp->who,
								get_rel_name(rt_fetch(scan->scan.scanrelid, rtable)->relid),
								server->servername, why)));
			else
				ereport(NOTICE,
						(errmsg("%s reads the rows of foreign server \"%s\" here: %s",
								sp->who, server->servername, why)));
			continue;
		}
		shard_part->index = i;
		user = scan_user_mapping(rtable, scan);
		for (s = 0; s < sp->n_shards; s++)
			if (sp->shards[s]->user->umid == user->umid)
				break;
		if (s == sp->n_shards)
		{
			KnnShardRemote *shard = palloc0(sizeof(KnnShardRemote));

			shard->server = server;
			shard->user = user;
			shard->who = sp->who;
			sp->shards[sp->n_shards++] = shard;
		}
		sp->shards[s]->scans = lappend(sp->shards[s]->scans, shard_part);
		sp->shard_of[i] = s;
	}
}

void
knn_shard_add_fallback(StringInfo fallbacks, const char *server, const char *partition,
					   const char *why)
{
	appendStringInfo(fallbacks, "%s{", fallbacks->len > 0 ? "," : "");
	escape_json(fallbacks, "server");
	appendStringInfoChar(fallbacks, ':');
	escape_json(fallbacks, server);
	if (partition != NULL)
	{
		appendStringInfoChar(fallbacks, ',');
		escape_json(fallbacks, "partition");
		appendStringInfoChar(fallbacks, ':');
		escape_json(fallbacks, partition);
	}
	appendStringInfoChar(fallbacks, ',');
	escape_json(fallbacks, "reason");
	appendStringInfoChar(fallbacks, ':');
	escape_json(fallbacks, why);
	appendStringInfoChar(fallbacks, '}');
}

void
knn_shard_open(KnnShardPlan *sp, KnnElement element, KnnShardCheck check, void *check_arg,
			   StringInfo fallbacks)
{
	char	   *version = knn_extension_version("knn_gpu");
	int			kept = 0;
	int		   *new_index = palloc(Max(sp->n_shards, 1) * sizeof(int));

	if (version == NULL)
		elog(ERROR, "%s: knn_gpu's version not found", sp->who);

	for (int s = 0; s < sp->n_shards; s++)
	{
		KnnShardRemote *shard = sp->shards[s];
		int			n_type_fields;
		char	   *type_fields = knn_shard_types_fields(sp, shard, &n_type_fields);
		char	  **types_there = NULL;
		const char *why = knn_shard_remote_open(shard, version, element,
												sp->query_type_extension,
												sp->query_type_version, type_fields,
												n_type_fields, &types_there);
		/* what the type check names, taken back where the whole server is read here after all */
		char	   *read_here_before = sp->read_here;
		int			fallbacks_before = fallbacks != NULL ? fallbacks->len : 0;

		/* its partitions whose columns there are of other types: read here */
		if (why == NULL)
		{
			knn_shard_types_check(sp, shard, types_there, fallbacks);
			if (shard->scans == NIL)
			{
				new_index[s] = -1;
				continue;
			}
		}
		if (why == NULL && check != NULL)
			why = check(check_arg, shard);
		if (why != NULL)
		{
			ereport(NOTICE,
					(errmsg("%s reads the rows of foreign server \"%s\" here: %s",
							sp->who, shard->server->servername, why)));
			/* the server named once, not once more after its partitions the type check named */
			sp->read_here = read_here_before == NULL ? pstrdup(shard->server->servername) :
				psprintf("%s, %s", read_here_before, shard->server->servername);
			if (fallbacks != NULL)
			{
				fallbacks->len = fallbacks_before;
				fallbacks->data[fallbacks_before] = '\0';
				knn_shard_add_fallback(fallbacks, shard->server->servername, NULL, why);
			}
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

Plan *
knn_shard_local_plan(Plan *top, const KnnShardPlan *sp)
{
	Plan	   *local = copyObject(top);
	List	   *kept = NIL;
	List	   *copies = knn_shard_partition_scans(local);

	for (int i = 0; i < sp->n_scans; i++)
		if (sp->shard_of[i] < 0)
			kept = lappend(kept, list_nth(copies, i));
	if (kept == NIL)
		return NULL;
	if (IsA(local, Append))
	{
		Append	   *append = (Append *) local;
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
	else if (IsA(local, MergeAppend))
	{
		((MergeAppend *) local)->mergeplans = kept;
		((MergeAppend *) local)->part_prune_info = NULL;
	}
	return local;
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
read_local_part(PlannedStmt *stmt, const char *sql, const KnnShardPlan *sp,
				ParamListInfo params, KnnMatrix *targets, KnnVectorKind target_kind)
{
	PlannedStmt *local;
	Plan	   *top = knn_shard_local_plan(stmt->planTree, sp);
	TargetReceiver receiver;
	QueryDesc  *query;

	if (top == NULL)
		return;
	local = copyObject(stmt);
	local->planTree = top;

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
							&receiver.pub, params, NULL, 0);
	ExecutorStart(query, 0);
	ExecutorRun(query, ForwardScanDirection, 0L, true);
	ExecutorFinish(query);
	ExecutorEnd(query);
	FreeQueryDesc(query);
}

/* A range join's pairs into the spill (as the local part's), as the engine hands them over. */
typedef struct SpillSink
{
	Spill	   *spill;
	const KnnMatrix *targets;
} SpillSink;

static void
spill_pairs(void *arg, const int64 *query_rows, const int64 *target_rows,
			const double *distances, int64 n)
{
	SpillSink  *sink = (SpillSink *) arg;

	for (int64 i = 0; i < n; i++)
		knn_shard_spill_put(sink->spill, sink->spill->n_shards, query_rows[i],
							sink->targets->ids[target_rows[i]], distances[i]);
	CHECK_FOR_INTERRUPTS();
}

/*
 * The k-NN join of these query rows (all, or a batch) with the local
 * part's targets, as the call would join them.
 */
static void
run_local_knn(const KnnShardJoin *join, KnnMatrix *queries, KnnMatrix *targets, int32 slots,
			  int64 *neighbors, double *distances, KnnProblem *problem, KnnStats *stats)
{
	knn_matrix_join_problem(problem, queries, targets, slots, join->metric, join->method,
							join->exclude_self);
	if (join->by_operator != NULL)
		knn_operator_values_run(join->by_operator, problem, queries, targets, neighbors,
								distances, stats);
	else
		knn_run_problem(problem, neighbors, distances, stats);
}

/*
 * Joins the queries with the local part's rows as the call would join all
 * rows (pgvector's operator's values where the call ranks by them); its
 * lists, or where the join spills (spill not NULL: every range join) its
 * pairs into the spill.
 */
static void
join_local_part(KnnMatrix *queries, KnnMatrix *targets, const KnnShardJoin *join,
				KnnShardLists *lists, Spill *spill, double seconds_read)
{
	KnnProblem	problem;
	KnnStats	stats;
	KnnJoinRecord record;
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

	if (join->range)
	{
		/* a range join's pairs always go into the spill (batch_rows) */
		SpillSink	to_spill = {spill, targets};

		knn_matrix_join_problem(&problem, queries, targets, join->k, join->metric, join->method,
								join->exclude_self);
		problem.max_distance = join->radius;
		problem.range = join->inclusive ? KNN_RANGE_AT_MOST : KNN_RANGE_BELOW;
		if (join->by_operator != NULL)
			knn_operator_values_range(join->by_operator, &problem, queries, targets, spill_pairs,
									  &to_spill, &stats);
		else
			knn_run_range_problem(&problem, spill_pairs, &to_spill, &stats);
	}
	else if (spill != NULL)
	{
		/*
		 * In batches of queries, their pairs into the spill (source
		 * n_shards); a batch's arrays take at most half the limit, the
		 * pairs the spill holds in memory the other half.
		 */
		int32		slots = (int32) Min((int64) join->k, targets->n);
		int64		per_run = Min(Max(knn_result_rows_per_run(slots) / 2, 1), queries->n);
		int64	   *neighbors = palloc_extended((Size) per_run * slots * sizeof(int64), MCXT_ALLOC_HUGE);
		double	   *distances = palloc_extended((Size) per_run * slots * sizeof(double), MCXT_ALLOC_HUGE);
		KnnStats	total;

		for (int64 first = 0; first < queries->n; first += per_run)
		{
			KnnMatrix	part = *queries;

			part.n = Min(per_run, queries->n - first);
			part.values += first * queries->row_bytes;
			part.ids += first;
			run_local_knn(join, &part, targets, slots, neighbors, distances, &problem, &stats);
			knn_stats_add(&total, &stats, first == 0);
			for (int64 q = 0; q < part.n; q++)
				for (int32 r = 0; r < slots && neighbors[q * slots + r] >= 0; r++)
					knn_shard_spill_put(spill, spill->n_shards, first + q,
							  targets->ids[neighbors[q * slots + r]], distances[q * slots + r]);
		}
		pfree(neighbors);
		pfree(distances);
		/* the record is the whole local part's */
		stats = total;
		problem.n_queries = queries->n;
	}
	else
	{
		int32		slots = (int32) Min((int64) join->k, targets->n);
		int64	   *neighbors = palloc_extended((Size) queries->n * slots * sizeof(int64), MCXT_ALLOC_HUGE);
		double	   *distances = palloc_extended((Size) queries->n * slots * sizeof(double), MCXT_ALLOC_HUGE);
		int64		n = 0;

		run_local_knn(join, queries, targets, slots, neighbors, distances, &problem, &stats);
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
				knn_prefetch_target(targets->ids, NULL, neighbors, q * slots + r,
									queries->n * slots);
				lists->target_ids[n] = targets->ids[t];
				lists->distances[n] = distances[q * slots + r];
				n++;
			}
			lists->offsets[q + 1] = n;
		}
		pfree(neighbors);
		pfree(distances);
	}
	knn_stats_record(&record, &problem, &stats, seconds_read, seconds_sort, 0.0);
	knn_join_explain_report(&record);
}

/* ---- the shards' part ---- */

/*
 * Appends n elements of `size` bytes (4 or 2) in network byte order, as
 * pq_sendfloat4 / pq_sendint16 would one by one (bit for bit), in one pass.
 */
static void
put_elements(StringInfo buf, const char *values, int32 n, int size)
{
	char	   *out;

	enlargeStringInfo(buf, n * size);
	out = buf->data + buf->len;
	if (size == 4)
		for (int32 i = 0; i < n; i++)
		{
			uint32		v;

			memcpy(&v, values + 4 * (Size) i, sizeof(v));
			v = pg_hton32(v);
			memcpy(out + 4 * (Size) i, &v, sizeof(v));
		}
	else
		for (int32 i = 0; i < n; i++)
		{
			uint16		v;

			memcpy(&v, values + 2 * (Size) i, sizeof(v));
			v = pg_hton16(v);
			memcpy(out + 2 * (Size) i, &v, sizeof(v));
		}
	buf->len += n * size;
	buf->data[buf->len] = '\0';
}

/* knn_join's query rows: (int8 id, the engine's row in its type's send form). */
static void
encode_query(void *arg, int64 row, StringInfo buf)
{
	const KnnMatrix *queries = (const KnnMatrix *) arg;
	const char *values = queries->values + (Size) row * queries->row_bytes;
	int32		dim = queries->dim;

	pq_sendint32(buf, 8);
	pq_sendint64(buf, queries->ids[row]);
	switch (queries->element)
	{
		case KNN_ELEMENT_FLOAT32:
			/* vector's send form: int16 dim, int16 unused, float4 each */
			pq_sendint32(buf, 4 + 4 * dim);
			pq_sendint16(buf, dim);
			pq_sendint16(buf, 0);
			put_elements(buf, values, dim, 4);
			break;
		case KNN_ELEMENT_FLOAT16:
			/* halfvec's: int16 dim, int16 unused, binary16 each */
			pq_sendint32(buf, 4 + 2 * dim);
			pq_sendint16(buf, dim);
			pq_sendint16(buf, 0);
			put_elements(buf, values, dim, 2);
			break;
		case KNN_ELEMENT_BIT:
			/* varbit's: int32 bit length, the bytes (bits past it are zero) */
			pq_sendint32(buf, 4 + (dim + 7) / 8);
			pq_sendint32(buf, dim);
			pq_sendbytes(buf, values, (dim + 7) / 8);
			break;
	}
}

/* The size of a query vector there, header included (encode_query's send form is its layout). */
static int64
query_vector_bytes(const KnnMatrix *queries)
{
	switch (queries->element)
	{
		case KNN_ELEMENT_FLOAT32:
			return VARHDRSZ + 4 + 4 * (int64) queries->dim;
		case KNN_ELEMENT_FLOAT16:
			return VARHDRSZ + 4 + 2 * (int64) queries->dim;
		case KNN_ELEMENT_BIT:
			return VARHDRSZ + 4 + ((int64) queries->dim + 7) / 8;
	}
	return 0;
}

/*
 * The shard's join: knn_join (or knn_range_join) of the shipped queries and
 * its partitions; self_join: its read ahead is knn_shard_prefetch_self_join
 * (its rows are this server's queries too).
 */
static void
compose_join_sql(KnnShardRemote *shard, const KnnShardJoin *join, bool self_join,
				 const char *stream_columns)
{
	StringInfoData targets;
	ListCell   *lc;

	initStringInfo(&targets);
	foreach(lc, shard->scans)
	{
		KnnShardScan *scan = lfirst(lc);

		appendStringInfo(&targets, "%sSELECT s.c%d, s.c%d FROM %s",
						 targets.len > 0 ? " UNION ALL " : "",
						 scan->positions[0], scan->positions[1],
						 knn_shard_scan_from(scan, "s"));
	}
	shard->temp_columns = psprintf("id pg_catalog.int8, v %s", shard->query_type);
	shard->vector_column = "v";
	shard->held_join_sql = NULL;
	if (join->range)
	{
		/*
		 * knn_range_join's arguments after its queries, each of its type (k
		 * too where it is NULL): an untyped NULL would let a function of
		 * that name with text there, which a user allowed to create in
		 * knn_gpu's schema there could add, be the better match.
		 */
		char	   *rest = psprintf("%s::pg_catalog.text, %s::pg_catalog.float8, %s::pg_catalog.text, %s, %s, %s, %s::pg_catalog.text",
									quote_literal_cstr(targets.data),
									quote_literal_cstr(knn_shard_float8_text(join->radius)),
									quote_literal_cstr(knn_metric_name(join->metric)),
									join->exclude_self ? "true" : "false",
									join->k > 0 ? psprintf("%d", join->k) : "NULL::pg_catalog.int4",
									join->inclusive ? "true" : "false",
									quote_literal_cstr(knn_method_name(join->method)));

		/* the queries shipped into its memory where it can (knn_shard_receive.h) */
		shard->receives_queries = shard->has_received_range_join;
		if (shard->receives_queries)
			shard->join_sql = psprintf("SELECT query_id, target_id, distance FROM %s.knn_range_join_received(" INT64_FORMAT "::pg_catalog.int8, %s)",
									   shard->knn_schema, shard->received_set, rest);
		else
			shard->join_sql = psprintf("SELECT query_id, target_id, distance FROM %s.knn_range_join(%s::pg_catalog.text, %s)",
									   shard->knn_schema,
									   quote_literal_cstr(psprintf("SELECT id, v FROM %s", shard->temp_table)),
									   rest);
	}
	else
	{
		/* knn_join's arguments after its queries */
		char	   *rest = psprintf("%s::pg_catalog.text, %d, %s::pg_catalog.text, %s, %s::pg_catalog.text",
									quote_literal_cstr(targets.data), join->k,
									quote_literal_cstr(knn_metric_name(join->metric)),
									join->exclude_self ? "true" : "false",
									quote_literal_cstr(knn_method_name(join->method)));
		char	   *queries = quote_literal_cstr(psprintf("SELECT id, v FROM %s", shard->temp_table));

		/*
		 * The pairs packed into few values where the shard can
		 * (knn_shard_packed.h), called from the target list: each value
		 * comes as it is made (value per call), not through a tuplestore.
		 */
		shard->packed_result = shard->has_packed_join;
		/* the queries shipped into its memory where it can (knn_shard_receive.h) */
		shard->receives_queries = shard->has_packed_join && shard->has_received_join;
		if (shard->receives_queries)
			shard->join_sql = psprintf("SELECT %s.knn_join_received_packed(" INT64_FORMAT "::pg_catalog.int8, %s)",
									   shard->knn_schema, shard->received_set, rest);
		else if (shard->packed_result)
			shard->join_sql = psprintf("SELECT %s.knn_join_packed(%s::pg_catalog.text, %s)",
									   shard->knn_schema, queries, rest);
		else
			shard->join_sql = psprintf("SELECT query_id, target_id, distance FROM %s.knn_join(%s::pg_catalog.text, %s)",
									   shard->knn_schema, queries, rest);
		/* its own rows joined as queries too, where they came from it (knn_shard_try_join) */
		if (shard->receives_queries && self_join && shard->has_received_held_join)
			shard->held_join_sql = psprintf("SELECT %s.knn_join_received_held_packed(" INT64_FORMAT "::pg_catalog.int8, %s)",
											shard->knn_schema, shard->received_set, rest);
	}
	/* its targets read there ahead of the queries, by the join's own text (knn_shard_receive.h) */
	if (shard->receives_queries && shard->has_prefetch)
		shard->prefetch_sql = psprintf("SELECT targets_read, seconds%s FROM %s.%s(" INT64_FORMAT "::pg_catalog.int8, %s::pg_catalog.regtype, %s::pg_catalog.text, %s::pg_catalog.text)",
									   self_join ? ", id_type, vector_type, dim" : "",
									   shard->knn_schema,
									   self_join ? "knn_shard_prefetch_self_join" : "knn_shard_prefetch_targets",
									   shard->received_set,
									   quote_literal_cstr(shard->query_type),
									   quote_literal_cstr(targets.data),
									   quote_literal_cstr(knn_metric_name(join->metric)));
	/* a self-join's read that sends its rows as it reads them, where the shard can (chosen by open_shards) */
	shard->stream_sql = NULL;
	if (self_join && stream_columns != NULL && shard->has_held_stream && shard->has_prefetch)
		shard->stream_sql = psprintf("SELECT %s.knn_shard_read_held_blocks(" INT64_FORMAT "::pg_catalog.int8, %s::pg_catalog.regtype, %s::pg_catalog.text, %s::pg_catalog.text, %s)",
									 shard->knn_schema, shard->received_set,
									 quote_literal_cstr(shard->query_type),
									 quote_literal_cstr(targets.data),
									 quote_literal_cstr(knn_metric_name(join->metric)),
									 stream_columns);
	/* binary results: ids and distances arrive exactly, without parsing */
	shard->binary_result = true;
}

/*
 * The row of query id `id` among the sorted, unique ids; -1 if none. A
 * shard returns its pairs query by query in the order sent: `hint` (the
 * row found last, or -1) or the row after it is nearly always the one.
 */
static int64
query_row(const int64 *ids, int64 n, int64 id, int64 hint)
{
	int64		lo = 0;
	int64		hi = n;

	if (hint >= 0 && hint < n && ids[hint] == id)
		return hint;
	if (hint + 1 >= 0 && hint + 1 < n && ids[hint + 1] == id)
		return hint + 1;

	while (lo < hi)
	{
		int64		mid = lo + (hi - lo) / 2;

		if (ids[mid] < id)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < n && ids[lo] == id ? lo : -1;
}

/*
 * A join's result pair by pair: knn_join_packed()'s values (one bytea
 * column, KNN_PACKED_ROW_BYTES a pair) or knn_join's rows (three binary
 * 8-byte columns). check_pairs checks the form and counts the pairs (a
 * packed value's size once, as it is counted); next_pair checks each
 * field of the row form as it reads it: libpq's fields are read once (a
 * range join's millions of rows spent as long checking them ahead as
 * reading them).
 */
typedef struct ShardPairs
{
	const KnnShardResult *result;
	bool		packed;
	int			row;			/* of the result */
	int			offset;			/* in a packed value */
	const char *value;			/* the packed value of row `row` (NULL: not yet looked up) */
	int			len;
} ShardPairs;

#define BAD_PACKED_VALUE "a NULL or a packed value of the wrong size"
#define BAD_ROW_VALUE "a NULL or a value of the wrong size"

/* Starts `it` at the result's first pair (again). */
static void
pairs_begin(ShardPairs *it, const KnnShardResult *result, bool packed)
{
	it->result = result;
	it->packed = packed;
	it->row = 0;
	it->offset = 0;
	it->value = NULL;
	it->len = 0;
}

/*
 * Checks the result's form; the number of its pairs, or -1 with *bad set.
 * Packed values are checked here (each one's size: it gives the count);
 * the row form's fields by next_pair, as it reads them.
 */
static int64
check_pairs(const KnnShardResult *result, bool packed, const char **bad)
{
	int			n = knn_shard_result_rows(result);
	int64		pairs = 0;
	int			len;

	if (knn_shard_result_columns(result) != (packed ? 1 : 3))
	{
		*bad = packed ? "not one column" : "not three columns";
		return -1;
	}
	if (!packed)
		return n;
	for (int r = 0; r < n; r++)
	{
		if (knn_shard_result_value(result, r, 0, &len) == NULL ||
			len % KNN_PACKED_ROW_BYTES != 0)
		{
			*bad = BAD_PACKED_VALUE;
			return -1;
		}
		pairs += len / KNN_PACKED_ROW_BYTES;
	}
	return pairs;
}

/* Field `column` of the row form's row `row`: an 8-byte value, or false with *bad set. */
static bool
row_field(const KnnShardResult *result, int row, int column, uint64 *bits, const char **bad)
{
	int			len;
	const char *p = knn_shard_result_value(result, row, column, &len);

	if (p == NULL || len != sizeof(*bits))
	{
		*bad = BAD_ROW_VALUE;
		return false;
	}
	memcpy(bits, p, sizeof(*bits));
	*bits = pg_ntoh64(*bits);
	return true;
}

/*
 * The next of the check_pairs counted pairs (the caller reads no more):
 * its query id, and unless target_id is NULL its target id and distance.
 * False with *bad set for a field that is not a pair's.
 */
static bool
next_pair(ShardPairs *it, int64 *query_id, int64 *target_id, double *distance, const char **bad)
{
	uint64		bits;

	if (it->packed)
	{
		int64		ignored_target;
		double		ignored_distance;

		/* check_pairs checked each value's size and counted the pairs: an empty value is skipped */
		while (it->value == NULL || it->offset >= it->len)
		{
			if (it->value != NULL)
				it->row++;
			it->offset = 0;
			it->value = knn_shard_result_value(it->result, it->row, 0, &it->len);
			if (it->value == NULL || it->len % KNN_PACKED_ROW_BYTES != 0)
			{
				*bad = BAD_PACKED_VALUE;
				return false;
			}
		}
		knn_packed_get(it->value + it->offset, query_id,
					   target_id != NULL ? target_id : &ignored_target,
					   target_id != NULL ? distance : &ignored_distance);
		it->offset += KNN_PACKED_ROW_BYTES;
		return true;
	}
	if (!row_field(it->result, it->row, 0, &bits, bad))
		return false;
	*query_id = (int64) bits;
	if (target_id != NULL)
	{
		if (!row_field(it->result, it->row, 1, &bits, bad))
			return false;
		*target_id = (int64) bits;
		if (!row_field(it->result, it->row, 2, &bits, bad))
			return false;
		memcpy(distance, &bits, sizeof(*distance));
	}
	it->row++;
	return true;
}

/* A shard's result that is not pairs of the queries sent (what: which way not) */
static void bad_pairs(const KnnShardRemote *shard, const char *what) pg_attribute_noreturn();

static void
bad_pairs(const KnnShardRemote *shard, const char *what)
{
	ereport(ERROR,
			(errcode(ERRCODE_FDW_INVALID_DATA_TYPE),
			 errmsg("%s on foreign server \"%s\" returned %s",
					shard->who, shard->server->servername, what)));
}

/*
 * A shard sends each query's pairs together (knn_join's order): pairs of a
 * query that come again after another query's began would be merged as
 * one longer list (a target twice), so they are an error. done: a bit per
 * query row; *last: the row of the pairs before (-1: none).
 */
static const char *
note_query_row(uint8 *done, int64 *last, int64 row)
{
	if (row == *last)
		return NULL;
	if (done[row / 8] & (1 << (row % 8)))
		return "a query's pairs in two places";
	if (*last >= 0)
		done[*last / 8] |= 1 << (*last % 8);
	*last = row;
	return NULL;
}

/* What read_shard_lists reads against: the queries sent, at most `limit` pairs each. */
typedef struct ListsTarget
{
	const KnnMatrix *queries;
	int64		limit;
} ListsTarget;

/*
 * Reads a join's result into the shard's lists: pairs of a query id we
 * sent (each query's pairs in rank order, as knn_join returns them).
 * Anything else is an error: more than `limit` pairs for a query too.
 */
static void
read_shard_lists(void *arg, KnnShardRemote *shard, const KnnShardResult *result)
{
	const ListsTarget *target = (const ListsTarget *) arg;
	const KnnMatrix *queries = target->queries;
	uint8	   *done = palloc_extended(queries->n / 8 + 1, MCXT_ALLOC_HUGE | MCXT_ALLOC_ZERO);
	int64		last = -1;
	const char *bad = NULL;
	int64		n = check_pairs(result, shard->packed_result, &bad);
	KnnShardLists *lists = palloc0(sizeof(KnnShardLists));
	int64	   *rows = palloc_extended(Max(n, 1) * sizeof(int64), MCXT_ALLOC_HUGE);
	int64	   *fill;
	ShardPairs	it;
	int64		query_id;
	int64		target_id;
	double		distance;

	/* first the query ids (their rows counted), then the rest of each pair into its list */
	pairs_begin(&it, result, shard->packed_result);
	for (int64 r = 0; bad == NULL && r < n; r++)
	{
		if (!next_pair(&it, &query_id, NULL, NULL, &bad))
			break;
		if ((rows[r] = query_row(queries->ids, queries->n, query_id, r > 0 ? rows[r - 1] : -1)) < 0)
			bad = "a query id that was not sent";
		else
			bad = note_query_row(done, &last, rows[r]);
		if (r % 65536 == 0)
			CHECK_FOR_INTERRUPTS();
	}
	pfree(done);
	if (bad != NULL)
		bad_pairs(shard, bad);

	lists->n_queries = queries->n;
	lists->offsets = palloc_extended((queries->n + 1) * sizeof(int64), MCXT_ALLOC_HUGE | MCXT_ALLOC_ZERO);
	lists->target_ids = palloc_extended(Max(n, 1) * sizeof(int64), MCXT_ALLOC_HUGE);
	lists->distances = palloc_extended(Max(n, 1) * sizeof(double), MCXT_ALLOC_HUGE);
	for (int64 r = 0; r < n; r++)
		lists->offsets[rows[r] + 1]++;
	for (int64 q = 0; q < queries->n; q++)
	{
		if (lists->offsets[q + 1] > target->limit)
			ereport(ERROR,
					(errcode(ERRCODE_FDW_INVALID_DATA_TYPE),
					 errmsg("%s on foreign server \"%s\" returned more than k pairs for a query",
							shard->who, shard->server->servername)));
		lists->offsets[q + 1] += lists->offsets[q];
	}
	fill = palloc_extended(Max(queries->n, 1) * sizeof(int64), MCXT_ALLOC_HUGE);
	memcpy(fill, lists->offsets, queries->n * sizeof(int64));
	pairs_begin(&it, result, shard->packed_result);
	for (int64 r = 0; r < n; r++)
	{
		int64		at = fill[rows[r]]++;

		if (!next_pair(&it, &query_id, &target_id, &distance, &bad))
			bad_pairs(shard, bad);
		lists->target_ids[at] = target_id;
		lists->distances[at] = distance;
		if (r % 65536 == 0)
			CHECK_FOR_INTERRUPTS();
	}
	pfree(fill);
	pfree(rows);
	shard->rows = n;
	shard->caller = lists;
}

/*
 * One row of a shard's result read as it arrived (a batched join:
 * knn_shard_remote_collect_rows): its pairs checked as read_shard_lists
 * checks them, each into the spill.
 */
static void
spill_shard_rows(void *arg, KnnShardRemote *shard, const KnnShardResult *result)
{
	Spill	   *spill = (Spill *) arg;
	const char *bad = NULL;
	int64		n = check_pairs(result, shard->packed_result, &bad);
	ShardPairs	it;
	int			source = -1;

	for (int s = 0; s < spill->n_shards; s++)
		if (spill->shards[s] == shard)
			source = s;
	if (source < 0)
		elog(ERROR, "spill_shard_rows: a shard not of this join");
	pairs_begin(&it, result, shard->packed_result);
	for (int64 r = 0; bad == NULL && r < n; r++)
	{
		int64		query_id;
		int64		target_id;
		double		distance;
		int64		row;

		if (!next_pair(&it, &query_id, &target_id, &distance, &bad))
			break;
		row = query_row(spill->queries->ids, spill->queries->n, query_id, spill->last_row[source]);
		if (row < 0)
			bad = "a query id that was not sent";
		else if (spill->together)
			bad = note_query_row(spill->done[source], &spill->last_row[source], row);
		else
			spill->last_row[source] = row;	/* only the next one's hint: a range join's pairs come query by query too */
		if (bad == NULL)
			knn_shard_spill_put(spill, source, row, target_id, distance);
		if (r % 65536 == 65535)
			CHECK_FOR_INTERRUPTS();
	}
	if (bad != NULL)
		bad_pairs(shard, bad);
}

/*
 * The per_run query rows whose result fits knn_gpu.max_result_memory, or
 * -1 when all of it does at once. Held at once per pair: a shard's, its
 * packed form in libpq (24 bytes), its list (16) and its query row (8);
 * the local part's list and the merged list, 16 each. A range join's
 * pairs have no bound but the limit (k, where given, is one per query:
 * their rows in libpq are several times a packed pair): they always go
 * into a spill, held there while they fit (knn_shard_spill.h), in
 * batches of as few query rows as it takes.
 */
static int64
batch_rows(const KnnShardJoin *join, int n_shards, int64 n_queries)
{
	double		per_row = (double) join->k * (48.0 * n_shards + 32.0);
	double		per_run = floor((double) knn_result_memory_bytes() / Max(per_row, 1.0));

	if (join->range)
		return 1;
	if (per_run >= (double) n_queries)
		return -1;
	return (int64) Max(per_run, 1.0);
}

/* ---- the join ---- */

/*
 * The targets text's plan: the cached generic plan, or with bound
 * parameters a custom plan for their values (the values then are
 * constants in postgres_fdw's remote SELECTs, which can go to the shards).
 */
static CachedPlan *
targets_cached_plan(SPIPlanPtr plan, ParamListInfo params, ResourceOwner *owner)
{
	*owner = plan->saved ? CurrentResourceOwner : NULL;
	if (params == NULL)
		return SPI_plan_get_cached_plan(plan);
	return GetCachedPlan(linitial(SPI_plan_get_plan_sources(plan)), params, *owner, NULL);
}

/* A NOTICE: the call has shards but joins here. */
static void
notice_not_pushed(const KnnShardPlan *sp, const char *why)
{
	ereport(NOTICE,
			(errmsg("knn_join reads the rows of foreign server \"%s\"%s here: %s",
					sp->shards[0]->server->servername,
					sp->n_shards > 1 ? " and others" : "", why)));
}

/*
 * A sharded knn_join under way: the targets text's plan, its shards, and
 * how far it got (knn_shard.h's KnnShardEarly is one begun before the
 * queries were read).
 */
typedef enum ShardState
{
	SHARDS_NONE,				/* nothing to push down: the caller joins */
	SHARDS_NOT_PUSHED,			/* shards, but a form they do not run (said) */
	SHARDS_FOUND,				/* pushable, not yet opened */
	SHARDS_OPENED				/* opened, their joins composed */
} ShardState;

struct KnnShardEarly
{
	ShardState	state;
	CachedPlan *cplan;
	ResourceOwner owner;
	PlannedStmt *stmt;
	KnnShardPlan sp;
	StringInfoData fallbacks;
	instr_time	start;
	double		seconds_queries;	/* the caller's query read, -1 = not told */
	double		seconds_prefetch_wait;	/* then waiting for the shards' target reads */
	/* a self-join whose query rows are the shards' targets read ahead, fetched back (knn_shard_read_queries) */
	bool		queries_from_shards;
	/* the query rows shipped while they are read (knn_shard_queries_added) */
	MemoryContext context;		/* knn_shard_start's: where the shipment lives */
	int64		poll_at;		/* rows read when the reader looks next */
	int64		poll_every;
	KnnShardRemote **to_memory; /* the opened shards that receive in blocks */
	int			n_memory;
	KnnShardRows ship_rows;		/* rows.n follows the read */
	KnnShardShipment *shipment; /* started during the read, or NULL */
	/* the queries came from the shards: shard s's rows end at held_end[s] (in the order read); else NULL */
	int64	   *held_end;
	/* ... kept as they came, to be sent on unchanged (only their ids read here); else NULL */
	KnnShardRelay *relay;
	/* ... sent by the shards as they read them (KnnShardRemote.stream_sql), not read ahead first */
	bool		streaming;
};

static bool shards_take_relayed_blocks(const KnnShardEarly *c);
static char *declared_held_columns(const KnnShardEarly *c);

/*
 * The extension (and version) whose type the query rows go to the shards
 * as. The shard's knn_join ranks by pgvector's operator exactly where this
 * one does: where the types SQL resolves the operator between are
 * pgvector's (knn_operator_values_type). Its targets are of the types
 * declared here (knn_shard_types.c), so its query rows must be of
 * pgvector's type where this join ranks by pgvector's operator (of the
 * same version: its distance functions' bits), and of knn_gpu's own type
 * where this join does not (pgvector's type would make the shard rank by
 * pgvector's operator beside pgvector's or array targets). A shard without
 * that type is read here.
 */
static void
query_type_owner(const KnnShardJoin *join, KnnShardPlan *sp)
{
	if (join->by_operator != NULL)
	{
		Oid			extension = getExtensionOfObject(ProcedureRelationId,
													 join->by_operator->function.fn_oid);

		sp->query_type_extension = get_extension_name(extension);
		sp->query_type_version = knn_extension_version(sp->query_type_extension);
	}
	else
	{
		sp->query_type_extension = "knn_gpu";
		sp->query_type_version = NULL;
	}
}

/*
 * Finds the shards of the targets text: SHARDS_FOUND (the plan held), or
 * SHARDS_NONE / SHARDS_NOT_PUSHED (with its NOTICE; the plan released).
 */
static ShardState
find_shards(KnnShardEarly *c, SPIPlanPtr targets_plan, const KnnShardJoin *join, bool grouped)
{
	/* the shard's join computes with the ids and the vectors */
	static const AttrNumber id_and_vector[] = {1, 2};

	if (list_length(SPI_plan_get_plan_sources(targets_plan)) != 1)
		return SHARDS_NONE;
	c->cplan = targets_cached_plan(targets_plan, join->params, &c->owner);
	if (c->cplan == NULL || list_length(c->cplan->stmt_list) != 1)
	{
		if (c->cplan != NULL)
			ReleaseCachedPlan(c->cplan, c->owner);
		return SHARDS_NONE;
	}
	c->stmt = linitial_node(PlannedStmt, c->cplan->stmt_list);
	c->sp.who = "knn_join";
	c->sp.typed_columns = id_and_vector;
	c->sp.n_typed_columns = lengthof(id_and_vector);
	query_type_owner(join, &c->sp);
	c->sp.scans = list_length(c->stmt->planTree->targetlist) >= 2 ?
		knn_shard_partition_scans(c->stmt->planTree) : NIL;
	/* the caller's rights on every relation of the text, before any user mapping is looked up */
	if (c->sp.scans != NIL)
		ExecCheckRTPerms(c->stmt->rtable, true);
	knn_shard_classify(&c->sp, c->stmt->rtable);
	if (c->sp.n_shards == 0)
	{
		ReleaseCachedPlan(c->cplan, c->owner);
		return SHARDS_NONE;
	}
	/* forms the shards do not run: said once, then joined here */
	if (join->not_pushed != NULL || grouped ||
		list_length(c->stmt->planTree->targetlist) != 2)
	{
		notice_not_pushed(&c->sp, join->not_pushed ? join->not_pushed :
						  "query and target texts with group key columns are joined here");
		ReleaseCachedPlan(c->cplan, c->owner);
		return SHARDS_NOT_PUSHED;
	}
	return SHARDS_FOUND;
}

/*
 * Can a shard read the self-join's rows ahead, receive the queries in
 * blocks and send its rows back (knn_shard_held_target_blocks)?
 */
static bool
shard_sends_held_rows(const KnnShardRemote *shard, const KnnShardJoin *join)
{
	return shard->has_held_blocks && shard->has_prefetch &&
		(join->range ? shard->has_received_range_join :
		 shard->has_packed_join && shard->has_received_join);
}

/*
 * Opens the shards found (those that cannot join are read here, said) and
 * composes their joins. self_join (the queries text is the targets text,
 * stable, every partition on a shard): where every shard opened and can
 * send its rows back, the queries will be fetched from the shards
 * (c->queries_from_shards).
 */
static void
open_shards(KnnShardEarly *c, KnnElement element, const KnnShardJoin *join, bool self_join)
{
	INSTR_TIME_SET_CURRENT(c->start);
	initStringInfo(&c->fallbacks);
	knn_shard_open(&c->sp, element, NULL, NULL, &c->fallbacks);
	c->queries_from_shards = self_join && c->sp.read_here == NULL && c->sp.n_shards > 0;
	for (int s = 0; s < c->sp.n_shards; s++)
		if (!shard_sends_held_rows(c->sp.shards[s], join))
			c->queries_from_shards = false;
	for (int s = 0; s < c->sp.n_shards; s++)
	{
		knn_shard_remote_name_table(c->sp.shards[s]);
		compose_join_sql(c->sp.shards[s], join, c->queries_from_shards,
						 c->queries_from_shards ? declared_held_columns(c) : NULL);
	}
	/* every shard sends its rows as it reads them, or none does (then: read ahead, then fetched) */
	c->streaming = c->queries_from_shards && shards_take_relayed_blocks(c);
	for (int s = 0; s < c->sp.n_shards; s++)
		if (c->sp.shards[s]->stream_sql == NULL)
			c->streaming = false;
	for (int s = 0; s < c->sp.n_shards && !c->streaming; s++)
		c->sp.shards[s]->stream_sql = NULL;
	c->state = SHARDS_OPENED;
}

/* Does every partition scan of the plan join on a shard (none read here)? */
static bool
all_scans_on_shards(const KnnShardPlan *sp)
{
	if (sp->n_scans == 0)
		return false;
	for (int i = 0; i < sp->n_scans; i++)
		if (sp->shard_of[i] < 0)
			return false;
	return true;
}

/* A join that stays here after all: nothing held on the shards, their connections and the plan given back. */
static void
abandon_shards(KnnShardEarly *c)
{
	if (c->shipment != NULL)
		knn_shard_remote_ship_end_savepoint(c->shipment, false);
	knn_shard_remote_prefetch_drop(c->sp.shards, c->sp.n_shards);
	for (int s = 0; s < c->sp.n_shards; s++)
		knn_shard_remote_release(c->sp.shards[s]);
	ReleaseCachedPlan(c->cplan, c->owner);
}

/* Builtin functions that run a query (a text, a cursor, a table or a schema) of their own. */
static const Oid builtins_running_sql[] = {
	F_QUERY_TO_XML, F_QUERY_TO_XMLSCHEMA, F_QUERY_TO_XML_AND_XMLSCHEMA,
	F_TABLE_TO_XML, F_TABLE_TO_XMLSCHEMA, F_TABLE_TO_XML_AND_XMLSCHEMA,
	F_CURSOR_TO_XML, F_CURSOR_TO_XMLSCHEMA,
	F_SCHEMA_TO_XML, F_SCHEMA_TO_XMLSCHEMA, F_SCHEMA_TO_XML_AND_XMLSCHEMA,
	F_DATABASE_TO_XML, F_DATABASE_TO_XMLSCHEMA, F_DATABASE_TO_XML_AND_XMLSCHEMA,
	F_TS_STAT_TEXT, F_TS_STAT_TEXT_TEXT, F_TS_REWRITE_TSQUERY_TEXT,
};

/* knn_gpu's C functions that read a query or target text (knn_join.c's entry points). */
static const char *const knn_gpu_text_readers[] = {
	"knn_join", "knn_join_packed", "knn_join_received_packed", "knn_join_params",
	"knn_join_keyed", "knn_range_join", "knn_range_join_keyed", "knn_range_join_received",
	"knn_shard_prefetch_targets",
};

/*
 * May the function run SQL of its own? Builtins no, except those above; C
 * functions only when knn_gpu's (pg_depend) and none of its text readers;
 * any other function (other C libraries, SQL, PL) may.
 */
static bool
function_runs_sql(Oid function, void *context)
{
	HeapTuple	tuple = SearchSysCache1(PROCOID, ObjectIdGetDatum(function));
	bool		runs_sql = true;

	if (HeapTupleIsValid(tuple))
	{
		Oid			language = ((Form_pg_proc) GETSTRUCT(tuple))->prolang;

		if (language == INTERNALlanguageId)
		{
			runs_sql = false;
			for (int i = 0; i < lengthof(builtins_running_sql); i++)
				if (function == builtins_running_sql[i])
					runs_sql = true;
		}
		ReleaseSysCache(tuple);
		if (language == ClanguageId)
		{
			char	   *symbol = knn_gpu_function_symbol(function);

			runs_sql = symbol == NULL;
			for (int i = 0; i < lengthof(knn_gpu_text_readers) && !runs_sql; i++)
				if (strcmp(symbol, knn_gpu_text_readers[i]) == 0)
					runs_sql = true;
			if (symbol != NULL)
				pfree(symbol);
		}
	}
	return runs_sql;
}

/*
 * Does the node run SQL of its own, or may it? Aggregates and window
 * functions (their support functions are not walked), domain checks
 * (their constraints are not in the tree) are taken as may.
 */
static bool
calls_sql_function(Node *node, void *context)
{
	if (node == NULL)
		return false;
	if (IsA(node, Aggref) || IsA(node, WindowFunc) || IsA(node, CoerceToDomain))
		return true;
	/* in a plan's expressions: a subquery's plan run from there, which may read anything */
	if (IsA(node, SubPlan) || IsA(node, AlternativeSubPlan))
		return true;
	if (check_functions_in_node(node, function_runs_sql, context))
		return true;
	if (IsA(node, Query))
		return query_tree_walker((Query *) node, calls_sql_function, context, 0);
	return expression_tree_walker(node, calls_sql_function, context);
}

/* ---- may the part read here use a shard's connection? ---- */

typedef struct LocalPartCheck
{
	const KnnShardPlan *sp;
	List	   *rtable;
} LocalPartCheck;

static bool
exprs_run_sql(List *exprs)
{
	return calls_sql_function((Node *) exprs, NULL);
}

/* Sort operators (a Sort's, a MergeAppend's): their functions run for every comparison. */
static bool
operators_run_sql(const Oid *operators, int n)
{
	for (int i = 0; i < n; i++)
		if (function_runs_sql(get_opcode(operators[i]), NULL))
			return true;
	return false;
}

/*
 * Is the scan postgres_fdw's on a shard's connection? One of a table: with
 * the shard's user mapping; a join or a LIMIT pushed down (no one table):
 * on the shard's server at all.
 */
static bool
scan_uses_shard_connection(ForeignScan *scan, const LocalPartCheck *check)
{
	const KnnShardPlan *sp = check->sp;

	for (int s = 0; s < sp->n_shards; s++)
	{
		if (sp->shards[s]->server->serverid != scan->fs_server)
			continue;
		if (scan->scan.scanrelid == 0 ||
			scan_user_mapping(check->rtable, scan)->umid == sp->shards[s]->user->umid)
			return true;
	}
	return false;
}

static bool
plan_list_uses_shards(List *plans, const LocalPartCheck *check);

/*
 * May running the plan (the part of the targets read here) use a shard's
 * connection? Yes for a postgres_fdw scan on it, anywhere in the tree, and
 * for anything that may run SQL of its own (a function that may, a
 * subquery's plan, an init plan): a nested knn_join there, a PL function
 * reading a foreign table. Nodes not known here are taken as may.
 */
static bool
plan_uses_shards(Plan *plan, const LocalPartCheck *check)
{
	if (plan == NULL)
		return false;
	/* the scans that join on their servers are not part of it */
	for (int i = 0; i < check->sp->n_scans; i++)
		if (check->sp->shard_of[i] >= 0 && list_nth(check->sp->scans, i) == plan)
			return false;
	if (plan->initPlan != NIL || exprs_run_sql(plan->targetlist) || exprs_run_sql(plan->qual))
		return true;
	switch (nodeTag(plan))
	{
		case T_Append:
			return plan_list_uses_shards(((Append *) plan)->appendplans, check);
		case T_MergeAppend:
			{
				MergeAppend *merge = (MergeAppend *) plan;

				return operators_run_sql(merge->sortOperators, merge->numCols) ||
					plan_list_uses_shards(merge->mergeplans, check);
			}
		case T_Sort:
			return operators_run_sql(((Sort *) plan)->sortOperators, ((Sort *) plan)->numCols) ||
				plan_uses_shards(plan->lefttree, check);
		case T_IncrementalSort:
			{
				Sort	   *sort = &((IncrementalSort *) plan)->sort;

				return operators_run_sql(sort->sortOperators, sort->numCols) ||
					plan_uses_shards(plan->lefttree, check);
			}
		case T_Result:
			return exprs_run_sql((List *) ((Result *) plan)->resconstantqual) ||
				plan_uses_shards(plan->lefttree, check);
		case T_Limit:
			return calls_sql_function(((Limit *) plan)->limitOffset, NULL) ||
				calls_sql_function(((Limit *) plan)->limitCount, NULL) ||
				plan_uses_shards(plan->lefttree, check);
		case T_Material:
			return plan_uses_shards(plan->lefttree, check);
		case T_SubqueryScan:
			return plan_uses_shards(((SubqueryScan *) plan)->subplan, check);
		case T_SeqScan:
			return false;
		case T_IndexScan:
			return exprs_run_sql(((IndexScan *) plan)->indexqual) ||
				exprs_run_sql(((IndexScan *) plan)->indexorderby);
		case T_IndexOnlyScan:
			return exprs_run_sql(((IndexOnlyScan *) plan)->indexqual) ||
				exprs_run_sql(((IndexOnlyScan *) plan)->recheckqual) ||
				exprs_run_sql(((IndexOnlyScan *) plan)->indexorderby);
		case T_BitmapHeapScan:
			return exprs_run_sql(((BitmapHeapScan *) plan)->bitmapqualorig) ||
				plan_uses_shards(plan->lefttree, check);
		case T_BitmapIndexScan:
			return exprs_run_sql(((BitmapIndexScan *) plan)->indexqual);
		case T_BitmapAnd:
			return plan_list_uses_shards(((BitmapAnd *) plan)->bitmapplans, check);
		case T_BitmapOr:
			return plan_list_uses_shards(((BitmapOr *) plan)->bitmapplans, check);
		case T_ForeignScan:
			{
				ForeignScan *scan = (ForeignScan *) plan;

				if (exprs_run_sql(scan->fdw_exprs) || exprs_run_sql(scan->fdw_recheck_quals))
					return true;
				/* other wrappers' scans use no shard's connection */
				return knn_shard_is_postgres_fdw(GetForeignServer(scan->fs_server)) &&
					scan_uses_shard_connection(scan, check);
			}
		default:
			return true;
	}
}

static bool
plan_list_uses_shards(List *plans, const LocalPartCheck *check)
{
	ListCell   *lc;

	foreach(lc, plans)
		if (plan_uses_shards(lfirst(lc), check))
			return true;
	return false;
}

bool
knn_shard_local_needs_shard_connection(const KnnShardPlan *sp, Plan *top, List *rtable)
{
	LocalPartCheck check = {sp, rtable};

	return plan_uses_shards(top, &check);
}

/*
 * Can the queries text be read while the shards' connections are busy?
 * Not when it reads a foreign table (postgres_fdw would use a connection
 * in the middle of a prefetch) or calls a function that runs SQL of its
 * own (it might): then the queries are read first, as before.
 */
static bool
queries_leave_connections_alone(SPIPlanPtr queries_plan)
{
	List	   *sources = SPI_plan_get_plan_sources(queries_plan);
	CachedPlanSource *source;
	CachedPlan *cplan;
	ResourceOwner owner = queries_plan->saved ? CurrentResourceOwner : NULL;
	bool		alone = true;
	ListCell   *lc;

	if (list_length(sources) != 1)
		return false;
	source = linitial(sources);
	/* the generic plan: every partition that may be read (and the query revalidated first) */
	cplan = GetCachedPlan(source, NULL, owner, NULL);
	foreach(lc, source->query_list)
		if (calls_sql_function(lfirst(lc), NULL))
			alone = false;
	foreach(lc, cplan->stmt_list)
	{
		PlannedStmt *stmt = lfirst_node(PlannedStmt, lc);
		ListCell   *rc;

		foreach(rc, stmt->rtable)
		{
			RangeTblEntry *rte = lfirst_node(RangeTblEntry, rc);

			if (rte->rtekind == RTE_RELATION && rte->relkind == RELKIND_FOREIGN_TABLE)
				alone = false;
		}
	}
	ReleaseCachedPlan(cplan, owner);
	return alone;
}

KnnShardEarly *
knn_shard_start(SPIPlanPtr queries_plan, SPIPlanPtr targets_plan, KnnElement element,
				bool grouped, const KnnShardJoin *join, bool queries_are_targets)
{
	KnnShardEarly *c;

	if (join->describe_only || !knn_gpu_shard_prefetch)
		return NULL;
	c = palloc0(sizeof(KnnShardEarly));
	c->seconds_queries = -1.0;
	c->context = CurrentMemoryContext;
	c->poll_at = PG_INT64_MAX;	/* nothing shipped during the read unless said below */
	c->state = find_shards(c, targets_plan, join, grouped);
	/*
	 * A self-join over shards only: the shards read the rows as their
	 * targets now, and send them back as the queries (knn_shard_read_queries)
	 * instead of this server reading the text through postgres_fdw.
	 */
	if (c->state == SHARDS_FOUND && queries_are_targets && all_scans_on_shards(&c->sp))
	{
		open_shards(c, element, join, true);
		if (c->queries_from_shards)
		{
			/* (streaming: they read when knn_shard_read_queries asks for the rows) */
			for (int s = 0; s < c->sp.n_shards && !c->streaming; s++)
				knn_shard_remote_prefetch_send(c->sp.shards[s]);
			return c;
		}
	}
	/* shards, but queries that may need their connections: read before the shards' work */
	if (c->state != SHARDS_FOUND || !queries_leave_connections_alone(queries_plan))
		return c;
	open_shards(c, element, join, false);
	/* their targets are read there while the caller reads its queries */
	for (int s = 0; s < c->sp.n_shards; s++)
		if (c->sp.shards[s]->prefetch_sql != NULL)
			knn_shard_remote_prefetch_send(c->sp.shards[s]);
	/* the shards that receive in blocks get the query rows as they are read */
	c->to_memory = palloc(Max(c->sp.n_shards, 1) * sizeof(KnnShardRemote *));
	for (int s = 0; s < c->sp.n_shards; s++)
		if (c->sp.shards[s]->receives_queries)
			c->to_memory[c->n_memory++] = c->sp.shards[s];
	if (c->n_memory > 0)
		c->poll_at = 1;
	return c;
}

/*
 * The first query row is read: how often to look at the shards. A quarter
 * of a block's rows (every row has the first's size), the first look once
 * a block is read.
 */
static void
plan_polls(KnnShardEarly *c, const KnnMatrix *queries)
{
	/* encode_query's row: the id's length and value, the vector's length and send form */
	int64		row_bytes = 4 + 8 + 4 + (query_vector_bytes(queries) - VARHDRSZ);
	int64		block_rows = (KNN_SHARD_BLOCK_BYTES + row_bytes - 1) / row_bytes;

	c->poll_every = Max(block_rows / 4, 1);
	c->poll_at = block_rows;
	c->ship_rows.n_fields = 2;
	c->ship_rows.max_vector_bytes = query_vector_bytes(queries);
	c->ship_rows.encode = encode_query;
	c->ship_rows.arg = (void *) queries;
}

void
knn_shard_queries_added(KnnShardEarly *c, const KnnMatrix *queries)
{
	if (c == NULL || queries->n < c->poll_at)
		return;
	if (c->ship_rows.encode == NULL)
	{
		plan_polls(c, queries);
		return;
	}
	c->poll_at = queries->n + c->poll_every;
	c->ship_rows.n = queries->n;
	if (c->shipment == NULL)
	{
		MemoryContext old;

		/* the connections are the prefetches' until they end */
		if (!knn_shard_remote_prefetch_poll(c->sp.shards, c->sp.n_shards))
			return;
		/*
		 * Under a savepoint there: ids that repeat, found only once all rows
		 * are read, take the rows back (the call then joins here).
		 */
		old = MemoryContextSwitchTo(c->context);
		c->shipment = knn_shard_remote_ship_start(c->to_memory, c->n_memory, &c->ship_rows, true);
		MemoryContextSwitchTo(old);
		ereport(DEBUG1,
				(errmsg_internal("knn_join: shipping the query rows to %d shards while they are read (" INT64_FORMAT " read so far)",
								 c->n_memory, queries->n)));
	}
	knn_shard_remote_ship_poll(c->shipment);
}

/*
 * Where a shard's held rows go among the queries: shard by shard, each in
 * the order it sends them (the order they were decoded in when the shards'
 * answers were read one after the other), whatever order the blocks of
 * the shards arrive in.
 */
typedef struct HeldRowsTarget
{
	KnnMatrix  *queries;		/* of ids only where the blocks are relayed */
	KnnShardRelay *relay;		/* where they are kept to be relayed, or NULL */
	KnnShardRemote **shards;	/* the shards, whose index is theirs in next and end */
	int64	   *next;			/* per shard: the row its next held row goes to */
	int64	   *end;			/* ... and one past its last */
} HeldRowsTarget;

static void
held_block_malformed(KnnShardRemote *shard, const char *what)
{
	ereport(ERROR,
			(errcode(ERRCODE_FDW_INVALID_DATA_TYPE),
			 errmsg("%s: foreign server \"%s\" sent a malformed block of held rows: %s",
					shard->who, shard->server->servername, what)));
}

static void
held_rows_miscounted(KnnShardRemote *shard, const char *sent)
{
	ereport(ERROR,
			(errcode(ERRCODE_FDW_INVALID_DATA_TYPE),
			 errmsg("%s: foreign server \"%s\" sent %s held rows, not the " INT64_FORMAT " it read",
					shard->who, shard->server->servername, sent, shard->prefetched_rows)));
}

/*
 * Puts one block of a shard's held rows (knn_shard_held_target_blocks's
 * layout) into their places among the queries: hostile input, every
 * length checked against the block and every value as the matrix's reader
 * would (the matrix's element and the dimension the shard said, finite
 * elements, no bits past a bit string's length), no more rows than it said.
 */
static int64
read_held_block(KnnShardRemote *shard, int s, const char *data, int length, HeldRowsTarget *t)
{
	KnnMatrix  *m = t->queries;
	uint32		header[3];
	int			element;
	int			dim;
	int64		rows;
	const char *ids;
	const char *values;

	if (data == NULL || length < (int) sizeof(header))
		held_block_malformed(shard, "no header");
	memcpy(header, data, sizeof(header));
	element = (int) pg_ntoh32(header[0]);
	dim = (int) pg_ntoh32(header[1]);
	rows = (int32) pg_ntoh32(header[2]);
	if (element != (int) m->element)
		held_block_malformed(shard, "another element type");
	if (dim != m->dim || rows < 1)
		held_block_malformed(shard, "a dimension or row count out of range");
	if ((Size) length != sizeof(header) + (Size) rows * (sizeof(int64) + m->row_bytes))
		held_block_malformed(shard, "a length that is not its rows'");
	if (rows > t->end[s] - t->next[s])
		held_rows_miscounted(shard, "more");
	if (t->next[s] < 0 || t->end[s] > m->n)
		elog(ERROR, "read_held_block: rows placed outside the query matrix");
	ids = data + sizeof(header);
	values = ids + (Size) rows * sizeof(int64);
	/* relayed: the ids only (each shard it goes to checks every value, as of any caller) */
	for (int64 r = 0; t->relay != NULL && r < rows; r++)
	{
		uint64		id;

		memcpy(&id, ids + (Size) r * sizeof(int64), sizeof(id));
		m->ids[t->next[s]++] = (int64) pg_ntoh64(id);
	}
	for (int64 r = 0; t->relay == NULL && r < rows; r++)
	{
		char	   *row = m->values + (Size) t->next[s] * m->row_bytes;
		uint64		id;
		bool		bad;

		memcpy(&id, ids + (Size) r * sizeof(int64), sizeof(id));
		bad = knn_rows_swap_order(row, values + (Size) r * m->row_bytes, m->row_bytes, m->element);
		/* bits past a bit string's length are zero */
		if (m->element == KNN_ELEMENT_BIT && dim % 8 != 0)
			bad = (((unsigned char) row[m->row_bytes - 1]) & (0xFF >> (dim % 8))) != 0;
		if (bad)
			held_block_malformed(shard, "a value the type does not allow");
		m->ids[t->next[s]++] = (int64) pg_ntoh64(id);
	}
	knn_progress_rows(rows);
	CHECK_FOR_INTERRUPTS();
	return rows;
}

static void
read_held_rows(void *arg, KnnShardRemote *shard, const KnnShardResult *result)
{
	HeldRowsTarget *t = (HeldRowsTarget *) arg;
	int			s = 0;

	while (t->shards[s] != shard)
		s++;
	/* (single-row mode: a result is one block, kept whole where relayed) */
	if (t->relay != NULL && knn_shard_result_rows(result) != 1)
		elog(ERROR, "read_held_rows: %d blocks in one result", knn_shard_result_rows(result));
	for (int r = 0; r < knn_shard_result_rows(result); r++)
	{
		int			length;
		const char *data = knn_shard_result_value(result, r, 0, &length);
		int64		rows = read_held_block(shard, s, data, length, t);

		if (t->relay != NULL)
			knn_shard_relay_keep(t->relay, result, s, data, length, rows);
	}
}

/*
 * Can the held blocks be relayed to the shards as they came? Where every
 * shard receives them (knn_shard_receive_held_rows) and joins them with
 * its own rows, and there is another shard to send them to.
 */
static bool
shards_take_relayed_blocks(const KnnShardEarly *c)
{
	if (!knn_gpu_shard_relay || c->sp.n_shards < 2)
		return false;
	for (int s = 0; s < c->sp.n_shards; s++)
	{
		const KnnShardRemote *shard = c->sp.shards[s];

		if (!shard->has_held_relay || !shard->receives_queries || shard->held_join_sql == NULL)
			return false;
	}
	return true;
}

/* The dimensions (bits) a value of this type and typmod may have: *min_dim .. *max_dim. */
static void
typmod_dims(Oid type, int32 typmod, int32 *min_dim, int32 *max_dim)
{
	KnnVectorKind kind = knn_vector_kind(type);

	*min_dim = 1;
	*max_dim = PG_INT32_MAX;
	if (typmod < 0)
		return;
	if (type == VARBITOID)
		*max_dim = typmod;
	/* vector(n), halfvec(n), bit(n) */
	else if (type == BITOID || kind == KNN_VECTOR_TYPE || kind == KNN_VECTOR_HALFVEC)
		*min_dim = *max_dim = typmod;
	else
		*max_dim = 0;
}

/* May a value of this type and typmod have `dim` dimensions (bits)? */
static bool
dim_fits_typmod(Oid type, int32 typmod, int dim)
{
	int32		min_dim;
	int32		max_dim;

	typmod_dims(type, typmod, &min_dim, &max_dim);
	return dim >= min_dim && dim <= max_dim;
}

/*
 * What the declared columns of a self-join's text read, for a shard's read
 * that sends its rows as it reads them (knn_shard_read_held_blocks's last
 * arguments): the id and vector types by catalog identity
 * (knn_shard_type_identity, NULL for none) and the dimensions the vector
 * column allows. A shard whose rows are not those reads nothing and says
 * so; the rows are then read here, as held_rows_differ's are.
 */
static char *
declared_held_columns(const KnnShardEarly *c)
{
	List	   *tlist = c->stmt->planTree->targetlist;
	Expr	   *id = linitial_node(TargetEntry, tlist)->expr;
	Expr	   *vector = lsecond_node(TargetEntry, tlist)->expr;
	char	   *id_type = knn_shard_type_identity(exprType((Node *) id));
	char	   *vector_type = knn_shard_type_identity(exprType((Node *) vector));
	int32		min_dim;
	int32		max_dim;

	typmod_dims(exprType((Node *) vector), exprTypmod((Node *) vector), &min_dim, &max_dim);
	return psprintf("%s::pg_catalog.text, %s::pg_catalog.text, %d, %d",
					id_type ? quote_literal_cstr(id_type) : "NULL",
					vector_type ? quote_literal_cstr(vector_type) : "NULL", min_dim, max_dim);
}

/* NULL where a shard's column (its type `there`) is of the type declared here (`here`), else why not. */
static char *
column_differs(const KnnShardRemote *shard, const char *what, const char *there,
			   const char *here, Oid here_type)
{
	if (here != NULL && there != NULL && strcmp(here, there) == 0)
		return NULL;
	return psprintf("foreign server \"%s\" holds %s of another type (%s, here %s)",
					shard->server->servername, what, there ? there : "?",
					format_type_be(here_type));
}

/*
 * Are the rows every shard holds exactly those this server's read of the
 * text would give: its id and vector columns of the types declared here
 * (catalog identity: knn_shard_type_identity), every dimension one the
 * declared vector type allows, and one dimension on all shards (as one
 * read would require)? NULL if so (*dim: theirs, -1 without rows), else
 * why not. Where they are not, the text is read here (through
 * postgres_fdw: the declared types' input functions), which gives what it
 * always gave, an ERROR included.
 */
static const char *
held_rows_differ(const KnnShardEarly *c, KnnElement element, int32 *dim)
{
	List	   *tlist = c->stmt->planTree->targetlist;
	Expr	   *id = linitial_node(TargetEntry, tlist)->expr;
	Expr	   *vector = lsecond_node(TargetEntry, tlist)->expr;
	char	   *id_type = knn_shard_type_identity(exprType((Node *) id));
	char	   *vector_type = knn_shard_type_identity(exprType((Node *) vector));

	*dim = -1;
	for (int s = 0; s < c->sp.n_shards; s++)
	{
		KnnShardRemote *shard = c->sp.shards[s];

		char	   *why;

		if ((why = column_differs(shard, "ids", shard->held_id_type, id_type,
								  exprType((Node *) id))) != NULL ||
			(why = column_differs(shard, "vectors", shard->held_vector_type, vector_type,
								  exprType((Node *) vector))) != NULL)
			return why;
		/* (a dimension the rows cannot have: a shard that says what it does not hold) */
		if (shard->prefetched_rows > 0 &&
			(shard->held_dim < 1 || (element != KNN_ELEMENT_BIT && shard->held_dim > 64 * 1024)))
			held_block_malformed(shard, psprintf("rows of %d dimensions said", shard->held_dim));
		if (shard->prefetched_rows == 0)
			continue;
		if (*dim >= 0 && shard->held_dim != *dim)
			return psprintf("foreign server \"%s\" holds vectors of %d dimensions, another shard of %d",
							shard->server->servername, shard->held_dim, *dim);
		if (!dim_fits_typmod(exprType((Node *) vector), exprTypmod((Node *) vector),
							 shard->held_dim))
			return psprintf("foreign server \"%s\" holds vectors of %d dimensions, which %s does not allow",
							shard->server->servername, shard->held_dim,
							format_type_with_typemod(exprType((Node *) vector),
													 exprTypmod((Node *) vector)));
		*dim = shard->held_dim;
	}
	return NULL;
}

/*
 * Ids that repeat: the call joins here, on the rows in the order this
 * server's read gives them (partition order, not the shards'), so they are
 * read here, as without the shards (the join then says so). True where
 * the queries from the shards stand.
 */
static bool
queries_distinct(KnnShardEarly *c, KnnMatrix *queries)
{
	if (!knn_matrix_ids_distinct(queries))
	{
		MemoryContext old = MemoryContextSwitchTo(queries->context);
		const char *set_name = queries->set_name;
		KnnElement	element = queries->element;

		knn_matrix_free(queries);
		knn_matrix_init(queries, set_name, element);
		MemoryContextSwitchTo(old);
		if (c->relay != NULL)
			knn_shard_relay_free(c->relay);
		c->relay = NULL;
		c->held_end = NULL;
		ereport(DEBUG1,
				(errmsg_internal("knn_join: the query rows read here, not from the shards: query ids repeat")));
		c->queries_from_shards = false;
		return false;
	}
	return true;
}

/* The rows of a self-join's read as the shards send them (knn_shard_read_held_blocks). */
typedef struct StreamedRows
{
	KnnShardRemote **shards;
	int			n_shards;
	KnnShardRelay *relay;		/* where the blocks are kept, to be relayed */
	KnnElement	element;
	int32	   *dim;			/* per shard: its blocks' dimension, -1 before its first */
	bool	   *refused;		/* ... it said its rows are not the declared columns' */
	int64	   *ids;			/* every row's, in the order they came */
	int64		n;
	int64		capacity;
} StreamedRows;

/*
 * One block of a shard's read (hostile input: every length checked, the
 * ids taken, the block kept whole to be relayed; the shards it goes to
 * check its values), or its refusal (a 12-byte header of element -1,
 * before any row).
 */
static void
read_streamed_rows(void *arg, KnnShardRemote *shard, const KnnShardResult *result)
{
	StreamedRows *t = (StreamedRows *) arg;
	int			s = 0;
	int			length;
	const char *data;
	uint32		header[3];
	int32		dim;
	int64		rows;
	Size		row_bytes;

	while (t->shards[s] != shard)
		s++;
	if (knn_shard_result_rows(result) != 1)
		elog(ERROR, "read_streamed_rows: %d blocks in one result", knn_shard_result_rows(result));
	data = knn_shard_result_value(result, 0, 0, &length);
	if (data == NULL || length < (int) sizeof(header))
		held_block_malformed(shard, "no header");
	memcpy(header, data, sizeof(header));
	dim = (int32) pg_ntoh32(header[1]);
	rows = (int32) pg_ntoh32(header[2]);
	if (t->refused[s])
		held_block_malformed(shard, "rows after it said its rows are not the declared columns'");
	if (pg_ntoh32(header[0]) == PG_UINT32_MAX)
	{
		if (length != (int) sizeof(header) || dim != 0 || rows != 0 || shard->prefetched_rows > 0)
			held_block_malformed(shard, "a refusal that is not one");
		t->refused[s] = true;
		return;
	}
	if ((int) pg_ntoh32(header[0]) != (int) t->element)
		held_block_malformed(shard, "another element type");
	if (rows < 1 || dim < 1 || (t->element != KNN_ELEMENT_BIT && dim > 64 * 1024) ||
		(t->dim[s] >= 0 && dim != t->dim[s]))
		held_block_malformed(shard, "a dimension or row count out of range");
	t->dim[s] = dim;
	row_bytes = knn_row_bytes(t->element, dim);
	if ((Size) length != sizeof(header) + (Size) rows * (sizeof(int64) + row_bytes))
		held_block_malformed(shard, "a length that is not its rows'");
	/* (every row is held here, as libpq's, until it is relayed: more than memory could hold is a lie) */
	if (rows > (int64) (MaxAllocHugeSize / (row_bytes + sizeof(int64))) - t->n)
		ereport(ERROR,
				(errcode(ERRCODE_FDW_INVALID_DATA_TYPE),
				 errmsg("%s: foreign server \"%s\" sent more rows than this server could hold",
						shard->who, shard->server->servername)));
	if (t->n + rows > t->capacity)
	{
		t->capacity = Max(t->n + rows, 2 * t->capacity);
		t->ids = repalloc_huge(t->ids, (Size) t->capacity * sizeof(int64));
	}
	for (int64 r = 0; r < rows; r++)
	{
		uint64		id;

		memcpy(&id, data + sizeof(header) + (Size) r * sizeof(int64), sizeof(id));
		t->ids[t->n++] = (int64) pg_ntoh64(id);
	}
	knn_shard_relay_keep(t->relay, result, s, data, length, rows);
	shard->prefetched_rows += rows;
	knn_progress_rows(rows);
	CHECK_FOR_INTERRUPTS();
}

/*
 * A self-join's queries, as the shards read them (c->streaming): each
 * shard's read sends its rows as it goes (knn_shard_read_held_blocks),
 * all shards at once, and the blocks are kept to be relayed. False where
 * a shard's rows are not what the declared columns read (it said so, or
 * the shards' dimensions differ): the rows are then read here, and the
 * shards that read theirs hold them as their targets.
 */
static bool
stream_queries(KnnShardEarly *c, KnnMatrix *queries)
{
	StreamedRows t = {0};
	const char *differ = NULL;
	int32		dim = -1;
	MemoryContext old;

	t.shards = c->sp.shards;
	t.n_shards = c->sp.n_shards;
	t.element = queries->element;
	t.dim = palloc(t.n_shards * sizeof(int32));
	t.refused = palloc0(t.n_shards * sizeof(bool));
	t.capacity = 1024;
	t.ids = palloc(t.capacity * sizeof(int64));
	for (int s = 0; s < t.n_shards; s++)
	{
		t.dim[s] = -1;
		c->sp.shards[s]->prefetched_rows = 0;
	}
	old = MemoryContextSwitchTo(c->context);
	t.relay = c->relay = knn_shard_relay_create(t.n_shards);
	MemoryContextSwitchTo(old);
	knn_shard_remote_fetch_held(c->sp.shards, c->sp.n_shards, read_streamed_rows, &t);
	for (int s = 0; s < t.n_shards; s++)
	{
		KnnShardRemote *shard = c->sp.shards[s];

		/* what it read it holds for its join, as a read ahead would */
		shard->holds_targets = !t.refused[s];
		if (t.refused[s])
			differ = psprintf("foreign server \"%s\" holds rows of other columns than those declared here",
							  shard->server->servername);
		else if (t.dim[s] >= 0 && dim >= 0 && t.dim[s] != dim && differ == NULL)
			differ = psprintf("foreign server \"%s\" holds vectors of %d dimensions, another shard of %d",
							  shard->server->servername, t.dim[s], dim);
		else if (t.dim[s] >= 0)
			dim = t.dim[s];
	}
	/* (the shards check the declared dimensions; they are the shards' word) */
	if (differ == NULL && dim >= 0)
	{
		Expr	   *vector = lsecond_node(TargetEntry, c->stmt->planTree->targetlist)->expr;

		if (!dim_fits_typmod(exprType((Node *) vector), exprTypmod((Node *) vector), dim))
			differ = psprintf("the shards hold vectors of %d dimensions, which %s does not allow", dim,
							  format_type_with_typemod(exprType((Node *) vector),
													   exprTypmod((Node *) vector)));
	}
	if (differ != NULL)
	{
		ereport(DEBUG1,
				(errmsg_internal("knn_join: the query rows read here, not from the shards: %s", differ)));
		knn_shard_relay_free(c->relay);
		c->relay = NULL;
		c->queries_from_shards = false;
		return false;
	}
	knn_matrix_reserve_ids(queries, dim, t.n);
	if (t.n > 0)
		memcpy(queries->ids, t.ids, (Size) t.n * sizeof(int64));
	pfree(t.ids);
	/* (each shard's count; the rows are in the order they came, which only the relay needs) */
	c->held_end = MemoryContextAlloc(c->context, t.n_shards * sizeof(int64));
	for (int s = 0; s < t.n_shards; s++)
		c->held_end[s] = (s > 0 ? c->held_end[s - 1] : 0) + c->sp.shards[s]->prefetched_rows;
	return true;
}

bool
knn_shard_read_queries(KnnShardEarly *c, KnnMatrix *queries)
{
	HeldRowsTarget target;
	const char *differ;
	int32		dim;
	int64		rows = 0;
	int64		most;

	if (c == NULL || !c->queries_from_shards)
		return false;
	if (c->streaming)
		return stream_queries(c, queries) && queries_distinct(c, queries);
	knn_shard_remote_prefetch_wait(c->sp.shards, c->sp.n_shards);
	/* before any row moves: rows other than the declared columns would read are read here */
	if ((differ = held_rows_differ(c, queries->element, &dim)) != NULL)
	{
		ereport(DEBUG1,
				(errmsg_internal("knn_join: the query rows read here, not from the shards: %s",
								 differ)));
		c->queries_from_shards = false;
		return false;
	}
	/* every shard's rows get their places at once: as many as each said it read */
	target.queries = queries;
	target.shards = c->sp.shards;
	target.next = palloc(c->sp.n_shards * sizeof(int64));
	/* (where each shard's rows end: kept, it may be shipped only the others', knn_shard_try_join) */
	target.end = MemoryContextAlloc(c->context, c->sp.n_shards * sizeof(int64));
	/* (the counts are the shards' word: more than memory could hold is a lie) */
	most = dim > 0 ? (int64) (MaxAllocHugeSize / (knn_row_bytes(queries->element, dim) + sizeof(int64))) : 0;
	for (int s = 0; s < c->sp.n_shards; s++)
	{
		KnnShardRemote *shard = c->sp.shards[s];

		target.next[s] = rows;
		if (shard->prefetched_rows < 0 || shard->prefetched_rows > most ||
			pg_add_s64_overflow(rows, shard->prefetched_rows, &rows) || rows > most)
			ereport(ERROR,
					(errcode(ERRCODE_FDW_INVALID_DATA_TYPE),
					 errmsg("%s: foreign server \"%s\" says it read " INT64_FORMAT " rows, more than this server could hold",
							shard->who, shard->server->servername, shard->prefetched_rows)));
		target.end[s] = rows;
	}
	/* room for them all, untouched until they come; only for their ids where they are relayed */
	target.relay = NULL;
	if (shards_take_relayed_blocks(c))
	{
		MemoryContext old = MemoryContextSwitchTo(c->context);

		target.relay = c->relay = knn_shard_relay_create(c->sp.n_shards);
		MemoryContextSwitchTo(old);
		knn_matrix_reserve_ids(queries, dim, rows);
	}
	else
		knn_matrix_reserve_rows(queries, dim, rows);
	if (rows > 0)
		knn_shard_remote_fetch_held(c->sp.shards, c->sp.n_shards, read_held_rows, &target);
	/* every row it read (and will join as its targets), no fewer */
	for (int s = 0; s < c->sp.n_shards; s++)
		if (target.next[s] != target.end[s])
			held_rows_miscounted(c->sp.shards[s],
								 psprintf(INT64_FORMAT, c->sp.shards[s]->prefetched_rows -
										  (target.end[s] - target.next[s])));
	c->held_end = target.end;
	return queries_distinct(c, queries);
}

void
knn_shard_queries_failed(KnnShardEarly *early)
{
	if (early != NULL && early->shipment != NULL)
		knn_shard_remote_ship_fail(early->shipment);
}

void
knn_shard_queries_read(KnnShardEarly *early, double seconds)
{
	if (early == NULL)
		return;
	early->seconds_queries = seconds;
	ereport(DEBUG1,
			(errmsg_internal("knn_join: the query rows read in %.3f s (%s)", seconds,
							 early->queries_from_shards ? "from the shards" : "here")));
}

bool
knn_shard_try_join(ReturnSetInfo *rsinfo, KnnMatrix *queries, SPIPlanPtr targets_plan,
				   const char *targets_sql, KnnVectorKind target_kind, const KnnShardJoin *join,
				   KnnShardEarly *early)
{
	KnnShardEarly now = {0};
	KnnShardEarly *c = early != NULL ? early : &now;
	KnnShardPlan *spp = &c->sp;
	KnnMatrix	local;
	KnnShardLists *sources;
	bool		local_after;
	instr_time	phase;
	double		seconds_ship = 0.0;
	double		seconds_local = 0.0;
	double		seconds_merge;
	int64		rows;
	KnnShardRows ship_rows = {0};
	Spill	   *spill = NULL;

	/* the rows not shipped while they were read go now: the shards then hold them all */
	if (early != NULL && early->shipment != NULL)
	{
		INSTR_TIME_SET_CURRENT(phase);
		early->ship_rows.n = queries->n;
		knn_shard_remote_ship_finish(early->shipment);
		seconds_ship = knn_seconds_since(phase);
	}
	if (early == NULL)
	{
		if (queries->n == 0 && !join->describe_only)
			return false;
		now.seconds_queries = -1.0;
		if ((now.state = find_shards(&now, targets_plan, join, queries->grouped)) != SHARDS_FOUND)
			return false;
	}
	else if (early->state != SHARDS_FOUND && early->state != SHARDS_OPENED)
		return false;
	else if (queries->n == 0)
	{
		/* no query: joined here (as before), and nothing stays held on the shards */
		if (early->state == SHARDS_OPENED)
			abandon_shards(early);
		else
			ReleaseCachedPlan(early->cplan, early->owner);
		return false;
	}
	/*
	 * The rows go out in the order they were read (a shard's join takes its
	 * queries in any order); they are sorted here once the shards are
	 * joining. (Rows from the shards were checked as they were fetched.)
	 */
	if (c->held_end == NULL && !knn_matrix_ids_distinct(queries))
	{
		notice_not_pushed(spp, "query ids repeat");
		if (c->state == SHARDS_OPENED)
			abandon_shards(c);
		else
			ReleaseCachedPlan(c->cplan, c->owner);
		return false;
	}
	if (c->state != SHARDS_OPENED)
		open_shards(c, queries->element, join, false);
	if (spp->n_shards == 0)
	{
		ReleaseCachedPlan(c->cplan, c->owner);
		return false;
	}
	if (join->describe_only)
	{
		KnnShardSummary summary;

		knn_shard_summarize(&summary, spp);
		knn_join_explain_report_shards(&summary);
		ReleaseCachedPlan(c->cplan, c->owner);
		return true;
	}

	/* lists past knn_gpu.max_result_memory: the shards' rows read as they come, in batches */
	{
		int64		per_run = batch_rows(join, spp->n_shards, queries->n);

		if (per_run > 0)
			spill = knn_shard_spill_begin(queries, per_run, spp->n_shards, spp->shards,
										  !join->range);
		for (int s = 0; s < spp->n_shards; s++)
			spp->shards[s]->stream_result = spill != NULL;
	}

	/* the shards read their targets (begun before the queries were read) before they take queries */
	INSTR_TIME_SET_CURRENT(phase);
	knn_shard_remote_prefetch_wait(spp->shards, spp->n_shards);
	c->seconds_prefetch_wait = knn_seconds_since(phase);
	if (queries->n > 0)
	{
		KnnShardRemote **to_memory = palloc(spp->n_shards * sizeof(KnnShardRemote *));
		KnnShardRemote **to_table = palloc(spp->n_shards * sizeof(KnnShardRemote *));
		int			n_memory = 0;
		int			n_table = 0;

		/* the shards that got the rows while they were read keep them (in id order or not: the joins there sort them) */
		if (c->shipment != NULL)
			knn_shard_remote_ship_end_savepoint(c->shipment, true);
		INSTR_TIME_SET_CURRENT(phase);
		ship_rows.n = queries->n;
		ship_rows.n_fields = 2;
		ship_rows.max_vector_bytes = query_vector_bytes(queries);
		ship_rows.encode = encode_query;
		ship_rows.arg = queries;
		/* in blocks into the shards' memory where they can, else by COPY into a table */
		for (int s = 0; s < spp->n_shards; s++)
		{
			if (spp->shards[s]->receives_queries)
				to_memory[n_memory++] = spp->shards[s];
			else
				to_table[n_table++] = spp->shards[s];
		}
		/*
		 * The queries came from the shards (each shard's rows still where
		 * they were read: they are sorted below): each is shipped only the
		 * other shards' and joins them with its own, where every one can.
		 */
		if (c->relay != NULL)
		{
			/* (every shard receives them: shards_take_relayed_blocks) */
			if (n_memory != spp->n_shards || c->shipment != NULL)
				elog(ERROR, "knn_shard_try_join: relayed blocks for %d of %d shards",
					 n_memory, spp->n_shards);
			ship_rows.relay = c->relay;
			ship_rows.n = c->relay->rows;
			for (int s = 0; s < spp->n_shards; s++)
				spp->shards[s]->join_sql = spp->shards[s]->held_join_sql;
		}
		else if (c->held_end != NULL && c->shipment == NULL && n_memory == spp->n_shards)
		{
			bool		all_can = true;

			for (int s = 0; s < spp->n_shards; s++)
				all_can = all_can && spp->shards[s]->held_join_sql != NULL;
			if (all_can)
			{
				ship_rows.origin_end = c->held_end;
				for (int s = 0; s < spp->n_shards; s++)
					spp->shards[s]->join_sql = spp->shards[s]->held_join_sql;
			}
		}
		if (n_memory > 0)
		{
			if (c->shipment == NULL)
				knn_shard_remote_ship_blocks(to_memory, n_memory, &ship_rows);
			/* these join while the others' rows are copied */
			knn_shard_remote_send(to_memory, n_memory);
		}
		if (n_table > 0)
		{
			knn_shard_remote_ship(to_table, n_table, &ship_rows);
			knn_shard_remote_send(to_table, n_table);
		}
		seconds_ship += knn_seconds_since(phase);
	}
	/* while the shards join: the local part and the merge take the queries in id order */
	knn_matrix_sort_by_id(queries);

	sources = palloc0((spp->n_shards + 1) * sizeof(KnnShardLists));
	knn_matrix_init(&local, "target", queries->element);
	local_after = knn_shard_local_needs_shard_connection(spp, c->stmt->planTree, c->stmt->rtable);
	for (int pass = 0; pass < 2; pass++)
	{
		/* the local part runs while the shards work, unless it needs their connections */
		if (pass == (local_after ? 1 : 0))
		{
			double		seconds_read;

			INSTR_TIME_SET_CURRENT(phase);
			read_local_part(c->stmt, targets_sql, spp, join->params, &local, target_kind);
			seconds_read = knn_seconds_since(phase);
			join_local_part(queries, &local, join, &sources[spp->n_shards], spill, seconds_read);
			seconds_local = knn_seconds_since(phase);
		}
		if (pass == 0 && queries->n > 0 && spill != NULL)
			knn_shard_remote_collect_rows(spp->shards, spp->n_shards, spill_shard_rows, spill);
		else if (pass == 0 && queries->n > 0)
		{
			ListsTarget target = {queries, join->k};

			knn_shard_remote_collect(spp->shards, spp->n_shards, read_shard_lists, &target);
		}
	}
	ReleaseCachedPlan(c->cplan, c->owner);

	INSTR_TIME_SET_CURRENT(phase);
	if (spill != NULL)
	{
		KnnPackedRows packed_here;
		KnnPackedRows *packed = join->packed;

		for (int s = 0; s < spp->n_shards; s++)
		{
			spp->shards[s]->rows = spill->pairs[s];
			knn_shard_remote_release(spp->shards[s]);
		}
		/*
		 * The rows go into the tuplestore, not the custom scan's lists; a
		 * packed form called value per call materialises, as knn_join's
		 * own batches do.
		 */
		if (join->direct != NULL && rsinfo->setResult == NULL)
		{
			InitMaterializedSRF(join->fcinfo, MAT_SRF_USE_EXPECTED_DESC);
			knn_packed_begin(&packed_here, rsinfo);
			packed = &packed_here;
		}
		rows = knn_shard_spill_merge(spill, rsinfo, join->range && join->k == 0 ? -1 : join->k,
									 packed);
		if (packed == &packed_here)
			knn_packed_end(&packed_here);
	}
	else
	{
		for (int s = 0; s < spp->n_shards; s++)
		{
			if (spp->shards[s]->caller != NULL)
				sources[s] = *(KnnShardLists *) spp->shards[s]->caller;
			else
			{
				sources[s].n_queries = queries->n;
				sources[s].offsets = palloc0((queries->n + 1) * sizeof(int64));
			}
			knn_shard_remote_release(spp->shards[s]);
		}
		rows = knn_shard_merge(rsinfo, queries->ids, queries->n, sources, spp->n_shards + 1,
							   join->k, join->packed, join->direct);
	}
	seconds_merge = knn_seconds_since(phase);
	{
		KnnShardSummary summary;

		knn_shard_summarize(&summary, spp);
		summary.ran = true;
		summary.local_targets = local.n;
		summary.local_after = local_after;
		summary.rows = rows;
		summary.merge_batches = spill != NULL && knn_shard_spill_in_files(spill) ? spill->n_batches : 0;
		summary.seconds_queries = c->seconds_queries;
		summary.queries_from_shards = c->queries_from_shards;
		summary.queries_relayed = c->relay != NULL;
		summary.queries_streamed = c->streaming && c->queries_from_shards;
		summary.seconds_prefetch_wait = c->seconds_prefetch_wait;
		summary.seconds_ship = seconds_ship;
		summary.seconds_local = seconds_local;
		summary.seconds_merge = seconds_merge;
		knn_shard_record_stats(spp, &summary, queries->n, join->k, c->fallbacks.data,
							   knn_seconds_since(c->start));
		knn_join_explain_report_shards(&summary);
	}
	return true;
}
