/*
 * knn_shard_remote.h -- one shard of a sharded join (knn_join, or the KNN
 * Join node): a postgres_fdw connection (postgres_fdw's own, through its
 * exported functions: its user mapping checks, its remote transaction, its
 * cancel on abort), the query rows shipped there (into a temporary table,
 * or in blocks into the shard backend's memory: knn_shard_receive.h), and
 * the shard-local join sent and collected.
 */
#ifndef KNN_SHARD_REMOTE_H
#define KNN_SHARD_REMOTE_H

#include "postgres.h"

#include "foreign/foreign.h"
#include "lib/stringinfo.h"
#include "nodes/pg_list.h"
#include "portability/instr_time.h"

#include "knn_catalog.h"
#include "knn_matrix.h"

typedef struct KnnShardRemote
{
	ForeignServer *server;
	UserMapping *user;
	const char *who;			/* "knn_join" or "KNN Join", for messages */
	List	   *scans;			/* its partitions' KnnShardScans (knn_shard.h), plan order */
	void	   *conn;			/* postgres_fdw's PGconn */
	void	   *conn_state;		/* postgres_fdw's PgFdwConnState */
	char	   *knn_schema;		/* knn_gpu's schema there, quoted */
	char	   *query_type;		/* knn_join's query vectors' type there */
	Oid			query_type_oid; /* ... its OID there (the blocks' type parameter) */
	bool		has_packed_join;	/* knn_join_packed() there (knn_shard_packed.h) */
	bool		has_received_join;	/* knn_shard_receive_queries() and
									 * knn_join_received_packed() there */
	bool		has_received_range_join;	/* ... and knn_range_join_received() */
	bool		has_prefetch;	/* knn_shard_prefetch_targets() and knn_shard_drop_targets() there */
	bool		has_held_blocks;	/* knn_shard_prefetch_self_join() and
									 * knn_shard_held_target_blocks() there */
	bool		has_received_held_join; /* knn_join_received_held_packed() there */
	bool		has_held_relay; /* knn_shard_receive_held_rows() there (knn_shard_relay.h) */
	bool		has_held_stream;	/* knn_shard_read_held_blocks() there */
	/* a self-join's read that sends its rows as it reads them (instead of prefetch and fetch), or NULL */
	char	   *stream_sql;
	/* a self-join's join with its own held rows as queries too (the others' shipped), or NULL */
	char	   *held_join_sql;
	int64		rows_shipped;	/* query rows shipped to it in blocks, -1 = not */
	bool		receives_queries;	/* this join ships in blocks, set by the caller */
	int64		received_set;	/* the number of the set shipped in blocks */
	bool		sending;		/* in non-blocking mode for the blocks */
	int32		block_size;		/* the shard's page size (block_size) */
	char	   *temp_table;		/* pg_temp.<name> (knn_shard_remote_name_table) */
	char	   *temp_columns;	/* its column definitions, set by the caller */
	const char *vector_column;	/* its column of query vectors (kept in the row), or NULL */
	char	   *join_sql;		/* what the shard runs */
	int			n_params;		/* of join_sql: $1 .. $n, sent as text */
	const Oid  *param_types;
	const char *const *param_values;
	bool		binary_result;
	bool		stream_result;	/* join_sql's rows read as they arrive (below) */
	bool		packed_result;	/* join_sql returns knn_join_packed()'s values */
	bool		table_exists;	/* created in this join, not yet dropped */
	bool		copy_sent;		/* COPY FROM STDIN sent, not yet ended */
	bool		copying;		/* ... and its COPY IN answer read */
	bool		busy;			/* the join was sent, its result not yet read */
	/*
	 * A join read as it arrives whose rows are not packed runs through a
	 * cursor there, fetched in batches (knn_shard_remote_send): its name
	 * (NULL: none open), the next FETCH's count, and whether the last FETCH
	 * filled its count (more may come).
	 */
	char	   *cursor;
	int64		fetch_rows;
	bool		more_rows;
	instr_time	sent;
	/* its targets read ahead of the queries (knn_shard_receive.h), set by the caller */
	char	   *prefetch_sql;	/* what reads them there, or NULL: the join reads them */
	bool		read_ahead;		/* prefetch_sql sent in this join */
	bool		prefetching;	/* ... its result not yet read */
	bool		holds_targets;	/* read there, not yet taken by the join */
	double		seconds_read;	/* the shard's own time reading them */
	int64		prefetched_rows;
	/*
	 * What a self-join's read ahead holds (knn_shard_prefetch_self_join's
	 * answer): its id and vector columns' types there by catalog identity
	 * (knn_shard_type_identity; NULL: not said, or a type without one) and
	 * the rows' dimension (-1: no rows), checked against the declared
	 * columns before any row is fetched.
	 */
	char	   *held_id_type;
	char	   *held_vector_type;
	int32		held_dim;
	/* a self-join's query rows: its held targets fetched back (knn_shard_remote_fetch_held) */
	char	   *fetch_sql;
	bool		fetching;		/* ... sent, its result not yet read */
	double		seconds_ship;
	double		seconds_join;	/* from sending the join to its result arriving */
	int64		rows;			/* the join's result rows */
	char	   *remote_stats;	/* knn_gpu_last_stats() there after the join, or NULL */
	/*
	 * Round trips since this run's shipping began: the times a statement
	 * (or statements queued together) went there and its answer was waited
	 * for before the next could go (DEBUG1 at the run's end).
	 */
	int			round_trips;
	void	   *caller;			/* the caller's own state of this shard */
} KnnShardRemote;

/* Is the server's foreign-data wrapper postgres_fdw (its handler's code)? */
extern bool knn_shard_is_postgres_fdw(ForeignServer *server);

/*
 * Takes postgres_fdw's connection for the shard's user mapping and checks
 * that knn_gpu of version `version` is installed there with a type for
 * rows of `element` (query_type): for vector and halfvec rows, that of
 * extension type_extension (knn_gpu's own or pgvector's "vector") at
 * type_version, where these are not NULL (NULL: knn_gpu's, else
 * pgvector's; any version). NULL when the shard can join; otherwise why
 * not (the caller reads its rows instead). The same statement asks the
 * caller's select-list fields more_fields (", f1, ...", n_more of them, ""
 * for none): where knn_gpu is there, *more_values holds their texts (NULL
 * for NULL).
 */
extern const char *knn_shard_remote_open(KnnShardRemote *shard, const char *version,
										 KnnElement element, const char *type_extension,
										 const char *type_version, const char *more_fields,
										 int n_more, char ***more_values);

/*
 * An opened shard: the schema (quoted) of the operator there that is
 * `identity`, and the type (qualified) of its operands, or NULL with
 * *why set.
 */
extern char *knn_shard_remote_operator(KnnShardRemote *shard, const KnnOperatorIdentity *identity,
									   char **operand_type, const char **why);

/*
 * Gives the shard its temporary table's name and its received set's
 * number (both unique in this backend).
 */
extern void knn_shard_remote_name_table(KnnShardRemote *shard);

/*
 * The rows of the query table, as fields of binary COPY: encode appends
 * row `row`'s n_fields fields (each an int32 length and its bytes, or -1
 * for NULL) to buf.
 */
typedef struct KnnShardRows
{
	int64		n;
	int			n_fields;
	int64		max_vector_bytes;	/* the largest query vector's size there, 0 = unknown */
	void		(*encode) (void *arg, int64 row, StringInfo buf);
	void	   *arg;
	/*
	 * NULL: every row goes to every shard. Else (knn_shard_remote_ship_blocks
	 * only, rows->n final) one end per shard of the shipment, in its order:
	 * shard s's own rows are rows origin_end[s - 1] (0 for the first) up to
	 * origin_end[s], and it is shipped only the others'.
	 */
	const int64 *origin_end;
	/*
	 * Or (knn_shard_remote_ship_blocks only, the shards in the relay's
	 * origin order): the held blocks to send on as they came, each to every
	 * shard but the one that sent it, by knn_shard_receive_held_rows(); n is
	 * then the relay's rows and encode is not used.
	 */
	struct KnnShardRelay *relay;
} KnnShardRows;

/* Appends one field of binary COPY: the value's send form, or NULL. */
extern void knn_shard_copy_field(StringInfo buf, const char *data, int len);

/*
 * Ships the rows into each shard's temporary table (temp_table with
 * temp_columns, ON COMMIT DROP), all shards in turn per slice of rows.
 */
extern void knn_shard_remote_ship(KnnShardRemote **shards, int n_shards, const KnnShardRows *rows);

/* The bytes of rows per block shipped into a shard's memory. */
#define KNN_SHARD_BLOCK_BYTES (1024 * 1024)

/*
 * Ships the rows into each shard's memory in blocks of a megabyte
 * (knn_shard_receive_queries() there, set received_set), all shards at
 * once: each shard gets its next block as soon as it has answered its
 * last, the coordinator encoding blocks ahead while the shards read.
 * (knn_shard_remote_ship_start, then knn_shard_remote_ship_finish.)
 */
extern void knn_shard_remote_ship_blocks(KnnShardRemote **shards, int n_shards,
										 const KnnShardRows *rows);

/*
 * The same in steps, for rows shipped while the caller still reads them:
 * start prepares the shards' statement and puts their connections into
 * non-blocking (pipeline) mode, with `savepoint` under a savepoint of its
 * own there (so the rows can be taken back); poll encodes the complete
 * blocks of rows->n rows so far (rows->n grows between calls, the rows
 * before it never change) and moves them along as far as the shards take
 * them now, without waiting; finish ships the rest (rows->n final) and
 * waits until every shard holds every row. Nothing else may use the
 * connections in between. After an error anywhere from start to the end
 * of finish, the caller calls fail before postgres_fdw's abort cleanup
 * (start, poll's callers and finish do it where they catch an error).
 */
typedef struct KnnShardShipment KnnShardShipment;

extern KnnShardShipment *knn_shard_remote_ship_start(KnnShardRemote **shards, int n_shards,
													 const KnnShardRows *rows, bool savepoint);
extern void knn_shard_remote_ship_poll(KnnShardShipment *shipment);
extern void knn_shard_remote_ship_finish(KnnShardShipment *shipment);

/* The rows every shard held when the finish began (shipped while they were read). */
extern int64 knn_shard_remote_ship_held_at_finish(const KnnShardShipment *shipment);

/* After an error: leaves the connections to postgres_fdw's abort cleanup (no-op once ended). */
extern void knn_shard_remote_ship_fail(KnnShardShipment *shipment);

/*
 * After finish, a shipment under a savepoint: keep releases the savepoint
 * (the rows stay for the join); otherwise the shards roll back to it,
 * which drops the rows received there.
 */
extern void knn_shard_remote_ship_end_savepoint(KnnShardShipment *shipment, bool keep);

/*
 * Sends the shard's prefetch_sql without waiting for it: the shard reads
 * its targets while the caller reads its queries. Nothing else may use the
 * connection until knn_shard_remote_prefetch_wait.
 */
extern void knn_shard_remote_prefetch_send(KnnShardRemote *shard);

/*
 * Waits (cancellably) for every shard's prefetch sent, noting its time
 * and rows (seconds_read, prefetched_rows); the shards then hold their
 * targets for the join.
 */
extern void knn_shard_remote_prefetch_wait(KnnShardRemote **shards, int n_shards);

/*
 * Without waiting: reads the prefetch results that are there; true when no
 * shard is prefetching any more (then the connections are free).
 */
extern bool knn_shard_remote_prefetch_poll(KnnShardRemote **shards, int n_shards);

/*
 * A join that does not go to the shards after all: waits for the
 * prefetches and drops the targets held there.
 */
extern void knn_shard_remote_prefetch_drop(KnnShardRemote **shards, int n_shards);

/*
 * Sends each shard's join_sql (with its parameters, results in binary or
 * text as binary_result says) without waiting for it to run. A join read
 * in a cursor there is declared first, all shards' declarations sent
 * before any is answered (one round trip each), then its first FETCH.
 */
extern void knn_shard_remote_send(KnnShardRemote **shards, int n_shards);

/* A shard's result, while the caller reads it (a PGresult). */
typedef struct KnnShardResult KnnShardResult;

extern int	knn_shard_result_rows(const KnnShardResult *result);
/* What it takes in libpq's memory, estimated (from up to 1024 of its rows). */
extern double knn_shard_result_bytes(const KnnShardResult *result);
extern int	knn_shard_result_columns(const KnnShardResult *result);
/* The value (NULL for NULL) and its length; text values end in '\0'. */
extern const char *knn_shard_result_value(const KnnShardResult *result, int row, int column,
										  int *length);

/*
 * The reader keeps the result (a PGresult, libpq's memory): freed only by
 * knn_shard_result_free_kept of what this returns.
 */
extern void *knn_shard_result_keep(const KnnShardResult *result);
extern void knn_shard_result_free_kept(void *kept);

/* Reads one shard's result; may raise (the result is freed first). */
typedef void (*KnnShardReader) (void *arg, KnnShardRemote *shard, const KnnShardResult *result);

/*
 * Waits (cancellably) for every sent join, hands each result to reader,
 * then drops the temporary tables and reads each shard's own statistics.
 */
extern void knn_shard_remote_collect(KnnShardRemote **shards, int n_shards,
									 KnnShardReader reader, void *reader_arg);

/*
 * The same for joins sent with stream_result: their rows go to reader as
 * they arrive (a batch of a cursor's rows of about 1 MB, or a packed
 * value: a result of one row), so that no shard's whole answer is held
 * here; shard->rows is the reader's to count.
 */
extern void knn_shard_remote_collect_rows(KnnShardRemote **shards, int n_shards,
										  KnnShardReader reader, void *reader_arg);

/*
 * A self-join's queries: has every shard (prefetched with
 * knn_shard_prefetch_self_join) send back the targets it holds, all shards
 * at once, in binary blocks (knn_shard_held_target_blocks there), and
 * hands each block to reader as it arrives (libpq's single-row mode: a
 * result of one row, freed once read), so that no shard's whole answer
 * waits here. The shards keep the targets for their joins. Cancellable;
 * nothing else may use the connections meanwhile.
 */
extern void knn_shard_remote_fetch_held(KnnShardRemote **shards, int n_shards,
										KnnShardReader reader, void *reader_arg);

/*
 * Takes the opened shard's connection again for a run in this
 * (sub)transaction: a run in a deeper subtransaction than the one that
 * opened it (a cursor's FETCH after a SAVEPOINT) works in a remote
 * savepoint of its own, which postgres_fdw's cleanup after an error there
 * rolls back, cancelling what still runs.
 */
extern void knn_shard_remote_take_again(KnnShardRemote *shard);

/* Gives postgres_fdw's connection back (at the end of its use). */
extern void knn_shard_remote_release(KnnShardRemote *shard);

/* Every error raised while talking to a shard says which server it was. */
extern void knn_shard_error_context(void *arg);

#endif							/* KNN_SHARD_REMOTE_H */
