-- The statistics of this backend's last knn_join that ran on shards
-- (foreign partitions of postgres_fdw servers): per shard its server, rows,
-- time and remote SQL; the local part, the shipping and the merge.
CREATE FUNCTION knn_gpu_last_shard_stats() RETURNS json
AS 'MODULE_PATHNAME', 'knn_gpu_last_shard_stats'
LANGUAGE C VOLATILE PARALLEL RESTRICTED;
