/*
 * knn_shard_remote.h -- one shard of a sharded knn_join: a postgres_fdw
 * connection (postgres_fdw's own, through its exported functions: its user
 * mapping checks, its remote transaction, its cancel on abort), the query
 * vectors shipped into a temporary table there, and the shard-local
 * knn_join sent and collected.
 */
#ifndef KNN_SHARD_REMOTE_H
#define KNN_SHARD_REMOTE_H

#include "postgres.h"

#include "foreign/foreign.h"
#include "portability/instr_time.h"

#include "knn_matrix.h"
#include "knn_shard.h"

typedef struct KnnShardRemote
{
	ForeignServer *server;
	UserMapping *user;
	void	   *conn;			/* postgres_fdw's PGconn */
	void	   *conn_state;		/* postgres_fdw's PgFdwConnState */
	char	   *knn_schema;		/* knn_gpu's schema there, quoted */
	char	   *query_type;		/* the temporary table's vector column type there */
	char	   *temp_table;		/* pg_temp.<name>, while it exists */
	StringInfoData targets_sql; /* the shard's targets text (its partitions' SELECTs) */
	char	   *join_sql;		/* what the shard runs */
	bool		copy_sent;		/* COPY FROM STDIN sent, not yet ended */
	bool		copying;		/* ... and its COPY IN answer read */
	bool		busy;			/* the join was sent, its result not yet read */
	instr_time	sent;
	double		seconds_ship;
	double		seconds_join;	/* from sending the join to its result arriving */
	int			n_partitions;
	char	   *remote_stats;	/* knn_gpu_last_stats() there after the join, or NULL */
	KnnShardLists lists;		/* its result */
} KnnShardRemote;

/* Is the server's foreign-data wrapper postgres_fdw (its handler's code)? */
extern bool knn_shard_is_postgres_fdw(ForeignServer *server);

/*
 * Takes postgres_fdw's connection for the shard's user mapping and checks
 * that knn_gpu of version `version` is installed there with a type for
 * rows of `element`. NULL when the shard can join; otherwise why not (the
 * caller reads its rows instead).
 */
extern const char *knn_shard_remote_open(KnnShardRemote *shard, const char *version,
										 KnnElement element);

/*
 * Ships the query rows (in the matrix's order) into a temporary table ON
 * COMMIT DROP on every shard, all shards in turn per slice of rows.
 */
extern void knn_shard_remote_ship(KnnShardRemote **shards, int n_shards,
								  const KnnMatrix *queries);

/* Sends the shard-local join without waiting for it. */
extern void knn_shard_remote_send(KnnShardRemote *shard, int32 k, KnnMetric metric,
								  bool exclude_self, KnnMethod method);

/*
 * Waits (cancellably) for every sent join, reads each result into the
 * shard's lists (query ids looked up in the sorted, unique query_ids),
 * then drops the temporary tables.
 */
extern void knn_shard_remote_collect(KnnShardRemote **shards, int n_shards,
									 const int64 *query_ids, int64 n_queries);

#endif							/* KNN_SHARD_REMOTE_H */
