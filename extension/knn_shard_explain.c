/*
 * knn_shard_explain.c -- how a sharded join shows in EXPLAIN (knn_shard.h),
 * for knn_join's "KNN Join Function" node and the KNN Join node alike:
 *
 *     Shard: shard1 (items_1, items_3)
 *       Remote SQL: SELECT ...
 *       Shard Rows: 570  Shard Time: 12.345 ms      (ANALYZE)
 *     Shard Merge: 1140 rows  Ship Time: ...         (ANALYZE)
 *
 * In the structured formats a "Shards" list of objects, and the merge's
 * properties beside it.
 */
#include "postgres.h"

#include "commands/explain.h"
#include "lib/stringinfo.h"

#include "knn_shard.h"

void
knn_shard_summarize(KnnShardSummary *summary, const KnnShardPlan *sp)
{
	memset(summary, 0, sizeof(*summary));
	summary->seconds_queries = -1.0;
	summary->n_shards = sp->n_shards;
	summary->read_here = sp->read_here;
	summary->shards = palloc0(Max(sp->n_shards, 1) * sizeof(KnnShardSummaryShard));
	for (int s = 0; s < sp->n_shards; s++)
	{
		const KnnShardRemote *shard = sp->shards[s];
		KnnShardSummaryShard *out = &summary->shards[s];
		StringInfoData partitions;
		ListCell   *lc;

		initStringInfo(&partitions);
		foreach(lc, shard->scans)
		{
			KnnShardScan *scan = lfirst(lc);

			appendStringInfo(&partitions, "%s%s", partitions.len > 0 ? ", " : "",
							 scan->relation ? scan->relation : "?");
		}
		out->server = pstrdup(shard->server->servername);
		out->partitions = partitions.data;
		out->remote_sql = shard->join_sql ? pstrdup(shard->join_sql) : NULL;
		out->rows = shard->rows;
		out->seconds_ship = shard->seconds_ship;
		out->seconds_join = shard->seconds_join;
		out->seconds_read = shard->read_ahead ? shard->seconds_read : -1.0;
		out->targets_read = shard->prefetched_rows;
	}
}

static char *
copy_text(const char *text)
{
	return text != NULL ? pstrdup(text) : NULL;
}

KnnShardSummary *
knn_shard_summary_copy(const KnnShardSummary *summary, MemoryContext context)
{
	MemoryContext old = MemoryContextSwitchTo(context);
	KnnShardSummary *copy = palloc(sizeof(KnnShardSummary));

	*copy = *summary;
	copy->read_here = copy_text(summary->read_here);
	copy->shards = palloc0(Max(summary->n_shards, 1) * sizeof(KnnShardSummaryShard));
	for (int s = 0; s < summary->n_shards; s++)
	{
		copy->shards[s] = summary->shards[s];
		copy->shards[s].server = copy_text(summary->shards[s].server);
		copy->shards[s].partitions = copy_text(summary->shards[s].partitions);
		copy->shards[s].remote_sql = copy_text(summary->shards[s].remote_sql);
	}
	MemoryContextSwitchTo(old);
	return copy;
}

void
knn_shard_explain(const KnnShardSummary *summary, ExplainState *es)
{
	bool		text = es->format == EXPLAIN_FORMAT_TEXT;

	if (summary == NULL || (summary->n_shards == 0 && summary->read_here == NULL))
		return;
	ExplainOpenGroup("Shards", "Shards", false, es);
	for (int s = 0; s < summary->n_shards; s++)
	{
		const KnnShardSummaryShard *shard = &summary->shards[s];

		ExplainOpenGroup("Shard", NULL, true, es);
		if (text)
		{
			/* (PostgreSQL 15 does not export its ExplainIndentText) */
			appendStringInfoSpaces(es->str, es->indent * 2);
			appendStringInfo(es->str, "Shard: %s (%s)\n", shard->server, shard->partitions);
			es->indent++;
		}
		else
		{
			ExplainPropertyText("Server", shard->server, es);
			ExplainPropertyText("Partitions", shard->partitions, es);
		}
		if (shard->remote_sql != NULL)
			ExplainPropertyText("Remote SQL", shard->remote_sql, es);
		if (summary->ran && es->analyze)
		{
			ExplainPropertyInteger("Shard Rows", NULL, shard->rows, es);
			if (es->timing)
				ExplainPropertyFloat("Shard Time", "ms", shard->seconds_join * 1000.0, 3, es);
			/* its targets read while the queries were read here */
			if (es->timing && shard->seconds_read >= 0.0)
				ExplainPropertyFloat("Shard Target Read Time", "ms", shard->seconds_read * 1000.0, 3, es);
		}
		if (text)
			es->indent--;
		ExplainCloseGroup("Shard", NULL, true, es);
	}
	ExplainCloseGroup("Shards", "Shards", false, es);
	if (summary->read_here != NULL)
		ExplainPropertyText("Servers Read Here", summary->read_here, es);
	if (summary->ran && es->analyze)
	{
		ExplainPropertyInteger("Shard Merge Rows", NULL, summary->rows, es);
		ExplainPropertyInteger("Targets Joined Here", NULL, summary->local_targets, es);
		/* a self-join's query rows fetched from the shards that read them */
		if (summary->queries_from_shards)
			ExplainPropertyBool("Queries From Shards", true, es);
		if (summary->queries_relayed)
			ExplainPropertyBool("Queries Relayed", true, es);
		if (es->timing)
		{
			if (summary->seconds_queries >= 0.0)
			{
				ExplainPropertyFloat("Query Read Time", "ms", summary->seconds_queries * 1000.0, 3, es);
				ExplainPropertyFloat("Target Read Wait Time", "ms",
									 summary->seconds_prefetch_wait * 1000.0, 3, es);
			}
			ExplainPropertyFloat("Ship Time", "ms", summary->seconds_ship * 1000.0, 3, es);
			ExplainPropertyFloat("Local Join Time", "ms", summary->seconds_local * 1000.0, 3, es);
			ExplainPropertyFloat("Shard Merge Time", "ms", summary->seconds_merge * 1000.0, 3, es);
		}
	}
}
