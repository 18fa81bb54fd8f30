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
 * properties beside it. A node that joined more than once shows the sums
 * of its calls (knn_shard_summary_add), after "Sharded Calls: N".
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

/* Seconds of a phase that may be unknown (-1) in either: known ones add up. */
static double
add_known_seconds(double total, double seconds)
{
	if (seconds < 0.0)
		return total;
	return total < 0.0 ? seconds : total + seconds;
}

/* A call's shard added to the same shard of the sum (its rows and times). */
static void
add_shard(KnnShardSummaryShard *total, const KnnShardSummaryShard *shard)
{
	total->rows += shard->rows;
	total->seconds_ship += shard->seconds_ship;
	total->seconds_join += shard->seconds_join;
	total->seconds_read = add_known_seconds(total->seconds_read, shard->seconds_read);
	total->targets_read += shard->targets_read;
	/* the last call's (a knn_join call's names its own temporary table) */
	if (shard->remote_sql != NULL &&
		(total->remote_sql == NULL || strcmp(total->remote_sql, shard->remote_sql) != 0))
	{
		if (total->remote_sql != NULL)
			pfree(total->remote_sql);
		total->remote_sql = copy_text(shard->remote_sql);
	}
}

KnnShardSummary *
knn_shard_summary_add(KnnShardSummary *total, const KnnShardSummary *summary,
					  MemoryContext context)
{
	MemoryContext old = MemoryContextSwitchTo(context);

	if (total == NULL)
	{
		total = palloc(sizeof(KnnShardSummary));
		*total = *summary;
		total->calls = 1;
		total->read_here = copy_text(summary->read_here);
		total->shards = palloc0(Max(summary->n_shards, 1) * sizeof(KnnShardSummaryShard));
		for (int s = 0; s < summary->n_shards; s++)
		{
			total->shards[s] = summary->shards[s];
			total->shards[s].server = copy_text(summary->shards[s].server);
			total->shards[s].partitions = copy_text(summary->shards[s].partitions);
			total->shards[s].remote_sql = copy_text(summary->shards[s].remote_sql);
		}
		MemoryContextSwitchTo(old);
		return total;
	}

	total->calls++;
	/* each shard to the shard of the same server and partitions, or after them */
	for (int s = 0; s < summary->n_shards; s++)
	{
		const KnnShardSummaryShard *shard = &summary->shards[s];
		int			t = 0;

		while (t < total->n_shards &&
			   !(strcmp(total->shards[t].server, shard->server) == 0 &&
				 strcmp(total->shards[t].partitions, shard->partitions) == 0))
			t++;
		if (t == total->n_shards)
		{
			total->shards = repalloc(total->shards, (t + 1) * sizeof(KnnShardSummaryShard));
			total->shards[t] = *shard;
			total->shards[t].server = copy_text(shard->server);
			total->shards[t].partitions = copy_text(shard->partitions);
			total->shards[t].remote_sql = copy_text(shard->remote_sql);
			total->n_shards++;
		}
		else
			add_shard(&total->shards[t], shard);
	}
	if (summary->read_here != NULL)
	{
		if (total->read_here != NULL)
			pfree(total->read_here);
		total->read_here = copy_text(summary->read_here);
	}
	total->ran |= summary->ran;
	total->local_targets += summary->local_targets;
	total->local_after |= summary->local_after;
	total->rows += summary->rows;
	total->merge_batches += summary->merge_batches;
	total->seconds_queries = add_known_seconds(total->seconds_queries, summary->seconds_queries);
	total->queries_from_shards |= summary->queries_from_shards;
	total->queries_relayed |= summary->queries_relayed;
	total->queries_streamed |= summary->queries_streamed;
	total->seconds_prefetch_wait += summary->seconds_prefetch_wait;
	total->seconds_ship += summary->seconds_ship;
	total->seconds_local += summary->seconds_local;
	total->seconds_merge += summary->seconds_merge;
	MemoryContextSwitchTo(old);
	return total;
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
		/* (the figures are the sums of these calls, as knn_stats_explain's) */
		if (summary->calls > 1)
			ExplainPropertyInteger("Sharded Calls", NULL, summary->calls, es);
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
