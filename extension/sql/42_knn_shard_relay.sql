-- A sharded self-join whose coordinator relays each shard's held rows to
-- the other shards unchanged (knn_shard_receive.h): the blocks
-- knn_shard_held_target_blocks() made on one shard go, byte for byte, into
-- the held rows of another, which knn_join_received_held_packed() then
-- joins with its own rows, with no copy of either.
CREATE FUNCTION knn_shard_receive_held_rows(set bigint, vector_type regtype, block bytea)
RETURNS bigint
AS 'MODULE_PATHNAME', 'knn_shard_receive_held_rows'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;

COMMENT ON FUNCTION knn_shard_receive_held_rows(bigint, regtype, bytea) IS
'For a coordinator of a sharded self-join: appends a block of another shard''s held rows (as knn_shard_held_target_blocks() made it: int32 element, int32 dim, int32 rows, the rows'' int64 ids, their elements; network byte order) after the rows knn_shard_prefetch_self_join() holds for query set "set" in this transaction, as queries of knn_join_received_held_packed(); the rows appended so far.';

-- The same self-join's read, its rows sent to the coordinator as they are
-- read (value per call: call it from a query's target list), instead of
-- knn_shard_prefetch_self_join() and then knn_shard_held_target_blocks().
CREATE FUNCTION knn_shard_read_held_blocks(set bigint, query_type regtype, targets text, metric text,
                                           id_type text, vector_type text, min_dim integer, max_dim integer)
RETURNS SETOF bytea
AS 'MODULE_PATHNAME', 'knn_shard_read_held_blocks'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 1000;

COMMENT ON FUNCTION knn_shard_read_held_blocks(bigint, regtype, text, text, text, text, integer, integer) IS
'For a coordinator of a sharded self-join: reads the targets text as knn_shard_prefetch_self_join() does (held for query set "set" in this transaction) and returns its rows as they are read, in knn_shard_held_target_blocks()''s blocks; where the id and vector columns are not of the types id_type and vector_type name, or the first row''s dimension is outside min_dim .. max_dim, one 12-byte block of element -1 and no rows, and nothing held.';
