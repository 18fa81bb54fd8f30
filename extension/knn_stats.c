/*
 * knn_stats.c -- the join record (knn_stats.h): built here from one call,
 * shown as JSON by knn_gpu_last_stats() and as EXPLAIN ANALYZE lines.
 */
#include "postgres.h"

#include "fmgr.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/json.h"

#include "knn_role_visibility.h"
#include "knn_stats.h"
#include "knn_vocabulary.h"

/*
 * The last join of this backend (plain memory: outlives every query), and
 * the role it ran as: shown only to roles that may see that role's joins.
 */
static bool last_valid = false;
static KnnJoinRecord last;
static Oid	last_role = InvalidOid;

void
knn_stats_record(KnnJoinRecord *record, const KnnProblem *problem, const KnnStats *engine,
				 double seconds_read, double seconds_sort, double seconds_return)
{
	memset(record, 0, sizeof(*record));
	record->n_queries = problem->n_queries;
	record->n_targets = problem->n_targets;
	record->dim = problem->dim;
	record->k = problem->k;
	record->metric = problem->metric;
	record->element = problem->element;
	record->engine = *engine;
	record->seconds_read = seconds_read;
	record->seconds_sort = seconds_sort;
	record->seconds_return = seconds_return;
	record->admission = *knn_run_last_admission();
	last = *record;
	last_role = GetUserId();
	last_valid = true;
}

void
knn_stats_set_return(KnnJoinRecord *record, double seconds_return)
{
	if (last_valid && memcmp(&last, record, sizeof(last)) == 0)
		last.seconds_return = seconds_return;
	record->seconds_return = seconds_return;
}

static void
append_json_string(StringInfo buf, const char *key, const char *value)
{
	escape_json(buf, key);
	appendStringInfoChar(buf, ':');
	escape_json(buf, value);
	appendStringInfoChar(buf, ',');
}

static char *
record_json(const KnnJoinRecord *r)
{
	StringInfoData buf;
	const KnnStats *s = &r->engine;

	initStringInfo(&buf);
	appendStringInfoChar(&buf, '{');
	append_json_string(&buf, "engine", knn_device_name(s->device));
	append_json_string(&buf, "device", s->device_name);
	append_json_string(&buf, "method", knn_method_name(s->method));
	append_json_string(&buf, "variant", s->variant);
	append_json_string(&buf, "metric", knn_metric_name(r->metric));
	append_json_string(&buf, "element", knn_element_name(r->element));
	appendStringInfo(&buf,
					 "\"queries\":" INT64_FORMAT ",\"targets\":" INT64_FORMAT
					 ",\"dim\":%d,\"k\":%d"
					 ",\"query_clusters\":" INT64_FORMAT ",\"target_clusters\":" INT64_FORMAT
					 ",\"threads_per_query\":%d"
					 ",\"distance_computations\":" INT64_FORMAT ",\"pairs\":" INT64_FORMAT
					 ",\"computed_fraction\":%.6g",
					 r->n_queries, r->n_targets, r->dim, r->k,
					 s->query_clusters, s->target_clusters, s->threads_per_query,
					 s->distance_computations, s->pairs,
					 s->pairs > 0 ? (double) s->distance_computations / (double) s->pairs : 0.0);
	appendStringInfoString(&buf, ",\"gpus\":[");
	for (int i = 0; i < s->n_devices && i < KNN_MAX_DEVICES; i++)
		appendStringInfo(&buf, "%s{\"gpu\":%d,\"queries\":" INT64_FORMAT ",\"seconds\":%.6f}",
						 i > 0 ? "," : "", s->device_work[i].device,
						 s->device_work[i].queries, s->device_work[i].seconds);
	appendStringInfoChar(&buf, ']');
	if (r->admission.admitted)
		appendStringInfo(&buf,
						 ",\"admission\":{\"slot\":%d,\"max_gpu_jobs\":%d,\"queued\":%s"
						 ",\"gpu_memory_limit_mb\":" INT64_FORMAT "}",
						 r->admission.slot, r->admission.max_gpu_jobs,
						 r->admission.queued ? "true" : "false",
						 r->admission.gpu_memory_limit / (1024 * 1024));
	else
		appendStringInfoString(&buf, ",\"admission\":null");
	appendStringInfo(&buf,
					 ",\"seconds\":{\"queued\":%.6f,\"read\":%.6f,\"sort\":%.6f,\"transfer\":%.6f,\"cluster\":%.6f"
					 ",\"filter\":%.6f,\"select\":%.6f,\"engine_total\":%.6f,\"return\":%.6f}}",
					 r->admission.seconds_queued + s->seconds_queued,
					 r->seconds_read, r->seconds_sort, s->seconds_transfer, s->seconds_cluster,
					 s->seconds_filter, s->seconds_select, s->seconds_total,
					 r->seconds_return);
	return buf.data;
}

void
knn_stats_totals_add(KnnJoinTotals *totals, const KnnJoinRecord *record)
{
	KnnJoinRecord *sum = &totals->sum;
	const KnnStats *engine = &record->engine;
	const KnnAdmissionRecord *admission = &record->admission;
	bool		first = totals->runs == 0;

	if (!first)
	{
		totals->device_differs |= strcmp(sum->engine.device_name, engine->device_name) != 0;
		totals->variant_differs |= strcmp(sum->engine.variant, engine->variant) != 0;
	}
	totals->min_dim = first ? record->dim : Min(totals->min_dim, record->dim);
	totals->max_dim = first ? record->dim : Max(totals->max_dim, record->dim);
	if (engine->method >= 0 && engine->method <= KNN_METHOD_BRUTE)
		totals->method_runs[engine->method]++;
	if (admission->admitted)
	{
		totals->min_slot = totals->admitted == 0 ? admission->slot : Min(totals->min_slot, admission->slot);
		totals->max_slot = totals->admitted == 0 ? admission->slot : Max(totals->max_slot, admission->slot);
		totals->admitted++;
		totals->queued += admission->queued ? 1 : 0;
	}
	totals->runs++;

	knn_stats_add(&sum->engine, engine, first);
	/* the names are the last run's (the flags above say whether others differ) */
	sum->engine.device = engine->device;
	sum->engine.method = engine->method;
	memcpy(sum->engine.device_name, engine->device_name, sizeof(engine->device_name));
	memcpy(sum->engine.variant, engine->variant, sizeof(engine->variant));
	sum->n_queries = (first ? 0 : sum->n_queries) + record->n_queries;
	sum->n_targets = (first ? 0 : sum->n_targets) + record->n_targets;
	sum->dim = record->dim;
	sum->k = record->k;
	sum->metric = record->metric;
	sum->element = record->element;
	sum->seconds_read = (first ? 0.0 : sum->seconds_read) + record->seconds_read;
	sum->seconds_sort = (first ? 0.0 : sum->seconds_sort) + record->seconds_sort;
	sum->seconds_return = (first ? 0.0 : sum->seconds_return) + record->seconds_return;
	sum->admission.seconds_queued = (first ? 0.0 : sum->admission.seconds_queued) +
		admission->seconds_queued;
}

/* A name of one run: "(last call; others differ)" after it where the runs' differ. */
static void
explain_run_name(const char *label, const char *last, bool differs, ExplainState *es)
{
	ExplainPropertyText(label, differs ? psprintf("%s (last call; others differ)", last) : last, es);
}

/* A number of one run: "low to high" (text) where the runs' differ. */
static void
explain_run_number(const char *label, int64 low, int64 high, ExplainState *es)
{
	if (low == high)
		ExplainPropertyInteger(label, NULL, low, es);
	else
		ExplainPropertyText(label, psprintf(INT64_FORMAT " to " INT64_FORMAT, low, high), es);
}

/* "brute", or where the runs' methods differ "ti (2 calls), brute (1 call)". */
static void
explain_methods(const KnnJoinTotals *totals, ExplainState *es)
{
	StringInfoData text;
	int			kinds = 0;

	for (int m = 0; m <= KNN_METHOD_BRUTE; m++)
		kinds += totals->method_runs[m] > 0 ? 1 : 0;
	if (kinds <= 1)
	{
		ExplainPropertyText("Engine Method", knn_method_name(totals->sum.engine.method), es);
		return;
	}
	initStringInfo(&text);
	for (int m = 0; m <= KNN_METHOD_BRUTE; m++)
		if (totals->method_runs[m] > 0)
			appendStringInfo(&text, "%s%s (" INT64_FORMAT " call%s)", text.len > 0 ? ", " : "",
							 knn_method_name((KnnMethod) m), totals->method_runs[m],
							 totals->method_runs[m] == 1 ? "" : "s");
	ExplainPropertyText("Engine Method", text.data, es);
}

void
knn_stats_explain(const KnnJoinTotals *totals, ExplainState *es)
{
	const KnnJoinRecord *r = &totals->sum;
	const KnnStats *s = &r->engine;

	if (totals->runs == 0)
		return;
	if (totals->runs > 1)
		ExplainPropertyInteger("Engine Calls", NULL, totals->runs, es);
	explain_run_name("Engine Device", s->device_name, totals->device_differs, es);
	explain_methods(totals, es);
	if (s->variant[0] != '\0' || totals->variant_differs)
		explain_run_name("Engine Variant", s->variant, totals->variant_differs, es);
	ExplainPropertyInteger("Queries", NULL, r->n_queries, es);
	ExplainPropertyInteger("Targets", NULL, r->n_targets, es);
	explain_run_number("Dimensions", totals->min_dim, totals->max_dim, es);
	ExplainPropertyInteger("Distance Computations", NULL, s->distance_computations, es);
	ExplainPropertyInteger("Pairs", NULL, s->pairs, es);
	/* A join split across GPUs: each engine's GPU, rows and time. */
	if (s->n_devices > 1)
	{
		for (int i = 0; i < s->n_devices && i < KNN_MAX_DEVICES; i++)
		{
			const KnnDeviceWork *w = &s->device_work[i];
			char	   *line = psprintf("GPU %d, " INT64_FORMAT " queries", w->device, w->queries);

			if (es->timing)
				line = psprintf("%s, %.3f ms", line, w->seconds * 1000.0);
			ExplainPropertyText(psprintf("GPU Engine %d", i + 1), line, es);
		}
	}
	/* Only joins that took a GPU slot: others never queue. */
	if (totals->admitted > 0)
	{
		explain_run_number("GPU Slot", totals->min_slot, totals->max_slot, es);
		if (totals->queued == 0 || totals->queued == totals->admitted)
			ExplainPropertyText("GPU Slot Queued", totals->queued > 0 ? "yes" : "no", es);
		else
			ExplainPropertyText("GPU Slot Queued",
								psprintf(INT64_FORMAT " of " INT64_FORMAT " calls",
										 totals->queued, totals->admitted), es);
		if (es->timing)
			ExplainPropertyFloat("GPU Slot Wait", "ms",
								 r->admission.seconds_queued * 1000.0, 3, es);
	}
	/* Only joins that waited for a GPU context permit (knn_gpu.max_gpu_contexts). */
	if (es->timing && s->seconds_queued > 0)
		ExplainPropertyFloat("GPU Context Wait", "ms", s->seconds_queued * 1000.0, 3, es);
	if (es->timing)
	{
		ExplainPropertyFloat("Read Time", "ms", r->seconds_read * 1000.0, 3, es);
		ExplainPropertyFloat("Cluster Time", "ms", s->seconds_cluster * 1000.0, 3, es);
		ExplainPropertyFloat("Filter Time", "ms", s->seconds_filter * 1000.0, 3, es);
		ExplainPropertyFloat("Select Time", "ms", s->seconds_select * 1000.0, 3, es);
		ExplainPropertyFloat("Transfer Time", "ms", s->seconds_transfer * 1000.0, 3, es);
		ExplainPropertyFloat("Engine Time", "ms", s->seconds_total * 1000.0, 3, es);
	}
}

/*
 * The last join's record, or NULL: none ran, or another role ran it that
 * the current one may not see (its row counts, times and methods tell of
 * that role's data), as if none had run.
 */
PG_FUNCTION_INFO_V1(knn_gpu_last_stats);
Datum
knn_gpu_last_stats(PG_FUNCTION_ARGS)
{
	if (!last_valid || !knn_role_may_see_join_of(last_role))
		PG_RETURN_NULL();
	PG_RETURN_TEXT_P(cstring_to_text(record_json(&last)));
}

/* Adds one batch's engine statistics to the join's (the first batch's names). */
void
knn_stats_add(KnnStats *total, const KnnStats *batch, bool first)
{
	if (first)
	{
		*total = *batch;
		return;
	}
	total->query_clusters += batch->query_clusters;
	total->target_clusters += batch->target_clusters;
	total->distance_computations += batch->distance_computations;
	total->pairs += batch->pairs;
	total->seconds_transfer += batch->seconds_transfer;
	total->seconds_cluster += batch->seconds_cluster;
	total->seconds_filter += batch->seconds_filter;
	total->seconds_select += batch->seconds_select;
	total->seconds_total += batch->seconds_total;
	total->seconds_queued += batch->seconds_queued;
	/*
	 * Each engine's share added to the same engine's: the one at the same
	 * place on the same GPU (knn_gpu.devices = '0,0' runs two on one GPU),
	 * else the first on that GPU, else a new entry.
	 */
	for (int b = 0; b < batch->n_devices && b < KNN_MAX_DEVICES; b++)
	{
		const KnnDeviceWork *work = &batch->device_work[b];
		int			i = 0;

		if (b < total->n_devices && total->device_work[b].device == work->device)
			i = b;
		else
			while (i < total->n_devices && total->device_work[i].device != work->device)
				i++;
		if (i == total->n_devices && i < KNN_MAX_DEVICES)
		{
			total->device_work[i] = *work;
			total->n_devices++;
		}
		else if (i < total->n_devices)
		{
			total->device_work[i].queries += work->queries;
			total->device_work[i].seconds += work->seconds;
		}
	}
}
