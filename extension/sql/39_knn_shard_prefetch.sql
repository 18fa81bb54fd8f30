-- A sharded knn_join's targets, read by a shard before the coordinator ships
-- the queries (knn_shard_receive.h), so that the coordinator reads its
-- queries while the shards read their targets. Held until the transaction
-- ends, a new set number, knn_shard_drop_targets, or the join of that set
-- (knn_join_received_packed, knn_range_join_received) takes them.
CREATE FUNCTION knn_shard_prefetch_targets(set bigint, query_type regtype, targets text,
                                           metric text DEFAULT 'l2',
                                           OUT targets_read bigint, OUT seconds double precision)
RETURNS record
AS 'MODULE_PATHNAME', 'knn_shard_prefetch_targets'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

COMMENT ON FUNCTION knn_shard_prefetch_targets(bigint, regtype, text, text) IS
'For a coordinator of a sharded knn_join: reads the targets of query set "set"''s join (queries of query_type, this metric) into this transaction''s memory, for that join with the same targets text; the rows held and the seconds the read took.';

CREATE FUNCTION knn_shard_drop_targets(set bigint)
RETURNS void
AS 'MODULE_PATHNAME', 'knn_shard_drop_targets'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;

COMMENT ON FUNCTION knn_shard_drop_targets(bigint) IS
'For a coordinator of a sharded knn_join that joins here after all: drops the targets knn_shard_prefetch_targets holds for query set "set".';

CREATE FUNCTION knn_shard_held_targets()
RETURNS bigint
AS 'MODULE_PATHNAME', 'knn_shard_held_targets'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;

COMMENT ON FUNCTION knn_shard_held_targets() IS
'The rows of the targets knn_shard_prefetch_targets holds in this transaction, or -1.';
