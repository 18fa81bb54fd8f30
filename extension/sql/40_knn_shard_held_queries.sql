-- A sharded self-join (the queries text is the targets text): each shard
-- reads its rows once, as its targets (knn_shard_receive.h), and sends the
-- same rows to the coordinator as its queries, in binary blocks, instead of
-- the coordinator reading them through postgres_fdw's text transfer.
CREATE FUNCTION knn_shard_prefetch_self_join(set bigint, query_type regtype, targets text,
                                             metric text,
                                             OUT targets_read bigint, OUT seconds double precision,
                                             OUT id_type text, OUT vector_type text, OUT dim integer)
RETURNS record
AS 'MODULE_PATHNAME', 'knn_shard_prefetch_self_join'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION knn_shard_prefetch_self_join(bigint, regtype, text, text) IS
'knn_shard_prefetch_targets for a coordinator whose queries text is its targets text: the same read, its errors naming the queries (the rows are the coordinator''s queries too); and what the rows are: the id and vector columns'' types by catalog identity (PostgreSQL''s own by OID, vector and halfvec by extension; NULL for others) and their dimension (-1 without rows), for the coordinator to take them only where its declared columns read the same.';

CREATE FUNCTION knn_shard_held_target_blocks(set bigint)
RETURNS SETOF bytea
AS 'MODULE_PATHNAME', 'knn_shard_held_target_blocks'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE ROWS 100;

COMMENT ON FUNCTION knn_shard_held_target_blocks(bigint) IS
'For a coordinator of a sharded self-join: the targets knn_shard_prefetch_self_join holds for query set "set" (still held for the join), as blocks of (int32 element, int32 dim, int32 rows, rows int64 ids, rows rows of elements; network byte order).';
