-- knn_join's rows packed for a coordinator that sharded the join
-- (knn_shard_packed.h): bytea values of (query id, target id, distance)
-- rows in network byte order, each query's rows in rank order. The same
-- join as knn_join(queries, targets, k, metric, exclude_self, method).
CREATE FUNCTION knn_join_packed(queries text, targets text, k integer, metric text,
                                exclude_self boolean, method text)
RETURNS SETOF bytea
AS 'MODULE_PATHNAME', 'knn_join_packed'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 100;

COMMENT ON FUNCTION knn_join_packed(text, text, integer, text, boolean, text) IS
'knn_join for a coordinator of a sharded join: its rows packed into bytea values of (int8 query id, int8 target id, float8 distance) send forms, each query''s rows in rank order.';
