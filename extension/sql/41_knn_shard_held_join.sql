-- A sharded self-join whose queries came from the shards' held rows: each
-- shard is shipped only the other shards' rows and joins them with its own.
CREATE FUNCTION knn_join_received_held_packed(set bigint, targets text, k integer, metric text,
                                              exclude_self boolean, method text)
RETURNS SETOF bytea
AS 'MODULE_PATHNAME', 'knn_join_received_held_packed'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 100;

COMMENT ON FUNCTION knn_join_received_held_packed(bigint, text, integer, text, boolean, text) IS
'knn_join_received_packed for a coordinator of a sharded self-join that shipped only the other shards'' rows: the queries are the set knn_shard_receive_queries() received in this transaction (if any) and the targets knn_shard_prefetch_self_join() holds for it, which the join takes as its targets too.';
