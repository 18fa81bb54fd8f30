/*
 * knn_shard_spill.h -- a sharded join's lists past
 * knn_gpu.max_result_memory (knn_join's whose k may pass it, knn_range_join's
 * whose pairs have no other bound): each source's pairs go, as they come,
 * into memory while they fit, then into a temporary file per batch of
 * query rows (in id order), and the merge takes one batch at a time
 * (knn_shard_spill.c).
 */
#ifndef KNN_SHARD_SPILL_H
#define KNN_SHARD_SPILL_H

#include "funcapi.h"
#include "storage/buffile.h"

#include "knn_matrix.h"
#include "knn_shard.h"
#include "knn_shard_packed.h"
#include "knn_shard_remote.h"

/*
 * A join whose sources' lists could pass knn_gpu.max_result_memory: the
 * same lists, the same rows in the same order, with one batch's lists in
 * memory at once. The pairs are held in memory while they take at most
 * half the limit (the merge of them takes the other half); past that, all
 * of them go into the batches' files.
 */
typedef struct Spill
{
	const KnnMatrix *queries;	/* in id order */
	int64		per_run;
	int64		n_batches;
	BufFile   **files;			/* per batch, made when first written */
	struct SpillPair *held;		/* the pairs while in memory, NULL once in files */
	int64		n_held;
	int64		held_capacity;
	int64		max_held;
	bool		together;		/* each query's pairs come together from a shard (knn_join's) */
	int			n_shards;		/* the local part is source n_shards */
	KnnShardRemote **shards;
	int64	   *pairs;			/* per source */
	int64	   *last_row;		/* per source: the row found last (query_row's hint) */
	uint8	  **done;			/* per shard: note_query_row's bits */
} Spill;

/*
 * A spill of queries' lists from n_shards shards and the local part, in
 * batches of at least per_run query rows; together: as Spill's.
 */
extern Spill *knn_shard_spill_begin(const KnnMatrix *queries, int64 per_run, int n_shards,
									KnnShardRemote **shards, bool together);

/* One pair of source (a shard, or n_shards: the local part) for query row `row`. */
extern void knn_shard_spill_put(Spill *spill, int source, int64 row, int64 target_id,
								double distance);

/* Did the pairs go into files (then merged batch by batch)? */
extern bool knn_shard_spill_in_files(const Spill *spill);

/*
 * Merges the spill batch by batch into the tuplestore (or packed), at most
 * k pairs per query (-1: all; a shard's more than k is an ERROR); the rows
 * returned.
 */
extern int64 knn_shard_spill_merge(Spill *spill, ReturnSetInfo *rsinfo, int64 k,
								   KnnPackedRows *packed);

#endif
