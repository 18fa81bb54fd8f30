--
-- Corner values under cosine and the inner product with knn_gpu's own
-- vector and halfvec: zero vectors, subnormal and huge components, norms
-- and dot products that overflow. knn_join, knn_range_join, the LATERAL
-- forms the KNN Join node replaces and a join on a radius all return
-- PostgreSQL's own answer with the same operator, bit for bit (the body,
-- shared with test/pgvector/sql/knn_pgvector_corner_values.sql, is
-- sql/knn_corner_values.psql).
--
\i sql/knn_corner_values.psql
