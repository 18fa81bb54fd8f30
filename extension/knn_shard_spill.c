/*
 * knn_shard_spill.c -- a sharded join's lists past
 * knn_gpu.max_result_memory: in memory while they fit, then in temporary
 * files per batch of queries.
 */
#include "postgres.h"

#include "miscadmin.h"

#include "knn_settings.h"
#include "knn_shard_spill.h"

/* The most batches (temporary files, each with its buffer) of a spilled join. */
#define SPILL_MAX_FILES 256

/* One pair: in memory its query's row, in a batch's file its row in the batch. */
typedef struct SpillPair
{
	int64		row;
	int64		target_id;
	double		distance;
	int32		source;
} SpillPair;

Spill *
knn_shard_spill_begin(const KnnMatrix *queries, int64 per_run, int n_shards,
					  KnnShardRemote **shards, bool together)
{
	Spill	   *spill = palloc0(sizeof(Spill));

	spill->queries = queries;
	/* k is only a bound: few files, a batch past the limit merged in chunks */
	spill->per_run = Max(per_run, (queries->n + SPILL_MAX_FILES - 1) / SPILL_MAX_FILES);
	spill->n_batches = (queries->n + spill->per_run - 1) / spill->per_run;
	spill->files = palloc0(spill->n_batches * sizeof(BufFile *));
	spill->max_held = Max(knn_result_memory_bytes() / 2 / (int64) sizeof(SpillPair), 1);
	spill->held_capacity = Min(spill->max_held, 1024);
	spill->held = palloc_extended(spill->held_capacity * sizeof(SpillPair), MCXT_ALLOC_HUGE);
	spill->together = together;
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

bool
knn_shard_spill_in_files(const Spill *spill)
{
	return spill->held == NULL;
}

/* A pair of query row `row` into its batch's file. */
static void
write_pair(Spill *spill, SpillPair *pair)
{
	int64		batch = pair->row / spill->per_run;

	pair->row -= batch * spill->per_run;
	if (spill->files[batch] == NULL)
		spill->files[batch] = BufFileCreateTemp(false);
	BufFileWrite(spill->files[batch], pair, sizeof(*pair));
}

/* The pairs held pass the limit: they go into the files, in the order they came, and all after them. */
static void
move_held_to_files(Spill *spill)
{
	for (int64 i = 0; i < spill->n_held; i++)
	{
		write_pair(spill, &spill->held[i]);
		if ((i & 65535) == 65535)
			CHECK_FOR_INTERRUPTS();
	}
	pfree(spill->held);
	spill->held = NULL;
	spill->n_held = 0;
}

void
knn_shard_spill_put(Spill *spill, int source, int64 row, int64 target_id, double distance)
{
	SpillPair	pair;

	memset(&pair, 0, sizeof(pair));
	pair.row = row;
	pair.target_id = target_id;
	pair.distance = distance;
	pair.source = source;
	/* a batch of the local part writes up to knn_gpu.max_result_memory of pairs in one loop */
	if (++spill->pairs[source] % 65536 == 0)
		CHECK_FOR_INTERRUPTS();
	if (spill->held != NULL && spill->n_held == spill->held_capacity)
	{
		if (spill->held_capacity == spill->max_held)
			move_held_to_files(spill);
		else
		{
			spill->held_capacity = Min(spill->held_capacity * 2, spill->max_held);
			spill->held = repalloc_huge(spill->held, spill->held_capacity * sizeof(SpillPair));
		}
	}
	if (spill->held != NULL)
		spill->held[spill->n_held++] = pair;
	else
		write_pair(spill, &pair);
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

/* The pairs of one batch: its file's, or (none in files: one batch of all queries) those held. */
typedef struct BatchPairs
{
	const Spill *spill;
	BufFile    *file;
	int64		next;			/* of those held */
} BatchPairs;

static void
batch_rewind(BatchPairs *b)
{
	if (b->file != NULL)
		spill_rewind(b->file);
	b->next = 0;
}

static bool
batch_next(BatchPairs *b, SpillPair *pair)
{
	if (b->spill->held != NULL)
	{
		if (b->next == b->spill->n_held)
			return false;
		*pair = b->spill->held[b->next++];
		return true;
	}
	return b->file != NULL && spill_get(b->file, pair);
}

/*
 * The merge of a spilled join into the tuplestore (or packed), batch by
 * batch: each source's pairs per query counted first (a shard's more than
 * k is an ERROR), then the batch's query rows in chunks whose pairs fit
 * the limit (16 bytes a pair in the lists, 16 in the merge; pairs held in
 * memory took at most half of it, and a chunk of them at most the other
 * half), the file read once per chunk: once, unless the batch holds more
 * than its share (the batches are at most SPILL_MAX_FILES, k is only a
 * bound). Each chunk's lists are each source's pairs of its queries in the
 * order they came.
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
	bool		in_files = knn_shard_spill_in_files(spill);

	for (int64 b = 0; b < (in_files ? spill->n_batches : 1); b++)
	{
		int64		first = in_files ? b * spill->per_run : 0;
		int64		n = in_files ? Min(spill->per_run, spill->queries->n - first) : spill->queries->n;
		BatchPairs	batch = {spill, in_files ? spill->files[b] : NULL, 0};
		SpillPair	pair;

		for (int s = 0; s < n_sources; s++)
			counts[s] = palloc_extended(Max(n, 1) * sizeof(int64), MCXT_ALLOC_HUGE | MCXT_ALLOC_ZERO);
		{
			int64		counted = 0;

			batch_rewind(&batch);
			while (batch_next(&batch, &pair))
			{
				counts[pair.source][pair.row]++;
				if (++counted % 65536 == 0)
					CHECK_FOR_INTERRUPTS();
			}
		}
		for (int s = 0; s < spill->n_shards && k >= 0; s++)
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
			batch_rewind(&batch);
			while (batch_next(&batch, &pair))
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
		if (batch.file != NULL)
			BufFileClose(batch.file);
		if (in_files)
			spill->files[b] = NULL;
	}
	pfree(sources);
	pfree(counts);
	pfree(fill);
	return rows;
}

