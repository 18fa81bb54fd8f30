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

/*
 * The pairs of one batch: a file's (the batch's, or a group of its query
 * rows' split from it), or (none in files: one batch of all queries) those
 * held.
 */
typedef struct BatchPairs
{
	const SpillPair *held;		/* NULL: the file's */
	int64		n_held;
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
	if (b->held != NULL)
	{
		if (b->next == b->n_held)
			return false;
		*pair = b->held[b->next++];
		return true;
	}
	return b->file != NULL && spill_get(b->file, pair);
}

/* What the merge of one batch's chunks needs. */
typedef struct SpillMerge
{
	Spill	   *spill;
	ReturnSetInfo *rsinfo;
	int64		k;
	KnnPackedRows *packed;
	int			n_sources;
	KnnShardLists *sources;
	int64	  **counts;			/* per source, per query row of the batch: its pairs */
	int64	  **fill;
	int64		first;			/* the batch's first query row */
	int64		rows;			/* returned so far */
} SpillMerge;

/*
 * Merges the batch's query rows [r0, r1), whose pairs `input` holds (and
 * maybe others'): each source's pairs of each query in the order they
 * came, into the lists, merged into the result.
 */
static void
merge_chunk(SpillMerge *m, BatchPairs *input, int64 r0, int64 r1)
{
	KnnShardLists *sources = m->sources;
	SpillPair	pair;
	int64		read = 0;

	for (int s = 0; s < m->n_sources; s++)
	{
		int64		total = 0;

		sources[s].n_queries = r1 - r0;
		sources[s].offsets = palloc_extended((r1 - r0 + 1) * sizeof(int64), MCXT_ALLOC_HUGE);
		sources[s].offsets[0] = 0;
		for (int64 q = r0; q < r1; q++)
			sources[s].offsets[q - r0 + 1] = (total += m->counts[s][q]);
		sources[s].target_ids = palloc_extended(Max(total, 1) * sizeof(int64), MCXT_ALLOC_HUGE);
		sources[s].distances = palloc_extended(Max(total, 1) * sizeof(double), MCXT_ALLOC_HUGE);
		m->fill[s] = palloc_extended((r1 - r0) * sizeof(int64), MCXT_ALLOC_HUGE);
		memcpy(m->fill[s], sources[s].offsets, (r1 - r0) * sizeof(int64));
	}
	batch_rewind(input);
	while (batch_next(input, &pair))
	{
		if (pair.row >= r0 && pair.row < r1)
		{
			int64		at = m->fill[pair.source][pair.row - r0]++;

			sources[pair.source].target_ids[at] = pair.target_id;
			sources[pair.source].distances[at] = pair.distance;
		}
		if (++read % 65536 == 0)
			CHECK_FOR_INTERRUPTS();
	}
	m->rows += knn_shard_merge(m->rsinfo, m->spill->queries->ids + m->first + r0, r1 - r0,
							   sources, m->n_sources, m->k, m->packed, NULL);
	for (int s = 0; s < m->n_sources; s++)
	{
		pfree(sources[s].offsets);
		pfree(sources[s].target_ids);
		pfree(sources[s].distances);
		pfree(m->fill[s]);
	}
}

/*
 * Merges the chunks c0 .. c1 - 1 of a batch (chunk c: its query rows up to
 * ends[c], from ends[c - 1], or r0 for c0), whose pairs `input` holds. One
 * chunk is read from it; several are first split into a file per group of
 * chunks (at most SPILL_MAX_FILES groups, in one read of input, each
 * pair's order kept), each group merged the same way: a pair is read a
 * few times (once per level), not once per chunk of its batch (a batch of
 * many chunks, a small limit and millions of pairs, read its file again
 * for every chunk).
 */
static void
merge_chunks(SpillMerge *m, BatchPairs *input, const int64 *ends, int64 c0, int64 c1, int64 r0)
{
	int64		n_chunks = c1 - c0;
	int			n_groups = (int) Min(n_chunks, SPILL_MAX_FILES);
	int64		rows = ends[c1 - 1] - r0;
	int32	   *group_of_row;
	BufFile   **files;
	SpillPair	pair;
	int64		read = 0;

	if (n_chunks == 1)
	{
		merge_chunk(m, input, r0, ends[c0]);
		return;
	}
	/* group g: chunks c0 + g * n_chunks / n_groups up to the next group's */
	group_of_row = palloc_extended(rows * sizeof(int32), MCXT_ALLOC_HUGE);
	for (int g = 0, row = 0; g < n_groups; g++)
	{
		int64		end = ends[c0 + (g + 1) * n_chunks / n_groups - 1] - r0;

		for (; row < end; row++)
			group_of_row[row] = g;
	}
	files = palloc0(n_groups * sizeof(BufFile *));
	batch_rewind(input);
	while (batch_next(input, &pair))
	{
		if (pair.row >= r0 && pair.row < r0 + rows)
		{
			int			g = group_of_row[pair.row - r0];

			if (files[g] == NULL)
				files[g] = BufFileCreateTemp(false);
			BufFileWrite(files[g], &pair, sizeof(pair));
		}
		if (++read % 65536 == 0)
			CHECK_FOR_INTERRUPTS();
	}
	pfree(group_of_row);
	for (int g = 0; g < n_groups; g++)
	{
		int64		g0 = c0 + g * n_chunks / n_groups;
		int64		g1 = c0 + (g + 1) * n_chunks / n_groups;
		BatchPairs	group = {NULL, 0, files[g], 0};

		merge_chunks(m, &group, ends, g0, g1, g0 == c0 ? r0 : ends[g0 - 1]);
		if (files[g] != NULL)
			BufFileClose(files[g]);
		files[g] = NULL;
	}
	pfree(files);
}

/*
 * The merge of a spilled join into the tuplestore (or packed), batch by
 * batch: each source's pairs per query counted first (a shard's more than
 * k is an ERROR), then the batch's query rows in chunks whose pairs fit
 * the limit (16 bytes a pair in the lists, 16 in the merge; pairs held in
 * memory took at most half of it, and a chunk of them at most the other
 * half): one chunk unless the batch holds more than its share (the
 * batches are at most SPILL_MAX_FILES, k is only a bound), several read
 * from files of their own (merge_chunks). Each chunk's lists are each
 * source's pairs of its queries in the order they came.
 */
int64
knn_shard_spill_merge(Spill *spill, ReturnSetInfo *rsinfo, int64 k, KnnPackedRows *packed)
{
	int64		budget = Max(knn_result_memory_bytes() / 32, 1);
	bool		in_files = knn_shard_spill_in_files(spill);
	SpillMerge	m;

	m.spill = spill;
	m.rsinfo = rsinfo;
	m.k = k;
	m.packed = packed;
	m.n_sources = spill->n_shards + 1;
	m.sources = palloc0(m.n_sources * sizeof(KnnShardLists));
	m.counts = palloc(m.n_sources * sizeof(int64 *));
	m.fill = palloc(m.n_sources * sizeof(int64 *));
	m.rows = 0;
	for (int64 b = 0; b < (in_files ? spill->n_batches : 1); b++)
	{
		int64		n = in_files ? Min(spill->per_run, spill->queries->n - b * spill->per_run) :
			spill->queries->n;
		BatchPairs	batch = {in_files ? NULL : spill->held, spill->n_held,
		in_files ? spill->files[b] : NULL, 0};
		SpillPair	pair;
		int64	   *ends = palloc_extended(Max(n, 1) * sizeof(int64), MCXT_ALLOC_HUGE);
		int64		n_chunks = 0;

		m.first = in_files ? b * spill->per_run : 0;
		for (int s = 0; s < m.n_sources; s++)
			m.counts[s] = palloc_extended(Max(n, 1) * sizeof(int64), MCXT_ALLOC_HUGE | MCXT_ALLOC_ZERO);
		{
			int64		counted = 0;

			batch_rewind(&batch);
			while (batch_next(&batch, &pair))
			{
				m.counts[pair.source][pair.row]++;
				if (++counted % 65536 == 0)
					CHECK_FOR_INTERRUPTS();
			}
		}
		for (int s = 0; s < spill->n_shards && k >= 0; s++)
			for (int64 q = 0; q < n; q++)
				if (m.counts[s][q] > k)
					ereport(ERROR,
							(errcode(ERRCODE_FDW_INVALID_DATA_TYPE),
							 errmsg("%s on foreign server \"%s\" returned more than k pairs for a query",
									spill->shards[s]->who, spill->shards[s]->server->servername)));
		/* the chunks: at least one query row each, then as many as fit */
		for (int64 r0 = 0, r1; r0 < n; r0 = r1)
		{
			int64		pairs = 0;

			for (r1 = r0; r1 < n; r1++)
			{
				int64		row_pairs = 0;

				for (int s = 0; s < m.n_sources; s++)
					row_pairs += m.counts[s][r1];
				if (r1 > r0 && pairs + row_pairs > budget)
					break;
				pairs += row_pairs;
			}
			ends[n_chunks++] = r1;
		}
		if (n_chunks > 0)
			merge_chunks(&m, &batch, ends, 0, n_chunks, 0);
		pfree(ends);
		for (int s = 0; s < m.n_sources; s++)
			pfree(m.counts[s]);
		if (batch.file != NULL)
			BufFileClose(batch.file);
		if (in_files)
			spill->files[b] = NULL;
	}
	pfree(m.sources);
	pfree(m.counts);
	pfree(m.fill);
	return m.rows;
}
