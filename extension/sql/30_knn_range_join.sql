-- knn_range_join: every pair of a query set and a target set within a radius.

CREATE FUNCTION knn_range_join(
    queries text,
    targets text,
    radius double precision,
    metric text DEFAULT 'l2',
    exclude_self boolean DEFAULT false,
    k integer DEFAULT NULL,
    inclusive boolean DEFAULT true,
    method text DEFAULT 'auto',
    params text[] DEFAULT NULL)
RETURNS TABLE (query_id bigint, target_id bigint, rank integer, distance double precision)
AS 'MODULE_PATHNAME', 'knn_range_join'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 1000;

COMMENT ON FUNCTION knn_range_join(text, text, double precision, text, boolean, integer, boolean, text, text[]) IS
'Exact range join: every (query, target) pair whose distance is <= radius (< radius with inclusive => false), as the distance operator computes it, ranked per query by (distance, target id). queries and targets are SQL queries returning (integer id, vector | halfvec | real[] | double precision[] | bit), optionally followed by group key columns of hashable types: each query then meets only the targets whose keys all equal its own (NULL matches nothing); metric is l2, cosine, ip or l1 for vectors, hamming or jaccard for bit strings; exclude_self drops pairs with equal ids; k (NULL = no cap) keeps only the first k pairs of each query; method is auto, ti or brute; params gives $1, $2, ... of both query texts as in knn_join.';
