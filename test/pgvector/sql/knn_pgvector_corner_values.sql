--
-- Corner values under cosine and the inner product with pgvector's vector
-- and halfvec: the body of sql/knn_corner_values.sql (knn_gpu's own types),
-- sql/knn_corner_values.psql, under pgvector's operators. Where a sum
-- overflows, pgvector's order of additions (and fused multiply-adds) may
-- give another value than the engine's canonical one: [3e38,3e38,0] <#>
-- [3e38,-3e38,0] is -Infinity by pgvector's operator, NaN by knn_gpu's.
-- (The values printed, and so the counts of rows within the radii, are
-- those of pgvector as ../shared/pgvector/build.sh builds it, on a CPU with
-- FMA, which its target_clones then pick; the counts of differing rows are
-- 0 whatever pgvector computes.)
-- Every entry point returns pgvector's values and ranks by them
-- (knn_operator_values.c: a canonical value that is not finite bounds
-- nothing, so such queries are ranked by the operator over more targets).
--
CREATE EXTENSION vector;
CREATE EXTENSION knn_gpu;
LOAD 'knn_gpu';

\i sql/knn_corner_values.psql

DROP EXTENSION knn_gpu;
DROP EXTENSION vector;
