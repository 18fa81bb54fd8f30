/*
 * knn_shard_relay.h -- a sharded self-join's held blocks kept as they came
 * from the shards (knn_shard_held_target_blocks's layout), to be sent on
 * unchanged to the other shards (knn_shard_receive_held_rows there).
 *
 * Why: every query row of such a join crosses the coordinator twice. Kept
 * as libpq received them, the coordinator reads only a block's header and
 * ids, and no row is decoded here and encoded again; each receiving shard
 * checks every value of what it is sent, as it must of any caller.
 */
#ifndef KNN_SHARD_RELAY_H
#define KNN_SHARD_RELAY_H

#include "postgres.h"

#include "knn_shard_remote.h"

typedef struct KnnShardRelayBlock
{
	const char *data;			/* the block's bytes, in `kept` (NULL once freed) */
	int			length;
	int64		rows;
	int			origin;			/* the index of the shard that sent it */
	void	   *kept;			/* the libpq result that holds it */
} KnnShardRelayBlock;

typedef struct KnnShardRelay
{
	KnnShardRelayBlock *blocks; /* in the order they arrived */
	int64		n_blocks;
	int64		capacity;
	int64		rows;			/* in all blocks */
	int			n_origins;
	MemoryContextCallback release;	/* frees the results still kept with its memory */
} KnnShardRelay;

/* An empty relay of blocks from n_origins shards, living (and freed) with CurrentMemoryContext. */
extern KnnShardRelay *knn_shard_relay_create(int n_origins);

/*
 * Keeps a result of one row holding one block (single-row mode): data and
 * length point into it, the block's header said `rows` rows, and origin
 * sent it. The result is no longer freed by its reader.
 */
extern void knn_shard_relay_keep(KnnShardRelay *relay, const KnnShardResult *result, int origin,
								 const char *data, int length, int64 rows);

/*
 * The order to send the blocks in: each shard's blocks in the order they
 * came, the shards' in turn (so that every shard has blocks to take at
 * once). An array of n_blocks block indexes, palloc'd.
 */
extern int64 *knn_shard_relay_order(const KnnShardRelay *relay);

/* Frees block i's result once it is sent everywhere (no-op if freed). */
extern void knn_shard_relay_free_block(KnnShardRelay *relay, int64 i);

/* Frees every result still kept (also done when its memory context goes). */
extern void knn_shard_relay_free(KnnShardRelay *relay);

#endif							/* KNN_SHARD_RELAY_H */
