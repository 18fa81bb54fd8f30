--
-- knn_gpu beside the real pgvector (installed first, so knn_gpu uses its
-- type): pgvector's vector type, its distance operators and its approximate
-- index access methods are recognised by catalog identity; its other types
-- (halfvec, sparsevec) are not read as vectors, whatever they are called.
--
CREATE EXTENSION vector;
CREATE EXTENSION knn_gpu;

-- knn_gpu created no type of its own: "vector" is pgvector's.
SELECT t.typname, e.extname
FROM pg_type t JOIN pg_depend d ON d.classid = 'pg_type'::regclass AND d.objid = t.oid AND d.deptype = 'e'
JOIN pg_extension e ON e.oid = d.refobjid
WHERE t.typname IN ('vector', 'halfvec', 'sparsevec') ORDER BY 1;

-- Small integers: every distance is exact, so pgvector's operators (built
-- with -fassociative-math) and knn_gpu's engine agree to the last bit.
CREATE TABLE items (id int, v vector(3), h halfvec(3));
INSERT INTO items
SELECT i, format('[%s,%s,%s]', i % 7, (i * 3) % 11, (i * 5) % 13)::vector,
       format('[%s,%s,%s]', i % 7, (i * 3) % 11, (i * 5) % 13)::halfvec
FROM generate_series(1, 400) i;
ANALYZE items;

-- knn_join reads pgvector's vector, and returns what its operators order by.
SELECT count(*) AS differing FROM (
  (SELECT query_id, target_id, rank, distance
   FROM knn_join('SELECT id, v FROM items WHERE id <= 20', 'SELECT id, v FROM items', 5, 'l1'))
  EXCEPT ALL
  (SELECT q.id, n.id, n.rank::int, n.d FROM items q CROSS JOIN LATERAL (
     SELECT t.id, t.v <+> q.v AS d, row_number() OVER (ORDER BY t.v <+> q.v, t.id) AS rank
     FROM items t ORDER BY t.v <+> q.v, t.id LIMIT 5) n WHERE q.id <= 20)) x;

-- halfvec and sparsevec belong to pgvector but are not vectors.
SELECT * FROM knn_join('SELECT id, h FROM items', 'SELECT id, h FROM items', 1);
SELECT * FROM knn_join('SELECT id, v::sparsevec FROM items', 'SELECT id, v FROM items', 1);

-- The LATERAL query with each of pgvector's distance operators is planned
-- as the KNN Join, with the metric of that operator ...
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM items q CROSS JOIN LATERAL (SELECT t.id FROM items t ORDER BY t.v <-> q.v LIMIT 3) n;
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM items q CROSS JOIN LATERAL (SELECT t.id FROM items t ORDER BY t.v <=> q.v LIMIT 3) n;
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM items q CROSS JOIN LATERAL (SELECT t.id FROM items t ORDER BY t.v <#> q.v LIMIT 3) n;
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM items q CROSS JOIN LATERAL (SELECT t.id FROM items t ORDER BY t.v <+> q.v LIMIT 3) n;
-- ... and gives the nested loop's rows (distances of small integers).
CREATE TEMP TABLE with_node AS
SELECT q.id AS qid, n.d FROM items q
CROSS JOIN LATERAL (SELECT t.v <-> q.v AS d FROM items t ORDER BY t.v <-> q.v LIMIT 4) n;
SET knn_gpu.enable_knn_join = off;
CREATE TEMP TABLE without_node AS
SELECT q.id AS qid, n.d FROM items q
CROSS JOIN LATERAL (SELECT t.v <-> q.v AS d FROM items t ORDER BY t.v <-> q.v LIMIT 4) n;
RESET knn_gpu.enable_knn_join;
SELECT count(*) AS rows, (SELECT count(*) FROM (TABLE with_node EXCEPT ALL TABLE without_node) x) AS differing
FROM with_node;

-- halfvec's <-> is pgvector's operator too, but not over vectors.
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM items q CROSS JOIN LATERAL (SELECT t.id FROM items t ORDER BY t.h <-> q.h LIMIT 3) n;

-- pgvector's hnsw index answers approximately: PostgreSQL's plan is kept,
-- unless knn_gpu.exact_over_index asks for exact results.
CREATE INDEX items_hnsw ON items USING hnsw (v vector_l2_ops);
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM items q CROSS JOIN LATERAL (SELECT t.id FROM items t ORDER BY t.v <-> q.v LIMIT 3) n;
SET knn_gpu.exact_over_index = on;
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM items q CROSS JOIN LATERAL (SELECT t.id FROM items t ORDER BY t.v <-> q.v LIMIT 3) n;
RESET knn_gpu.exact_over_index;

DROP TABLE items;
DROP EXTENSION knn_gpu;
DROP EXTENSION vector;
