/*
 * knn_shard_relay.c -- a sharded self-join's held blocks kept to be sent
 * on unchanged (knn_shard_relay.h).
 */
#include "postgres.h"

#include "knn_shard_relay.h"

static void
release_kept(void *arg)
{
	knn_shard_relay_free((KnnShardRelay *) arg);
}

KnnShardRelay *
knn_shard_relay_create(int n_origins)
{
	KnnShardRelay *relay = palloc0(sizeof(KnnShardRelay));

	relay->n_origins = n_origins;
	relay->capacity = 256;
	relay->blocks = palloc(relay->capacity * sizeof(KnnShardRelayBlock));
	/* an error anywhere frees the results with the memory (libpq's, outside any context) */
	relay->release.func = release_kept;
	relay->release.arg = relay;
	MemoryContextRegisterResetCallback(CurrentMemoryContext, &relay->release);
	return relay;
}

void
knn_shard_relay_keep(KnnShardRelay *relay, const KnnShardResult *result, int origin,
					 const char *data, int length, int64 rows)
{
	KnnShardRelayBlock *b;

	if (origin < 0 || origin >= relay->n_origins || rows < 1)
		elog(ERROR, "knn_shard_relay_keep: block of shard %d with " INT64_FORMAT " rows", origin, rows);
	if (relay->n_blocks == relay->capacity)
	{
		relay->capacity *= 2;
		relay->blocks = repalloc_huge(relay->blocks, relay->capacity * sizeof(KnnShardRelayBlock));
	}
	b = &relay->blocks[relay->n_blocks];
	/* the result is the relay's from here: counted before anything else can fail */
	b->kept = knn_shard_result_keep(result);
	b->data = data;
	b->length = length;
	b->rows = rows;
	b->origin = origin;
	relay->n_blocks++;
	relay->rows += rows;
}

int64 *
knn_shard_relay_order(const KnnShardRelay *relay)
{
	int64	  **of_origin = palloc(relay->n_origins * sizeof(int64 *));
	int64	   *count = palloc0(relay->n_origins * sizeof(int64));
	int64	   *taken = palloc0(relay->n_origins * sizeof(int64));
	int64	   *order = palloc(Max(relay->n_blocks, 1) * sizeof(int64));
	int64		n = 0;

	for (int64 i = 0; i < relay->n_blocks; i++)
		count[relay->blocks[i].origin]++;
	for (int o = 0; o < relay->n_origins; o++)
	{
		of_origin[o] = palloc(Max(count[o], 1) * sizeof(int64));
		count[o] = 0;
	}
	for (int64 i = 0; i < relay->n_blocks; i++)
	{
		int			o = relay->blocks[i].origin;

		of_origin[o][count[o]++] = i;
	}
	while (n < relay->n_blocks)
		for (int o = 0; o < relay->n_origins; o++)
			if (taken[o] < count[o])
				order[n++] = of_origin[o][taken[o]++];
	for (int o = 0; o < relay->n_origins; o++)
		pfree(of_origin[o]);
	pfree(of_origin);
	pfree(count);
	pfree(taken);
	return order;
}

void
knn_shard_relay_free_block(KnnShardRelay *relay, int64 i)
{
	KnnShardRelayBlock *b = &relay->blocks[i];

	if (b->kept != NULL)
		knn_shard_result_free_kept(b->kept);
	b->kept = NULL;
	b->data = NULL;
}

void
knn_shard_relay_free(KnnShardRelay *relay)
{
	for (int64 i = 0; i < relay->n_blocks; i++)
		knn_shard_relay_free_block(relay, i);
}
