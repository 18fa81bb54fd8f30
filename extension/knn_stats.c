/*
 * knn_stats.c -- the last join's statistics, as JSON for
 * knn_gpu_last_stats() and as lines for EXPLAIN ANALYZE.
 */
#include "postgres.h"

#include "fmgr.h"
#include "lib/stringinfo.h"
#include "utils/builtins.h"
#include "utils/json.h"

#include "knn_gpu.h"

/* The last join of this backend (plain memory: outlives every query). */
static struct
{
	bool		valid;
	KnnStats	stats;
	int64		n_queries;
	int64		n_targets;
	int32		dim;
	int32		k;
	KnnMetric	metric;
	double		seconds_read;
	double		seconds_return;
}			last;

void
knn_stats_remember(const KnnStats *stats, const KnnProblem *problem)
{
	last.valid = true;
	last.stats = *stats;
	last.n_queries = problem->n_queries;
	last.n_targets = problem->n_targets;
	last.dim = problem->dim;
	last.k = problem->k;
	last.metric = problem->metric;
	last.seconds_read = 0;
	last.seconds_return = 0;
}

void
knn_stats_set_sql_phases(double seconds_read, double seconds_return)
{
	last.seconds_read = seconds_read;
	last.seconds_return = seconds_return;
}

static void
append_json_string(StringInfo buf, const char *key, const char *value)
{
	escape_json(buf, key);
	appendStringInfoChar(buf, ':');
	escape_json(buf, value);
}

char *
knn_stats_last_json(void)
{
	StringInfoData buf;
	const KnnStats *s = &last.stats;

	if (!last.valid)
		return NULL;
	initStringInfo(&buf);
	appendStringInfoChar(&buf, '{');
	append_json_string(&buf, "device", s->device);
	appendStringInfoChar(&buf, ',');
	append_json_string(&buf, "method", s->method);
	appendStringInfoChar(&buf, ',');
	append_json_string(&buf, "variant", s->variant);
	appendStringInfoChar(&buf, ',');
	append_json_string(&buf, "metric", knn_metric_name(last.metric));
	appendStringInfo(&buf,
					 ",\"queries\":" INT64_FORMAT ",\"targets\":" INT64_FORMAT
					 ",\"dim\":%d,\"k\":%d"
					 ",\"query_clusters\":" INT64_FORMAT ",\"target_clusters\":" INT64_FORMAT
					 ",\"threads_per_query\":%d"
					 ",\"distance_computations\":" INT64_FORMAT ",\"pairs\":" INT64_FORMAT
					 ",\"computed_fraction\":%.6g",
					 last.n_queries, last.n_targets, last.dim, last.k,
					 s->query_clusters, s->target_clusters, s->threads_per_query,
					 s->distance_computations, s->pairs,
					 s->pairs > 0 ? (double) s->distance_computations / (double) s->pairs : 0.0);
	appendStringInfo(&buf,
					 ",\"seconds\":{\"read\":%.6f,\"transfer\":%.6f,\"cluster\":%.6f"
					 ",\"filter\":%.6f,\"select\":%.6f,\"engine_total\":%.6f,\"return\":%.6f}}",
					 last.seconds_read, s->seconds_transfer, s->seconds_cluster,
					 s->seconds_filter, s->seconds_select, s->seconds_total,
					 last.seconds_return);
	return buf.data;
}

PG_FUNCTION_INFO_V1(knn_gpu_last_stats);
Datum
knn_gpu_last_stats(PG_FUNCTION_ARGS)
{
	char	   *json = knn_stats_last_json();

	if (json == NULL)
		PG_RETURN_NULL();
	PG_RETURN_TEXT_P(cstring_to_text(json));
}
