/*
 * knn_shard_merge.c -- the exact global top k of a sharded knn_join from
 * the per-query lists of its sources (knn_shard.h), and the statistics of
 * the last sharded join, knn_join's or the KNN Join node's
 * (knn_gpu_last_shard_stats()).
 *
 * Every source returned its own k best by (distance, target id), with the
 * distance the operator's value bit for bit, so the k best of the union
 * are the k best overall: sorting each query's few candidates (at most
 * sources x k) is all the merge needs.
 */
#include "postgres.h"

#include <math.h>

#include "fmgr.h"
#include "miscadmin.h"
#include "common/jsonapi.h"
#include "mb/pg_wchar.h"
#include "utils/builtins.h"
#include "utils/json.h"
#include "utils/memutils.h"
#include "utils/tuplestore.h"

#include "knn_shard.h"
#include "knn_shard_packed.h"

/* Rows handed back between two looks at the interrupt flags. */
#define MERGE_SLICE 4096

typedef struct Candidate
{
	double		distance;
	int64		target_id;
} Candidate;

/* (distance, target id), NaN after every number as PostgreSQL sorts float8. */
static int
compare_candidates(const void *a, const void *b)
{
	const Candidate *x = (const Candidate *) a;
	const Candidate *y = (const Candidate *) b;
	bool		x_nan = isnan(x->distance);
	bool		y_nan = isnan(y->distance);

	if (x_nan != y_nan)
		return x_nan ? 1 : -1;
	if (!x_nan && x->distance != y->distance)
		return x->distance < y->distance ? -1 : 1;
	if (x->target_id != y->target_id)
		return x->target_id < y->target_id ? -1 : 1;
	return 0;
}

int64
knn_shard_merge(ReturnSetInfo *rsinfo, const int64 *query_ids, int64 n_queries,
				const KnnShardLists *sources, int n_sources, int64 limit,
				KnnPackedRows *packed)
{
	int64		most = 0;
	Candidate  *candidates;
	int64		emitted = 0;

	for (int64 q = 0; q < n_queries; q++)
	{
		int64		n = 0;

		for (int s = 0; s < n_sources; s++)
			n += sources[s].offsets[q + 1] - sources[s].offsets[q];
		most = Max(most, n);
	}
	candidates = palloc_extended(Max(most, 1) * sizeof(Candidate), MCXT_ALLOC_HUGE);

	for (int64 q = 0; q < n_queries; q++)
	{
		int64		n = 0;

		for (int s = 0; s < n_sources; s++)
			for (int64 i = sources[s].offsets[q]; i < sources[s].offsets[q + 1]; i++)
			{
				candidates[n].distance = sources[s].distances[i];
				candidates[n].target_id = sources[s].target_ids[i];
				n++;
			}
		qsort(candidates, n, sizeof(Candidate), compare_candidates);
		if (limit >= 0)
			n = Min(n, limit);
		if (n > PG_INT32_MAX)
			ereport(ERROR,
					(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
					 errmsg("knn_range_join: more than %d pairs for one query", PG_INT32_MAX),
					 errhint("Cap the pairs per query with k.")));
		for (int64 r = 0; r < n; r++)
		{
			Datum		values[4];
			bool		nulls[4] = {false, false, false, false};

			if (packed != NULL)
				knn_packed_put(packed, query_ids[q], candidates[r].target_id,
							   candidates[r].distance);
			else
			{
				values[0] = Int64GetDatum(query_ids[q]);
				values[1] = Int64GetDatum(candidates[r].target_id);
				values[2] = Int32GetDatum((int32) (r + 1));
				values[3] = Float8GetDatum(candidates[r].distance);
				tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
			}
			if (++emitted % MERGE_SLICE == 0)
				CHECK_FOR_INTERRUPTS();
		}
	}
	pfree(candidates);
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
					 ",\"rows\":" INT64_FORMAT ",\"shards\":[", n_queries, k, summary->rows);
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
	appendStringInfo(&buf, "],\"fallback\":[%s],\"local\":", fallbacks ? fallbacks : "");
	if (summary->local_targets > 0)
		appendStringInfo(&buf, "{\"targets\":" INT64_FORMAT "}", summary->local_targets);
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

/* Plain memory of the backend: outlives every query, replaced by the next join. */
static char *last_stats = NULL;

void
knn_shard_set_last_stats(const char *json)
{
	char	   *copy = MemoryContextStrdup(TopMemoryContext, json);

	if (last_stats != NULL)
		pfree(last_stats);
	last_stats = copy;
}

PG_FUNCTION_INFO_V1(knn_gpu_last_shard_stats);
Datum
knn_gpu_last_shard_stats(PG_FUNCTION_ARGS)
{
	if (last_stats == NULL)
		PG_RETURN_NULL();
	PG_RETURN_TEXT_P(cstring_to_text(last_stats));
}
