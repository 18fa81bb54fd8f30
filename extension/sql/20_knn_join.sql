-- knn_join: for every row of a query set, the k nearest rows of a target set.

-- Its row estimate: |Q| x min(k, |T|) from the planner's estimates of the
-- two query texts (ROWS 1000 where they do not plan).
CREATE FUNCTION knn_join_support(internal) RETURNS internal
AS 'MODULE_PATHNAME', 'knn_join_support'
LANGUAGE C STRICT;

CREATE FUNCTION knn_join(
    queries text,
    targets text,
    k integer,
    metric text DEFAULT 'l2',
    exclude_self boolean DEFAULT false,
    method text DEFAULT 'auto')
RETURNS TABLE (query_id bigint, target_id bigint, rank integer, distance double precision)
AS 'MODULE_PATHNAME', 'knn_join'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 1000 SUPPORT knn_join_support;

COMMENT ON FUNCTION knn_join(text, text, integer, text, boolean, text) IS
'Exact k-nearest-neighbour join. queries and targets are SQL queries returning (integer id, vector | halfvec | real[] | double precision[] | bit), optionally followed by group key columns of hashable types: each query then meets only the targets whose keys all equal its own (NULL matches nothing); metric is l2, cosine, ip or l1 for vectors, hamming or jaccard for bit strings; exclude_self drops pairs with equal ids; method is auto, ti or brute.';

CREATE FUNCTION knn_gpu_info() RETURNS text
AS 'MODULE_PATHNAME', 'knn_gpu_info'
LANGUAGE C VOLATILE PARALLEL SAFE;

CREATE FUNCTION knn_gpu_last_stats() RETURNS json
AS 'MODULE_PATHNAME', 'knn_gpu_last_stats'
LANGUAGE C VOLATILE PARALLEL RESTRICTED;
