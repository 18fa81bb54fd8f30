/*
 * knn_shard_packed.h -- a shard's knn_join result in few values: its rows
 * (query id, target id, distance) packed into bytea values of up to
 * KNN_PACKED_ROWS rows each, KNN_PACKED_ROW_BYTES a row in network byte
 * order (int8, int8, float8 send forms), each query's rows in rank order.
 * knn_join_packed() writes them on the shard (knn_join.c); the coordinator
 * reads them (knn_shard.c). A result row per pair costs a tuple, a protocol
 * message and three field look-ups on each side; a packed value of 65536
 * rows costs one.
 */
#ifndef KNN_SHARD_PACKED_H
#define KNN_SHARD_PACKED_H

#include "postgres.h"

#include "fmgr.h"
#include "lib/stringinfo.h"
#include "nodes/execnodes.h"

#include "knn_join_function_scan.h"

#define KNN_PACKED_ROW_BYTES 24
#define KNN_PACKED_ROWS 65536

/* The packed values being written into a set-returning function's result (one bytea column). */
typedef struct KnnPackedRows
{
	ReturnSetInfo *rsinfo;
	StringInfoData buf;			/* the value being filled, its varlena header first */
	int64		rows;
} KnnPackedRows;

extern void knn_packed_begin(KnnPackedRows *out, ReturnSetInfo *rsinfo);
extern void knn_packed_put(KnnPackedRows *out, int64 query_id, int64 target_id, double distance);
/* Puts the last, partly filled value. */
extern void knn_packed_end(KnnPackedRows *out);

/*
 * A join's result arrays (KnnJoinDirect: the engine's, or a sharded call's
 * merged lists; integer ids, no keys) packed a value at a time, for a
 * packed form called value per call: knn_packed_next gives the next value
 * of up to KNN_PACKED_ROWS rows (palloc'd), or NULL after the last.
 */
typedef struct KnnPackedCursor
{
	KnnJoinDirect result;
	int64		query;			/* the next row: query row ... */
	int64		at;				/* ... and its slot (engine's) or row (merged) */
} KnnPackedCursor;

extern bytea *knn_packed_next(KnnPackedCursor *cursor);

/* One packed row (KNN_PACKED_ROW_BYTES at p). */
extern void knn_packed_get(const char *p, int64 *query_id, int64 *target_id, double *distance);

#endif							/* KNN_SHARD_PACKED_H */
