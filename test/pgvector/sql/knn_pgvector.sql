--
-- knn_gpu beside the real pgvector (installed first, so knn_gpu uses its
-- types): pgvector's vector and halfvec types, its distance operators
-- (bit's <~> and <%> included) and its approximate index access methods are
-- recognised by catalog identity; sparsevec is not read, whatever it is
-- called. (knn_pgvector_second: the other install order.)
--
CREATE EXTENSION vector;
CREATE EXTENSION knn_gpu;

-- knn_gpu created no type of its own: "vector" and "halfvec" are pgvector's,
-- and so are the bit operators <~> and <%>.
SELECT t.typname, e.extname
FROM pg_type t JOIN pg_depend d ON d.classid = 'pg_type'::regclass AND d.objid = t.oid AND d.deptype = 'e'
JOIN pg_extension e ON e.oid = d.refobjid
WHERE t.typname IN ('vector', 'halfvec', 'sparsevec') ORDER BY 1;
SELECT o.oprname, o.oprleft::regtype, e.extname
FROM pg_operator o JOIN pg_depend d ON d.classid = 'pg_operator'::regclass AND d.objid = o.oid AND d.deptype = 'e'
JOIN pg_extension e ON e.oid = d.refobjid
WHERE o.oprname IN ('<~>', '<%>', '<->') AND o.oprleft IN ('bit'::regtype, 'halfvec'::regtype)
ORDER BY 1, 2;

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

-- knn_join reads pgvector's halfvec, and returns what its operators order
-- by, for each metric (small integers: pgvector's F16C/FMA sums are exact).
SELECT m.metric, (SELECT count(*) FROM (
  (SELECT query_id, target_id, rank, distance
   FROM knn_join('SELECT id, h FROM items WHERE id <= 20', 'SELECT id, h FROM items', 5, m.metric))
  EXCEPT ALL
  (SELECT q.id, n.id, n.rank::int, n.d FROM items q CROSS JOIN LATERAL (
     SELECT t.id, CASE m.metric WHEN 'l2' THEN t.h <-> q.h WHEN 'cosine' THEN t.h <=> q.h
                    WHEN 'ip' THEN t.h <#> q.h ELSE t.h <+> q.h END AS d,
            row_number() OVER (ORDER BY CASE m.metric WHEN 'l2' THEN t.h <-> q.h WHEN 'cosine' THEN t.h <=> q.h
                    WHEN 'ip' THEN t.h <#> q.h ELSE t.h <+> q.h END, t.id) AS rank
     FROM items t ORDER BY 2, t.id LIMIT 5) n WHERE q.id <= 20)) x) AS differing
FROM (VALUES ('l2'), ('cosine'), ('ip'), ('l1')) m(metric);
SELECT knn_gpu_last_stats()->>'element' AS element;
-- halfvec queries with pgvector vector targets: as pgvector's implicit cast
SELECT count(*) AS differing FROM (
  (SELECT query_id, target_id, distance
   FROM knn_join('SELECT id, h FROM items WHERE id <= 20', 'SELECT id, v FROM items', 3))
  EXCEPT ALL
  (SELECT q.id, n.id, n.d FROM items q CROSS JOIN LATERAL (
     SELECT t.id, q.h <-> t.v AS d FROM items t ORDER BY 2, 1 LIMIT 3) n WHERE q.id <= 20)) x;
-- sparsevec belongs to pgvector but is not read.
SELECT * FROM knn_join('SELECT id, v::sparsevec FROM items', 'SELECT id, v FROM items', 1);

-- bit: pgvector's binary_quantize, its <~> and <%>, and knn_join's hamming
-- and jaccard give the same rows.
CREATE TABLE bits AS SELECT id, binary_quantize(v::vector - '[3,5,6]')::bit(3) AS b FROM items;
INSERT INTO bits SELECT id + 1000, ((id * 37) % 8)::bit(3) FROM items WHERE id <= 50;
SELECT m.metric, (SELECT count(*) FROM (
  (SELECT query_id, target_id, rank, distance
   FROM knn_join('SELECT id, b FROM bits WHERE id % 13 = 0', 'SELECT id, b FROM bits', 7, m.metric, true))
  EXCEPT ALL
  (SELECT q.id, n.id, n.rank::int, n.d FROM bits q CROSS JOIN LATERAL (
     SELECT t.id, CASE m.metric WHEN 'hamming' THEN t.b <~> q.b ELSE t.b <%> q.b END AS d,
            row_number() OVER (ORDER BY CASE m.metric WHEN 'hamming' THEN t.b <~> q.b ELSE t.b <%> q.b END, t.id) AS rank
     FROM bits t WHERE t.id <> q.id ORDER BY 2, t.id LIMIT 7) n WHERE q.id % 13 = 0)) x) AS differing
FROM (VALUES ('hamming'), ('jaccard')) m(metric);
SELECT count(*) AS rows FROM knn_join('SELECT id, b FROM bits WHERE id % 13 = 0', 'SELECT id, b FROM bits', 7, 'jaccard', true);
SELECT * FROM knn_join('SELECT id, b FROM bits', 'SELECT id, b FROM bits', 1, 'l2');

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

-- pgvector's halfvec and bit operators are planned as the KNN Join too,
-- with the nested loop's rows.
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM items q CROSS JOIN LATERAL (SELECT t.id FROM items t ORDER BY t.h <-> q.h LIMIT 3) n;
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM bits q CROSS JOIN LATERAL (SELECT t.id FROM bits t ORDER BY q.b <%> t.b LIMIT 3) n;
CREATE TEMP TABLE h_with AS
SELECT q.id AS qid, n.id, n.d FROM items q
CROSS JOIN LATERAL (SELECT t.id, t.h <=> q.h AS d FROM items t ORDER BY t.h <=> q.h, t.id LIMIT 4) n;
CREATE TEMP TABLE b_with AS
SELECT q.id AS qid, n.id, n.d FROM bits q
CROSS JOIN LATERAL (SELECT t.id, t.b <~> q.b AS d FROM bits t WHERE t.id <> q.id ORDER BY t.b <~> q.b, t.id LIMIT 4) n;
SET knn_gpu.enable_knn_join = off;
CREATE TEMP TABLE h_without AS
SELECT q.id AS qid, n.id, n.d FROM items q
CROSS JOIN LATERAL (SELECT t.id, t.h <=> q.h AS d FROM items t ORDER BY t.h <=> q.h, t.id LIMIT 4) n;
CREATE TEMP TABLE b_without AS
SELECT q.id AS qid, n.id, n.d FROM bits q
CROSS JOIN LATERAL (SELECT t.id, t.b <~> q.b AS d FROM bits t WHERE t.id <> q.id ORDER BY t.b <~> q.b, t.id LIMIT 4) n;
RESET knn_gpu.enable_knn_join;
SELECT (SELECT count(*) FROM h_with) AS halfvec_rows,
  (SELECT count(*) FROM ((TABLE h_with EXCEPT ALL TABLE h_without) UNION ALL (TABLE h_without EXCEPT ALL TABLE h_with)) x) AS halfvec_differing,
  (SELECT count(*) FROM b_with) AS bit_rows,
  (SELECT count(*) FROM ((TABLE b_with EXCEPT ALL TABLE b_without) UNION ALL (TABLE b_without EXCEPT ALL TABLE b_with)) x) AS bit_differing;

-- pgvector's hnsw index answers approximately: PostgreSQL's plan is kept,
-- unless knn_gpu.exact_over_index asks for exact results.
CREATE INDEX items_hnsw ON items USING hnsw (v vector_l2_ops);
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM items q CROSS JOIN LATERAL (SELECT t.id FROM items t ORDER BY t.v <-> q.v LIMIT 3) n;
SET knn_gpu.exact_over_index = on;
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM items q CROSS JOIN LATERAL (SELECT t.id FROM items t ORDER BY t.v <-> q.v LIMIT 3) n;
RESET knn_gpu.exact_over_index;
-- The same through a view (its column the indexed one, renamed) and
-- through a view that computes its vector (an expression index could
-- answer: any hnsw index on an expression counts); DEBUG1 says why.
CREATE VIEW items_view AS SELECT id AS ident, v AS vec FROM items;
CREATE VIEW items_computed AS SELECT id, (v + v)::vector(3) AS v FROM items;
CREATE INDEX items_hnsw_doubled ON items USING hnsw (((v + v)::vector(3)) vector_l2_ops);
SET client_min_messages = debug1;
EXPLAIN (COSTS OFF)
SELECT q.id, n.ident FROM items q CROSS JOIN LATERAL (SELECT t.ident FROM items_view t ORDER BY t.vec <-> q.v LIMIT 3) n;
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM items q CROSS JOIN LATERAL (SELECT t.id FROM items_computed t ORDER BY t.v <-> q.v LIMIT 3) n;
RESET client_min_messages;
SET knn_gpu.exact_over_index = on;
EXPLAIN (COSTS OFF)
SELECT q.id, n.ident FROM items q CROSS JOIN LATERAL (SELECT t.ident FROM items_view t ORDER BY t.vec <-> q.v LIMIT 3) n;
RESET knn_gpu.exact_over_index;
DROP VIEW items_view, items_computed;

-- The window form over a table with an approximate index: its rewrite into
-- the LATERAL form ("ORDER BY distance LIMIT k", which an index answers) is
-- kept only where a KNN Join runs it; else the query is planned as
-- written, and its rows are exact. (Distinct distances: row numbers do not
-- depend on the order of ties. ivfflat with one probe of 50 lists answers
-- the LATERAL form written by hand approximately.)
CREATE TABLE win_q (id int PRIMARY KEY, v vector(2));
CREATE TABLE win_t (id int PRIMARY KEY, v vector(2));
INSERT INTO win_q SELECT i, ARRAY[cos(i), sin(i * 1.7)]::vector(2) FROM generate_series(1, 20) i;
INSERT INTO win_t SELECT i, ARRAY[cos(i * 0.37) * 2, sin(i * 0.91) * 2]::vector(2) FROM generate_series(1, 2000) i;
CREATE INDEX win_t_ivfflat ON win_t USING ivfflat (v vector_l2_ops) WITH (lists = 50);
ANALYZE win_q, win_t;
SET ivfflat.probes = 1;
CREATE TEMP VIEW win_window AS
SELECT qid, tid, rn FROM (SELECT q.id AS qid, t.id AS tid,
                                 row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v) AS rn
                          FROM win_q q, win_t t) s WHERE rn <= 5;
SET client_min_messages = debug1;
EXPLAIN (COSTS OFF) SELECT * FROM win_window;
RESET client_min_messages;
CREATE TEMP TABLE win_rewrite_on AS SELECT * FROM win_window;
SET knn_gpu.exact_over_index = on;
EXPLAIN (COSTS OFF) SELECT * FROM win_window;
CREATE TEMP TABLE win_exact_node AS SELECT * FROM win_window;
RESET knn_gpu.exact_over_index;
SET knn_gpu.enable_knn_join = off;
CREATE TEMP TABLE win_as_written AS SELECT * FROM win_window;
CREATE TEMP TABLE win_lateral_index AS
SELECT q.id AS qid, n.id AS tid, row_number() OVER (PARTITION BY q.id ORDER BY n.d) AS rn
FROM win_q q CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS d FROM win_t t ORDER BY t.v <-> q.v LIMIT 5) n;
RESET knn_gpu.enable_knn_join;
RESET ivfflat.probes;
SELECT (SELECT count(*) FROM win_as_written) AS rows_as_written,
  (SELECT count(*) FROM ((TABLE win_rewrite_on EXCEPT ALL TABLE win_as_written)
                         UNION ALL (TABLE win_as_written EXCEPT ALL TABLE win_rewrite_on)) d) AS rewrite_differing,
  (SELECT count(*) FROM ((TABLE win_exact_node EXCEPT ALL TABLE win_as_written)
                         UNION ALL (TABLE win_as_written EXCEPT ALL TABLE win_exact_node)) d) AS node_differing,
  (SELECT count(*) FROM ((TABLE win_lateral_index EXCEPT ALL TABLE win_as_written)
                         UNION ALL (TABLE win_as_written EXCEPT ALL TABLE win_lateral_index)) d) > 0
    AS index_is_approximate;
DROP VIEW win_window;
DROP TABLE win_rewrite_on, win_exact_node, win_as_written, win_lateral_index;

-- The KNN Join's own scan of the targets never reads an approximate index:
-- here a tie key orders by a distance to a constant on an ivfflat-indexed
-- column, which the index would answer with one list's rows (sorts made
-- dear so that the planner wants it).
CREATE TABLE win_tw (id int PRIMARY KEY, v vector(2), w vector(2));
INSERT INTO win_tw SELECT i, ARRAY[cos(i * 0.37) * 2, sin(i * 0.91) * 2]::vector(2),
                          ARRAY[sin(i * 0.53), cos(i * 1.3)]::vector(2) FROM generate_series(1, 2000) i;
CREATE INDEX win_tw_w_ivfflat ON win_tw USING ivfflat (w vector_l2_ops) WITH (lists = 50);
ANALYZE win_tw;
SET ivfflat.probes = 1;
SET enable_sort = off;
CREATE TEMP VIEW win_tie_lateral AS
SELECT q.id AS qid, n.id AS tid, n.d FROM win_q q CROSS JOIN LATERAL (
  SELECT t.id, t.v <-> q.v AS d FROM win_tw t ORDER BY t.v <-> q.v, t.w <-> '[0,0]' LIMIT 5) n;
EXPLAIN (COSTS OFF) SELECT * FROM win_tie_lateral;
CREATE TEMP TABLE win_tie_node AS SELECT * FROM win_tie_lateral;
SET knn_gpu.enable_knn_join = off;
CREATE TEMP TABLE win_tie_postgres AS SELECT * FROM win_tie_lateral;
RESET knn_gpu.enable_knn_join;
RESET enable_sort;
RESET ivfflat.probes;
SELECT (SELECT count(*) FROM win_tie_node) AS node_rows,
  (SELECT count(*) FROM ((TABLE win_tie_node EXCEPT ALL TABLE win_tie_postgres)
                         UNION ALL (TABLE win_tie_postgres EXCEPT ALL TABLE win_tie_node)) d) AS differing;
DROP VIEW win_tie_lateral;
DROP TABLE win_q, win_t, win_tw, win_tie_node, win_tie_postgres;

DROP TABLE items, bits;
DROP EXTENSION knn_gpu;
DROP EXTENSION vector;
