/*
 * knn_shard_merge.c -- the exact global top k of a sharded knn_join from
 * the per-query lists of its sources (knn_shard.h), and the statistics of
 * the last sharded join, knn_join's or the KNN Join node's
 * (knn_gpu_last_shard_stats()).
 *
 * Every source returned its own k best by (distance, target id), with the
 * distance the operator's value bit for bit, so the k best of the union
 * are the k best overall. Each source's list of a query comes in that
 * order already (knn_join's rank order), so the merge takes the best head
 * of the sources' lists, `limit` times: no sort, and a query's candidates
 * are read once. A list out of that order (a shard is not trusted to keep
 * it) makes that query's candidates go through a sort instead. Both ways
 * give the same rows in the same order, also for candidates equal by
 * (distance, target id) (a target id in two sources; the distances may
 * differ in the sign of a zero): the first source's, then its list's
 * first, as the merge takes them.
 *
 * The merged rows go into the caller's tuplestore, into packed values
 * (a coordinator that is itself a shard), or, for the KNN Join Function
 * node's direct return (knn_join_function_scan.h), into per-query lists
 * in the caller's memory: 16 bytes a row written, against a tuple formed
 * and stored per row.
 */
#include "postgres.h"

#include <math.h>

#include "access/htup_details.h"
#include "access/tupmacs.h"
#include "catalog/pg_type.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "common/jsonapi.h"
#include "mb/pg_wchar.h"
#include "utils/builtins.h"
#include "utils/json.h"
#include "utils/memutils.h"
#include "utils/tuplestore.h"

#include "knn_join_function_scan.h"
#include "knn_role_visibility.h"
#include "knn_shard.h"
#include "knn_shard_packed.h"

/* Rows handed back between two looks at the interrupt flags. */
#define MERGE_SLICE 4096

typedef struct Candidate
{
	double		distance;
	int64		target_id;
	int64		from;			/* for the sort: its source's rank, then its place in that list */
} Candidate;

/* (distance, target id), NaN after every number, as PostgreSQL sorts float8. */
static inline int
compare_pairs(double x_distance, int64 x_target, double y_distance, int64 y_target)
{
	bool		x_nan = isnan(x_distance);
	bool		y_nan = isnan(y_distance);

	if (x_nan != y_nan)
		return x_nan ? 1 : -1;
	if (!x_nan && x_distance != y_distance)
		return x_distance < y_distance ? -1 : 1;
	if (x_target != y_target)
		return x_target < y_target ? -1 : 1;
	return 0;
}

static int
compare_candidates(const void *a, const void *b, void *arg)
{
	const Candidate *x = (const Candidate *) a;
	const Candidate *y = (const Candidate *) b;

	int			c = compare_pairs(x->distance, x->target_id, y->distance, y->target_id);

	if (c != 0 || x->from == y->from)
		return c;
	return x->from < y->from ? -1 : 1;
}

/* Is the source's list of query q in (distance, target id) order? */
static bool
list_in_order(const KnnShardLists *source, int64 q)
{
	for (int64 i = source->offsets[q] + 1; i < source->offsets[q + 1]; i++)
		if (compare_pairs(source->distances[i - 1], source->target_ids[i - 1],
						  source->distances[i], source->target_ids[i]) > 0)
			return false;
	return true;
}

/*
 * Query q's best `limit` candidates (all with limit < 0) into candidates,
 * in order; their number. heads: room for a position per source.
 */
static int64
merge_query(const KnnShardLists *sources, int n_sources, int64 q, int64 limit,
			Candidate *candidates, int64 *heads)
{
	int64		n = 0;
	bool		in_order = true;

	for (int s = 0; s < n_sources; s++)
	{
		heads[s] = sources[s].offsets[q];
		n += sources[s].offsets[q + 1] - heads[s];
		in_order = in_order && list_in_order(&sources[s], q);
	}
	if (limit >= 0)
		n = Min(n, limit);
	if (!in_order)
	{
		int64		all = 0;

		for (int s = 0; s < n_sources; s++)
			for (int64 i = sources[s].offsets[q]; i < sources[s].offsets[q + 1]; i++)
			{
				candidates[all].distance = sources[s].distances[i];
				candidates[all].target_id = sources[s].target_ids[i];
				candidates[all].from = all;
				all++;
			}
		/* a query's millions of pairs (a range join's) take seconds: a cancel is checked in the sort */
		qsort_interruptible(candidates, all, sizeof(Candidate), compare_candidates, NULL);
		return n;
	}
	for (int64 r = 0; r < n; r++)
	{
		int			best = -1;

		/* the first source's head wins a tie: the sources' order, as the sort keeps it */
		for (int s = 0; s < n_sources; s++)
			if (heads[s] < sources[s].offsets[q + 1] &&
				(best < 0 ||
				 compare_pairs(sources[s].distances[heads[s]], sources[s].target_ids[heads[s]],
							   sources[best].distances[heads[best]],
							   sources[best].target_ids[heads[best]]) < 0))
				best = s;
		candidates[r].distance = sources[best].distances[heads[best]];
		candidates[r].target_id = sources[best].target_ids[heads[best]];
		heads[best]++;
	}
	return n;
}

/*
 * The merge's rows into the tuplestore as copies of one minimal tuple whose
 * four fixed-width fields are overwritten per row: a copy is a palloc and a
 * memcpy, where tuplestore_putvalues forms each tuple field by field (most
 * of the merge's time, perf). Only for knn_join's own row type (int8, int8,
 * int4, float8, all by value); any other through tuplestore_putvalues.
 */
typedef struct RowWriter
{
	ReturnSetInfo *rsinfo;
	TupleTableSlot *slot;		/* holding `tuple`; NULL: tuplestore_putvalues */
	MinimalTuple tuple;
	char	   *fields[4];		/* each field's bytes in `tuple` */
} RowWriter;

static void
row_writer_begin(RowWriter *w, ReturnSetInfo *rsinfo)
{
	static const Oid types[4] = {INT8OID, INT8OID, INT4OID, FLOAT8OID};
	TupleDesc	desc = rsinfo->setDesc;
	Datum		values[4] = {0, 0, 0, 0};
	bool		nulls[4] = {false, false, false, false};
	char	   *data;
	Size		offset = 0;

	w->rsinfo = rsinfo;
	w->slot = NULL;
	if (desc->natts != 4)
		return;
	for (int i = 0; i < 4; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);

		if (att->attisdropped || att->atttypid != types[i] || !att->attbyval ||
			att->attlen != (i == 2 ? 4 : 8))
			return;
	}
	w->tuple = heap_form_minimal_tuple(desc, values, nulls);
	/* the fields where heap_fill_tuple put them: no nulls, each at its alignment */
	data = (char *) w->tuple + w->tuple->t_hoff - MINIMAL_TUPLE_OFFSET;
	for (int i = 0; i < 4; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);

		offset = att_align_nominal(offset, att->attalign);
		w->fields[i] = data + offset;
		offset += att->attlen;
	}
	w->slot = MakeSingleTupleTableSlot(desc, &TTSOpsMinimalTuple);
	ExecStoreMinimalTuple(w->tuple, w->slot, false);
}

static void
row_writer_put(RowWriter *w, int64 query_id, int64 target_id, int32 rank, double distance)
{
	if (w->slot == NULL)
	{
		Datum		values[4];
		bool		nulls[4] = {false, false, false, false};

		values[0] = Int64GetDatum(query_id);
		values[1] = Int64GetDatum(target_id);
		values[2] = Int32GetDatum(rank);
		values[3] = Float8GetDatum(distance);
		tuplestore_putvalues(w->rsinfo->setResult, w->rsinfo->setDesc, values, nulls);
		return;
	}
	memcpy(w->fields[0], &query_id, sizeof(query_id));
	memcpy(w->fields[1], &target_id, sizeof(target_id));
	memcpy(w->fields[2], &rank, sizeof(rank));
	memcpy(w->fields[3], &distance, sizeof(distance));
	tuplestore_puttupleslot(w->rsinfo->setResult, w->slot);
}

static void
row_writer_end(RowWriter *w)
{
	if (w->slot == NULL)
		return;
	ExecDropSingleTupleTableSlot(w->slot);
	pfree(w->tuple);
}

/*
 * The merged lists of the direct return (knn_join_function_scan.h), for
 * `rows` rows, in the caller's memory: they outlive this call's (SPI's),
 * as a tuplestore would. out: the same lists, to be written.
 */
static void
direct_begin(KnnJoinDirect *direct, KnnShardLists *out, ReturnSetInfo *rsinfo,
			 const int64 *query_ids, int64 n_queries, int64 rows)
{
	MemoryContext context = rsinfo->econtext->ecxt_per_query_memory;
	int64	   *ids = MemoryContextAllocHuge(context, Max(n_queries, 1) * sizeof(int64));

	memcpy(ids, query_ids, n_queries * sizeof(int64));
	out->n_queries = n_queries;
	out->offsets = MemoryContextAllocHuge(context, (n_queries + 1) * sizeof(int64));
	out->target_ids = MemoryContextAllocHuge(context, Max(rows, 1) * sizeof(int64));
	out->distances = MemoryContextAllocHuge(context, Max(rows, 1) * sizeof(double));
	memset(direct, 0, sizeof(*direct));
	direct->n_queries = n_queries;
	direct->query_ids = ids;
	direct->offsets = out->offsets;
	direct->target_ids = out->target_ids;
	direct->distances = out->distances;
}

int64
knn_shard_merge(ReturnSetInfo *rsinfo, const int64 *query_ids, int64 n_queries,
				const KnnShardLists *sources, int n_sources, int64 limit,
				KnnPackedRows *packed, KnnJoinDirect *direct)
{
	int64		most = 0;
	int64		total = 0;
	Candidate  *candidates;
	int64	   *heads;
	RowWriter	writer = {NULL, NULL, NULL, {NULL}};
	int64		emitted = 0;
	KnnShardLists out = {0};

	for (int64 q = 0; q < n_queries; q++)
	{
		int64		n = 0;

		for (int s = 0; s < n_sources; s++)
			n += sources[s].offsets[q + 1] - sources[s].offsets[q];
		most = Max(most, n);
		total += limit >= 0 ? Min(n, limit) : n;
	}
	candidates = palloc_extended(Max(most, 1) * sizeof(Candidate), MCXT_ALLOC_HUGE);
	heads = palloc(Max(n_sources, 1) * sizeof(int64));
	if (direct != NULL)
		direct_begin(direct, &out, rsinfo, query_ids, n_queries, total);
	else if (packed == NULL)
		row_writer_begin(&writer, rsinfo);

	for (int64 q = 0; q < n_queries; q++)
	{
		int64		n = merge_query(sources, n_sources, q, limit, candidates, heads);

		if (n > PG_INT32_MAX)
			ereport(ERROR,
					(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
					 errmsg("knn_range_join: more than %d pairs for one query", PG_INT32_MAX),
					 errhint("Cap the pairs per query with k.")));
		if (direct != NULL)
		{
			out.offsets[q] = emitted;
			for (int64 r = 0; r < n; r++)
			{
				out.target_ids[emitted + r] = candidates[r].target_id;
				out.distances[emitted + r] = candidates[r].distance;
			}
			if ((emitted + n) / MERGE_SLICE != emitted / MERGE_SLICE)
				CHECK_FOR_INTERRUPTS();
			emitted += n;
			continue;
		}
		for (int64 r = 0; r < n; r++)
		{
			if (packed != NULL)
				knn_packed_put(packed, query_ids[q], candidates[r].target_id,
							   candidates[r].distance);
			else
				row_writer_put(&writer, query_ids[q], candidates[r].target_id, (int32) (r + 1),
							   candidates[r].distance);
			if (++emitted % MERGE_SLICE == 0)
				CHECK_FOR_INTERRUPTS();
		}
	}
	if (direct != NULL)
		out.offsets[n_queries] = emitted;
	else if (packed == NULL)
		row_writer_end(&writer);
	pfree(candidates);
	pfree(heads);
	return emitted;
}

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

void
knn_shard_record_stats(const KnnShardPlan *sp, const KnnShardSummary *summary, int64 n_queries,
					   int64 k, const char *fallbacks, double seconds_total)
{
	StringInfoData buf;

	initStringInfo(&buf);
	appendStringInfo(&buf, "{\"queries\":" INT64_FORMAT ",\"k\":" INT64_FORMAT
					 ",\"rows\":" INT64_FORMAT ",", n_queries, k, summary->rows);
	/* a merge in batches of queries (knn_gpu.max_result_memory) */
	if (summary->merge_batches > 0)
		appendStringInfo(&buf, "\"merge_batches\":" INT64_FORMAT ",", summary->merge_batches);
	appendStringInfoString(&buf, "\"shards\":[");
	for (int s = 0; s < sp->n_shards; s++)
	{
		const KnnShardRemote *shard = sp->shards[s];

		appendStringInfoString(&buf, s > 0 ? ",{" : "{");
		json_key(&buf, "server");
		escape_json(&buf, shard->server->servername);
		appendStringInfo(&buf, ",\"partitions\":%d,\"rows\":" INT64_FORMAT
						 ",\"seconds_join\":%.6f,",
						 list_length(shard->scans), shard->rows, shard->seconds_join);
		/* its targets read ahead of the queries (knn_shard_prefetch_targets) */
		if (shard->read_ahead)
			appendStringInfo(&buf, "\"seconds_read\":%.6f,\"targets_read\":" INT64_FORMAT ",",
							 shard->seconds_read, shard->prefetched_rows);
		/* the query rows shipped to it in blocks (a self-join's: the other shards' only) */
		if (shard->rows_shipped >= 0)
			appendStringInfo(&buf, "\"queries_shipped\":" INT64_FORMAT ",", shard->rows_shipped);
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
	appendStringInfo(&buf, "],\"fallback\":[%s],\"queries_from_shards\":%s,\"queries_relayed\":%s,\"queries_streamed\":%s,\"local\":",
					 fallbacks ? fallbacks : "", summary->queries_from_shards ? "true" : "false",
					 summary->queries_relayed ? "true" : "false",
					 summary->queries_streamed ? "true" : "false");
	if (summary->local_targets > 0)
		appendStringInfo(&buf, "{\"targets\":" INT64_FORMAT ",\"after_shards\":%s}",
						 summary->local_targets, summary->local_after ? "true" : "false");
	else
		appendStringInfoString(&buf, "null");
	appendStringInfoString(&buf, ",\"seconds\":{");
	/* the coordinator's query read, and its wait for the shards' target reads after it */
	if (summary->seconds_queries >= 0.0)
		appendStringInfo(&buf, "\"queries\":%.6f,\"wait_targets\":%.6f,",
						 summary->seconds_queries, summary->seconds_prefetch_wait);
	appendStringInfo(&buf, "\"ship\":%.6f,\"local\":%.6f,\"merge\":%.6f,\"total\":%.6f}}",
					 summary->seconds_ship, summary->seconds_local, summary->seconds_merge,
					 seconds_total);
	knn_shard_set_last_stats(buf.data);
	pfree(buf.data);
}

/*
 * Plain memory of the backend: outlives every query, replaced by the next
 * join; with the role that join ran as, for whom may see it.
 */
static char *last_stats = NULL;
static Oid	last_stats_role = InvalidOid;

void
knn_shard_set_last_stats(const char *json)
{
	char	   *copy = MemoryContextStrdup(TopMemoryContext, json);

	if (last_stats != NULL)
		pfree(last_stats);
	last_stats = copy;
	last_stats_role = GetUserId();
}

/*
 * The last sharded join's statistics, or NULL: none ran, or another role
 * ran it that the current one may not see (the remote SQL holds that
 * role's query texts, table names and constants), as if none had run.
 */
PG_FUNCTION_INFO_V1(knn_gpu_last_shard_stats);
Datum
knn_gpu_last_shard_stats(PG_FUNCTION_ARGS)
{
	if (last_stats == NULL || !knn_role_may_see_join_of(last_stats_role))
		PG_RETURN_NULL();
	PG_RETURN_TEXT_P(cstring_to_text(last_stats));
}
