/*
 * knn_shard_receive.h -- a shard's end of a sharded knn_join's query rows
 * shipped in blocks (knn_shard_remote.h's knn_shard_remote_ship_blocks):
 * knn_shard_receive_queries(set, vector_type, block) reads each block's
 * rows as the vector type's own binary receive function does (knn_gpu's
 * and pgvector's vector and halfvec, while their receive functions are
 * their extension's own: decoded here, with the same checks, errors and
 * bits; any other: through that function) into a
 * matrix held in this backend's memory for the rest of the transaction,
 * and knn_join_received_packed(set, targets, ...) (knn_range_join_received)
 * joins that matrix, with no table in between.
 *
 * A block is rows of (int32 8, int64 id, int32 n, n bytes of the vector's
 * send form), all integers in network byte order: the fields of a binary
 * COPY row of (int8, vector) without its field count, so the values are
 * those the COPY path gives, bit for bit. Blocks are hostile input: every
 * length is checked against the block before it is read.
 *
 * A set is named by its number (the coordinator's, unique per connection)
 * and belongs to the role that received it (as held targets belong to the
 * role that read them): another role's calls (after SET ROLE, in a
 * SECURITY DEFINER function) neither join it, add to it, replace it nor
 * drop it; they hold a set of that role's own beside it. A role holds one
 * set at a time: its new number drops its old set. It goes
 * at the end of the transaction, at the abort of a subtransaction that
 * added to it (the whole set, also the rows added before that savepoint:
 * unlike a temporary table's rows; the coordinator ships within one
 * level), or when the join takes it.
 */
#ifndef KNN_SHARD_RECEIVE_H
#define KNN_SHARD_RECEIVE_H

#include "postgres.h"

#include "knn_matrix.h"

/*
 * ERROR (42704, naming `function`) unless a type of OID `type` exists: a
 * regtype argument may be any number, and the catalog's own lookups
 * (getBaseType) would answer an unknown one with an internal error.
 */
extern void knn_shard_check_type_exists(Oid type, const char *function);

/* The type of the vectors of received set `set`; ERROR when it is not held. */
extern Oid	knn_received_queries_type(int64 set);

/*
 * Moves received set `set` into `queries` (knn_matrix_init'ed with the
 * element the join reads it as, in the context the matrix must live in):
 * the rows as received, or read again as that element (vector rows read as
 * halfvec, as the COPY path's join would read them). The set is no longer
 * held afterwards.
 */
extern void knn_received_queries_take(int64 set, KnnMatrix *queries);

/*
 * A set's targets read before its queries arrive (knn_shard_prefetch_targets,
 * knn_join.c), so that a coordinator reads its queries while its shards
 * read their targets: held like a received set (the transaction, or the
 * subtransaction that read them; the reading role's own, one read at a
 * time), taken by the join of that set whose targets text is the one they
 * were read by. All the functions below see the current role's only.
 *
 * knn_held_targets_begin drops what this role holds and gives the context the
 * matrix must be made in; knn_held_targets_keep then holds it (the text's
 * vector column type and the matrix read there).
 */
extern MemoryContext knn_held_targets_begin(int64 set);

/*
 * The held targets' generation, a number each begin makes anew (0: none
 * held): a reader that makes them over several calls
 * (knn_shard_read_held_blocks) checks with knn_held_targets_unchanged that
 * they are still the ones it began (not dropped, replaced or rolled back
 * since) before it touches their matrix again.
 */
extern uint64 knn_held_targets_generation(void);

/*
 * Around a read into the held targets' matrix: while on, a targets text
 * that calls knn_shard_drop_targets or a read ahead (its functions run
 * inside that read) gets an ERROR instead of freeing the matrix being
 * filled.
 */
extern void knn_held_targets_filling(bool filling);
extern bool knn_held_targets_unchanged(int64 set, uint64 generation);
extern void knn_held_targets_keep(int64 set, const char *targets_sql, Oid vector_type,
								  const KnnMatrix *matrix);

/*
 * Moves the held targets into `targets` (knn_matrix_init'ed with the
 * join's element; its set name stays, for messages) when they are set
 * `set`'s, read by the same text as the same type and element; otherwise
 * drops anything held for another text and returns false (the caller
 * reads the text).
 */
extern bool knn_held_targets_take(int64 set, const char *targets_sql, Oid vector_type,
								  KnnMatrix *targets);

/*
 * A sharded self-join whose coordinator ships each shard only the other
 * shards' rows (knn_join_received_held_packed): the queries are the rows
 * received for set `set` (none, where no other shard had rows) and this
 * server's own rows, the targets it holds for that set (which the join
 * then takes as its targets too). knn_held_queries_type: the type of
 * their vectors; knn_held_queries_take: both into `queries` (as
 * knn_received_queries_take), the held rows copied. ERROR where the
 * targets are not held for this set (or were read by another role), or
 * are not the received rows' kind.
 */
extern Oid	knn_held_queries_type(int64 set);
extern void knn_held_queries_take(int64 set, KnnMatrix *queries);

/*
 * A sharded self-join whose coordinator relays the other shards' held
 * blocks unchanged (knn_shard_receive_held_rows(set, vector_type, block):
 * each block, checked as hostile input, goes straight into the held
 * matrix's memory after this server's rows; ERROR where the targets are
 * not held for the set or the block is not of their kind, element and
 * dimension). knn_held_rows_take: where no rows came by
 * knn_shard_receive_queries for the set, the held matrix itself becomes
 * `queries` (knn_matrix_init'ed in the context it must live in): this
 * server's rows first, put in id order, then those relayed, with no copy;
 * and where `targets_sql` and `vector_type` are those they were read by,
 * `targets` becomes a view of its first rows (this server's: the same
 * memory, never to be freed or written through it) and *targets_taken is
 * set. False, nothing taken, where rows came by knn_shard_receive_queries
 * (then knn_held_queries_take, and knn_held_targets_take takes this
 * server's rows only).
 */
extern bool knn_held_rows_take(int64 set, const char *targets_sql, Oid vector_type,
							   KnnMatrix *queries, KnnMatrix *targets, bool *targets_taken);

/*
 * A block of a held matrix's rows first .. first + rows - 1, in
 * knn_shard_held_target_blocks's layout (int32 element, int32 dim, int32
 * rows, the rows' int64 ids, their elements; network byte order), and the
 * rows of a block of about a megabyte.
 */
extern bytea *knn_held_block(const KnnMatrix *m, int64 first, int64 rows);
extern int64 knn_held_block_rows(const KnnMatrix *m);

/* Drops the targets this role holds for set `set`, if any (knn_shard_drop_targets). */
extern void knn_held_targets_drop(int64 set);

/* The rows of the targets this role holds, or -1 (tests: knn_shard_held_targets). */
extern int64 knn_held_targets_rows(void);

/*
 * Copies n_bytes of matrix rows of `element` between this server's byte
 * order and network order (one swap, both ways: float32 elements as 32-bit
 * words, float16 as 16-bit words, bits as they are), for the blocks of
 * knn_shard_held_target_blocks; true when a float element (as read after
 * the swap) is not finite.
 */
extern bool knn_rows_swap_order(char *dest, const char *src, Size n_bytes, KnnElement element);

/*
 * What a type is in terms another server can compare (a sharded self-join's
 * check that the rows a shard holds are what the coordinator's declared
 * columns would read: knn_shard_prefetch_self_join's answer): PostgreSQL's
 * own types by OID (the same on every server), knn_gpu's and pgvector's
 * vector and halfvec by their extension and kind (knn_catalog.h's catalog
 * identity); NULL for any other type (a domain, a user's type), which
 * matches nothing.
 */
extern char *knn_shard_type_identity(Oid type);

#endif							/* KNN_SHARD_RECEIVE_H */
