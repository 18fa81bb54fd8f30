/*
 * knn_shard_spill.c -- a sharded knn_join's lists past
 * knn_gpu.max_result_memory, in temporary files per batch of queries.
 */
#include "postgres.h"

#include "miscadmin.h"

#include "knn_settings.h"
#include "knn_shard_spill.h"

/* The most batches (temporary files, each with its buffer) of a spilled join. */
#define SPILL_MAX_FILES 256

Spill *
knn_shard_spill_begin(const KnnMatrix *queries, int64 per_run, int n_shards,
					  KnnShardRemote **shards)
{
	Spill	   *spill = palloc0(sizeof(Spill));

	spill->queries = queries;
	/* k is only a bound: few files, a batch past the limit merged in chunks */
	spill->per_run = Max(per_run, (queries->n + SPILL_MAX_FILES - 1) / SPILL_MAX_FILES);
	spill->n_batches = (queries->n + spill->per_run - 1) / spill->per_run;
	spill->files = palloc0(spill->n_batches * sizeof(BufFile *));
	spill->n_shards = n_shards;
	spill->shards = shards;
	spill->pairs = palloc0((n_shards + 1) * sizeof(int64));
	spill->last_row = palloc((n_shards + 1) * sizeof(int64));
	spill->done = palloc((n_shards + 1) * sizeof(uint8 *));
	for (int s = 0; s <= n_shards; s++)
	{
		spill->last_row[s] = -1;
		spill->done[s] = palloc_extended(queries->n / 8 + 1, MCXT_ALLOC_HUGE | MCXT_ALLOC_ZERO);
	}
	return spill;
}

/* One pair in a batch's file. */
typedef struct SpillPair
{
	int64		row;			/* the query's row in its batch */
	int64		target_id;
	double		distance;
	int32		source;
} SpillPair;

void
knn_shard_spill_put(Spill *spill, int source, int64 row, int64 target_id, double distance)
{
	int64		batch = row / spill->per_run;
	SpillPair	pair;

	memset(&pair, 0, sizeof(pair));
	pair.row = row - batch * spill->per_run;
	pair.target_id = target_id;
	pair.distance = distance;
	pair.source = source;
	if (spill->files[batch] == NULL)
		spill->files[batch] = BufFileCreateTemp(false);
	BufFileWrite(spill->files[batch], &pair, sizeof(pair));
	/* a batch of the local part writes up to knn_gpu.max_result_memory of pairs in one loop */
	if (++spill->pairs[source] % 65536 == 0)
		CHECK_FOR_INTERRUPTS();
}

/* Reads the next pair of a batch's file; false at its end. */
static bool
spill_get(BufFile *file, SpillPair *pair)
{
	size_t		got = BufFileRead(file, pair, sizeof(*pair));

	if (got == 0)
		return false;
	if (got != sizeof(*pair))
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("could not read from a temporary file of a sharded join")));
	return true;
}

static void
spill_rewind(BufFile *file)
{
	if (BufFileSeek(file, 0, 0, SEEK_SET) != 0)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("could not seek in a temporary file of a sharded join")));
}

/*
 * The merge of a spilled join into the tuplestore (or packed), batch by
 * batch: each source's pairs per query counted first (a shard's more than
 * k is an ERROR), then the batch's query rows in chunks whose pairs fit
 * the limit (16 bytes a pair in the lists, 16 in the merge), the file read
 * once per chunk: once, unless the batch holds more than its share (the
 * batches are at most SPILL_MAX_FILES, k is only a bound). Each chunk's
 * lists are each source's pairs of its queries in the order they came.
 */
int64
knn_shard_spill_merge(Spill *spill, ReturnSetInfo *rsinfo, int64 k, KnnPackedRows *packed)
{
	int			n_sources = spill->n_shards + 1;
	int64		budget = Max(knn_result_memory_bytes() / 32, 1);
	KnnShardLists *sources = palloc0(n_sources * sizeof(KnnShardLists));
	int64	  **counts = palloc(n_sources * sizeof(int64 *));
	int64	  **fill = palloc(n_sources * sizeof(int64 *));
	int64		rows = 0;

	for (int64 b = 0; b < spill->n_batches; b++)
	{
		int64		first = b * spill->per_run;
		int64		n = Min(spill->per_run, spill->queries->n - first);
		BufFile    *file = spill->files[b];
		SpillPair	pair;

		for (int s = 0; s < n_sources; s++)
			counts[s] = palloc_extended(Max(n, 1) * sizeof(int64), MCXT_ALLOC_HUGE | MCXT_ALLOC_ZERO);
		if (file != NULL)
		{
			int64		counted = 0;

			spill_rewind(file);
			while (spill_get(file, &pair))
			{
				counts[pair.source][pair.row]++;
				if (++counted % 65536 == 0)
					CHECK_FOR_INTERRUPTS();
			}
		}
		for (int s = 0; s < spill->n_shards; s++)
			for (int64 q = 0; q < n; q++)
				if (counts[s][q] > k)
					ereport(ERROR,
							(errcode(ERRCODE_FDW_INVALID_DATA_TYPE),
							 errmsg("%s on foreign server \"%s\" returned more than k pairs for a query",
									spill->shards[s]->who, spill->shards[s]->server->servername)));
		for (int64 r0 = 0, r1; r0 < n; r0 = r1)
		{
			int64		pairs = 0;
			int64		read = 0;

			/* at least one query row, then as many as fit */
			for (r1 = r0; r1 < n; r1++)
			{
				int64		row_pairs = 0;

				for (int s = 0; s < n_sources; s++)
					row_pairs += counts[s][r1];
				if (r1 > r0 && pairs + row_pairs > budget)
					break;
				pairs += row_pairs;
			}
			for (int s = 0; s < n_sources; s++)
			{
				int64		total = 0;

				sources[s].n_queries = r1 - r0;
				sources[s].offsets = palloc_extended((r1 - r0 + 1) * sizeof(int64), MCXT_ALLOC_HUGE);
				sources[s].offsets[0] = 0;
				for (int64 q = r0; q < r1; q++)
					sources[s].offsets[q - r0 + 1] = (total += counts[s][q]);
				sources[s].target_ids = palloc_extended(Max(total, 1) * sizeof(int64), MCXT_ALLOC_HUGE);
				sources[s].distances = palloc_extended(Max(total, 1) * sizeof(double), MCXT_ALLOC_HUGE);
				fill[s] = palloc_extended((r1 - r0) * sizeof(int64), MCXT_ALLOC_HUGE);
				memcpy(fill[s], sources[s].offsets, (r1 - r0) * sizeof(int64));
			}
			if (file != NULL)
			{
				spill_rewind(file);
				while (spill_get(file, &pair))
				{
					if (pair.row >= r0 && pair.row < r1)
					{
						int64		at = fill[pair.source][pair.row - r0]++;

						sources[pair.source].target_ids[at] = pair.target_id;
						sources[pair.source].distances[at] = pair.distance;
					}
					if (++read % 65536 == 0)
						CHECK_FOR_INTERRUPTS();
				}
			}
			rows += knn_shard_merge(rsinfo, spill->queries->ids + first + r0, r1 - r0, sources,
									n_sources, k, packed, NULL);
			for (int s = 0; s < n_sources; s++)
			{
				pfree(sources[s].offsets);
				pfree(sources[s].target_ids);
				pfree(sources[s].distances);
				pfree(fill[s]);
			}
		}
		for (int s = 0; s < n_sources; s++)
			pfree(counts[s]);
		if (file != NULL)
			BufFileClose(file);
		spill->files[b] = NULL;
	}
	pfree(sources);
	pfree(counts);
	pfree(fill);
	return rows;
}

