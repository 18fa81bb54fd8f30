/*
 * knn_shard.h -- knn_join over a table sharded across PostgreSQL servers:
 * a partitioned table (or a single foreign table) whose partitions are
 * postgres_fdw foreign tables of servers where knn_gpu is installed. Each
 * such server joins the query vectors against its own rows (its remote
 * SELECT, with the filters postgres_fdw pushed down), all servers at once;
 * the other partitions are read and joined here; the per-query lists are
 * merged by (distance, target id) into the exact global top k.
 */
#ifndef KNN_SHARD_H
#define KNN_SHARD_H

#include "postgres.h"

#include "executor/spi.h"
#include "nodes/execnodes.h"

#include "knn_catalog.h"
#include "knn_matrix.h"

/*
 * Called by knn_join once the queries are read (into `queries`, any order)
 * and before the targets are: when the prepared targets text scans
 * foreign partitions that can join on their servers, runs the whole join,
 * puts its rows into rsinfo's tuplestore and returns true (the caller then
 * only finishes SPI). Returns false when there is nothing to push down
 * (the queries may have been put in id order meanwhile, which the caller
 * does anyway): the caller joins as usual. Runs inside the caller's SPI
 * connection.
 */
extern bool knn_shard_try_join(ReturnSetInfo *rsinfo, KnnMatrix *queries,
							   SPIPlanPtr targets_plan, const char *targets_sql,
							   KnnVectorKind target_kind, int32 k, KnnMetric metric,
							   bool exclude_self, KnnMethod method);

/*
 * One source's candidates per query (a shard's result, or the local
 * part's): those of query row q are entries offsets[q] .. offsets[q+1]-1.
 */
typedef struct KnnShardLists
{
	int64		n_queries;
	int64	   *offsets;		/* n_queries + 1 */
	int64	   *target_ids;
	double	   *distances;
} KnnShardLists;

/*
 * Merges the sources' lists into the exact top k per query, ordered by
 * (distance, NaN last, target id), and puts them into rsinfo's tuplestore
 * with ranks from 1. query_ids[q] is query row q's id. Returns the rows put.
 */
extern int64 knn_shard_merge(ReturnSetInfo *rsinfo, const int64 *query_ids, int64 n_queries,
							 const KnnShardLists *sources, int n_sources, int32 k);

/* The statistics of this backend's last sharded join, as JSON (TopMemoryContext). */
extern void knn_shard_set_last_stats(const char *json);

#endif							/* KNN_SHARD_H */
