-- A sharded knn_join's (knn_range_join's) query rows, shipped to a shard in
-- blocks into this backend's memory (knn_shard_receive.h) instead of a
-- temporary table, and the shard's joins of them. The rows are held until the transaction ends
-- or the join takes them; a new set number drops the set held.
CREATE FUNCTION knn_shard_receive_queries(set bigint, vector_type regtype, block bytea)
RETURNS bigint
AS 'MODULE_PATHNAME', 'knn_shard_receive_queries'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;

COMMENT ON FUNCTION knn_shard_receive_queries(bigint, regtype, bytea) IS
'For a coordinator of a sharded knn_join: appends a block of query rows (int32 8, int64 id, int32 n, n bytes of the vector''s send form; network byte order) to query set "set" held in this transaction; the rows held.';

-- knn_join_packed with the received query set as its queries.
CREATE FUNCTION knn_join_received_packed(set bigint, targets text, k integer, metric text,
                                         exclude_self boolean, method text)
RETURNS SETOF bytea
AS 'MODULE_PATHNAME', 'knn_join_received_packed'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 100;

COMMENT ON FUNCTION knn_join_received_packed(bigint, text, integer, text, boolean, text) IS
'knn_join_packed for a coordinator of a sharded knn_join: the queries are the set knn_shard_receive_queries() received in this transaction, which the join takes; each query''s pairs together, in rank order, the queries in the order received (the coordinator takes the pairs by query id).';

-- knn_range_join with the received query set as its queries.
CREATE FUNCTION knn_range_join_received(set bigint, targets text, radius double precision,
                                        metric text, exclude_self boolean, k integer,
                                        inclusive boolean, method text)
RETURNS TABLE (query_id bigint, target_id bigint, rank integer, distance double precision)
AS 'MODULE_PATHNAME', 'knn_range_join_received'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 1000;

COMMENT ON FUNCTION knn_range_join_received(bigint, text, double precision, text, boolean, integer, boolean, text) IS
'knn_range_join for a coordinator of a sharded knn_range_join: the queries are the set knn_shard_receive_queries() received in this transaction, which the join takes.';
