--
-- The KNN Join custom scan: the pgvector-style LATERAL top-k query,
-- unchanged, runs as one Custom Scan (KNN Join) with the same results.
--
-- The library (and with it the planner hook) loads on first use: the
-- inserts below call the vector type's input function.
--
SET extra_float_digits = 0;

-- 12 rows near the origin (two NULL vectors, a duplicate of [1,0]), then
-- 3000 rows far away (every coordinate >= 100) so that PostgreSQL's own
-- nested loop is costly enough for the batched join to be chosen.
CREATE TABLE knn_scan_items (id int, v vector, tag text);
INSERT INTO knn_scan_items VALUES
	(1, '[0,0]', 'a'), (2, '[1,0]', 'b'), (3, '[0,1]', 'c'), (4, '[1,1]', 'd'),
	(5, '[2,0]', 'e'), (6, NULL, 'f'), (7, '[3,4]', 'g'), (8, '[-1,0]', 'h'),
	(9, NULL, 'i'), (10, '[0,-2]', 'j'), (11, '[1,0]', 'k'), (12, '[5,5]', 'l');
INSERT INTO knn_scan_items
	SELECT i, format('[%s,%s]', 100 + i % 50, 200 + i % 70)::vector, 'far'
	FROM generate_series(1001, 4000) i;
CREATE TABLE knn_scan_queries (id int, v vector, name text);
INSERT INTO knn_scan_queries VALUES
	(1, '[0,0]', 'origin'), (2, '[1,0]', 'x'), (3, NULL, 'none'), (4, '[2,2]', 'diag'),
	(5, '[0,0]', 'origin again'), (6, '[-3,1]', 'left'), (7, '[4,4]', 'far diag'),
	(8, '[1,2]', 'up');
ANALYZE knn_scan_items, knn_scan_queries;

\i sql/knn_scan_helpers.psql

-- The issue's query: one Custom Scan (KNN Join) over both relations.
EXPLAIN (COSTS OFF)
SELECT q.id, n.id AS neighbour, n.dist
FROM knn_scan_queries q
CROSS JOIN LATERAL (
    SELECT t.id, t.v <-> q.v AS dist
    FROM knn_scan_items t
    ORDER BY t.v <-> q.v
    LIMIT 3) n;

-- Its rows, worked out by hand (sqrt(2) = 1.4142135623731, sqrt(5) =
-- 2.23606797749979, sqrt(10) = 3.16227766016838, sqrt(18) = 4.24264068711928).
-- Ties come in the inner scan's order, here the order of ids:
--  1 [0,0]:  1 at 0; 2, 3, 8, 11 at 1                -> 1, 2, 3
--  2 [1,0]:  2, 11 at 0; 1, 4, 5 at 1                -> 2, 11, 1
--  3 NULL:   every distance NULL: the first rows      -> 1, 2, 3
--  4 [2,2]:  4 at sqrt(2); 5 at 2; 2, 3, 7, 11 at sqrt(5) -> 4, 5, 2
--  5 [0,0]:  as 1
--  6 [-3,1]: 8 at sqrt(5); 3 at 3; 1 at sqrt(10)
--  7 [4,4]:  7 at 1; 12 at sqrt(2); 4 at sqrt(18)
--  8 [1,2]:  4 at 1; 3 at sqrt(2); 2, 11 at 2         -> 4, 3, 2
SELECT q.id, n.id AS neighbour, n.dist
FROM knn_scan_queries q
CROSS JOIN LATERAL (
    SELECT t.id, t.v <-> q.v AS dist
    FROM knn_scan_items t
    ORDER BY t.v <-> q.v
    LIMIT 3) n;

-- The same query without the node: the same distances in the same order
-- (the neighbours may differ only among ties).
SELECT * FROM pg_temp.knn_check($$
	SELECT q.id AS qid, n.id AS nid, n.dist
	FROM knn_scan_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_scan_items t
	                    ORDER BY t.v <-> q.v LIMIT 3) n $$, false);

-- Every metric, both spellings of the join, operands in either order, the
-- ORDER BY by expression, alias or position. k = 10 reaches the far rows for
-- some queries; no ties at the 10th place, so neighbours are compared too.
SELECT * FROM pg_temp.knn_check($$
	SELECT q.id AS qid, n.id AS nid, n.dist
	FROM knn_scan_queries q
	JOIN LATERAL (SELECT t.id, q.v <-> t.v AS dist FROM knn_scan_items t
	              ORDER BY dist LIMIT 10) n ON true $$, false);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.id AS qid, n.id AS nid, n.dist
	FROM knn_scan_queries q,
	LATERAL (SELECT t.id, t.v <=> q.v AS dist FROM knn_scan_items t
	         ORDER BY q.v <=> t.v LIMIT 4) n $$, false);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.id AS qid, n.id AS nid, n.dist
	FROM knn_scan_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <#> q.v AS dist FROM knn_scan_items t
	                    ORDER BY 2 LIMIT 5) n $$, false);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.id AS qid, n.id AS nid, n.dist
	FROM knn_scan_queries q
	CROSS JOIN LATERAL (SELECT t.v <+> q.v AS dist, t.id FROM knn_scan_items t
	                    ORDER BY t.v <+> q.v LIMIT 6) n $$, false);
-- Far from the ties near the origin: unique distances, ids compared.
SELECT * FROM pg_temp.knn_check($$
	SELECT q.id AS qid, n.id AS nid, n.dist
	FROM (VALUES (1, '[120.5,230.25]'::vector), (2, '[140.5,201.5]'), (3, '[101,260.75]'),
	             (4, '[130.25,215.5]'), (5, '[149,268.5]')) q(id, v)
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_scan_items t
	                    WHERE t.id % 7 <> 0
	                    ORDER BY t.v <-> q.v LIMIT 1) n $$);

-- Filters on the outer side and on the inner relation (before the LIMIT),
-- filters on the subquery's output and join clauses (after it), any columns
-- and expressions of both sides.
EXPLAIN (COSTS OFF)
SELECT q.id AS qid, q.name, n.id AS nid, n.tag, n.twice, n.dist, q.id * 100 + n.id AS both_sides
FROM knn_scan_queries q
CROSS JOIN LATERAL (SELECT t.id, t.tag, t.id * 2 AS twice, t.v <-> q.v AS dist
                    FROM knn_scan_items t WHERE t.tag <> 'c'
                    ORDER BY t.v <-> q.v LIMIT 4) n
WHERE q.id <> 2 AND n.dist < 2.5 AND n.id <> q.id;
SELECT q.id AS qid, q.name, n.id AS nid, n.tag, n.twice, n.dist, q.id * 100 + n.id AS both_sides
FROM knn_scan_queries q
CROSS JOIN LATERAL (SELECT t.id, t.tag, t.id * 2 AS twice, t.v <-> q.v AS dist
                    FROM knn_scan_items t WHERE t.tag <> 'c'
                    ORDER BY t.v <-> q.v LIMIT 4) n
WHERE q.id <> 2 AND n.dist < 2.5 AND n.id <> q.id;
SELECT * FROM pg_temp.knn_check($$
	SELECT q.id AS qid, n.id AS nid, n.dist
	FROM knn_scan_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.tag, t.id * 2 AS twice, t.v <-> q.v AS dist
	                    FROM knn_scan_items t WHERE t.tag <> 'c'
	                    ORDER BY t.v <-> q.v LIMIT 4) n
	WHERE q.id <> 2 AND n.dist < 2.5 AND n.id <> q.id $$, false);

-- NULL vectors. Inner rows 4..9: 4 [1,1], 5 [2,0], 6 NULL, 7 [3,4],
-- 8 [-1,0], 9 NULL; k = 5 is more than the 4 non-NULL vectors, so a row
-- with a NULL distance fills the 5th place (6, the first in scan order),
-- as ORDER BY ... ASC puts NULLs last. The NULL query gets the first 5 rows.
--  1 [0,0]:  4 sqrt(2), 5 2, 7 5, 8 1           -> 8, 4, 5, 7
--  2 [1,0]:  4 1, 5 1, 7 sqrt(20), 8 2          -> 4, 5, 8, 7
--  4 [2,2]:  4 sqrt(2), 5 2, 7 sqrt(5), 8 sqrt(13)
--  5 [0,0]:  as 1
--  6 [-3,1]: 4 4, 5 sqrt(26), 7 sqrt(45), 8 sqrt(5)
--  7 [4,4]:  4 sqrt(18), 5 sqrt(20), 7 1, 8 sqrt(41)
--  8 [1,2]:  4 1, 5 sqrt(5), 7 sqrt(8), 8 sqrt(8) -> 4, 5, 7, 8
SELECT * FROM pg_temp.knn_show($$
	SELECT q.id AS qid, n.id AS nid, n.dist
	FROM knn_scan_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_scan_items t
	                    WHERE t.id BETWEEN 4 AND 9
	                    ORDER BY t.v <-> q.v LIMIT 5) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.id AS qid, n.id AS nid, n.dist
	FROM knn_scan_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_scan_items t
	                    WHERE t.id BETWEEN 4 AND 9
	                    ORDER BY t.v <-> q.v LIMIT 5) n $$, false);

-- Cosine: [0,0] has no direction, its distance to anything is NaN, which
-- sorts after every number and before NULL. Inner rows 1..6.
--  2 [1,0]:  2 0, 5 0, 4 1-1/sqrt(2), 3 1, 1 NaN, 6 NULL
--  4 [2,2]:  4 0, 2 and 3 and 5 1-1/sqrt(2), 1 NaN, 6 NULL
--  1, 5 [0,0]: NaN for every vector, then NULL
SELECT * FROM pg_temp.knn_show($$
	SELECT q.id AS qid, n.id AS nid, n.dist
	FROM knn_scan_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <=> q.v AS dist FROM knn_scan_items t
	                    WHERE t.id <= 6
	                    ORDER BY t.v <=> q.v LIMIT 6) n $$)
WHERE qid IN (1, 2, 4, 5);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.id AS qid, n.id AS nid, n.dist
	FROM knn_scan_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <=> q.v AS dist FROM knn_scan_items t
	                    WHERE t.id <= 6
	                    ORDER BY t.v <=> q.v LIMIT 6) n $$, false);

-- LIMIT NULL is no limit; LIMIT 0 gives nothing; a constant expression.
SELECT * FROM pg_temp.knn_check($$
	SELECT q.id AS qid, n.id AS nid, n.dist
	FROM knn_scan_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_scan_items t
	                    WHERE t.id < 100 ORDER BY t.v <-> q.v LIMIT NULL) n $$, false);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.id AS qid, n.id AS nid, n.dist
	FROM knn_scan_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_scan_items t
	                    ORDER BY t.v <-> q.v LIMIT 0) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.id AS qid, n.id AS nid, n.dist
	FROM knn_scan_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_scan_items t
	                    ORDER BY t.v <-> q.v LIMIT 1 + 1) n $$, false);

-- A self-join, an outer side that is itself a join, a second KNN join on
-- top of the first, an aggregate over the join (no columns needed).
SELECT * FROM pg_temp.knn_check($$
	SELECT a.id AS qid, n.id AS nid, n.dist
	FROM knn_scan_items a
	CROSS JOIN LATERAL (SELECT b.id, a.v <-> b.v AS dist FROM knn_scan_items b
	                    ORDER BY a.v <-> b.v LIMIT 2) n
	WHERE a.id % 10 = 3 $$, false);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.id * 10 + r.id AS qid, n.id AS nid, n.dist
	FROM knn_scan_queries q JOIN knn_scan_queries r ON r.id = q.id % 3 + 1
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_scan_items t
	                    ORDER BY t.v <-> q.v LIMIT 3) n $$, false);
EXPLAIN (COSTS OFF)
SELECT q.id, a.id, b.id
FROM knn_scan_queries q
CROSS JOIN LATERAL (SELECT t.id, t.v FROM knn_scan_items t ORDER BY t.v <-> q.v LIMIT 2) a
CROSS JOIN LATERAL (SELECT t.id FROM knn_scan_items t ORDER BY t.v <+> a.v LIMIT 2) b;
-- (Each query's nearest row is unique here, so qid is the same both ways.)
SELECT * FROM pg_temp.knn_check($$
	SELECT q.id * 100 + a.id AS qid, b.id AS nid, b.dist
	FROM knn_scan_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v FROM knn_scan_items t WHERE t.id <> 11
	                    ORDER BY t.v <-> q.v LIMIT 1) a
	CROSS JOIN LATERAL (SELECT t.id, t.v <+> a.v AS dist FROM knn_scan_items t
	                    ORDER BY t.v <+> a.v LIMIT 3) b
	WHERE q.v IS NOT NULL $$, false);
SELECT pg_temp.knn_uses_join($$
	SELECT count(*) FROM knn_scan_queries q
	CROSS JOIN LATERAL (SELECT t.id FROM knn_scan_items t ORDER BY t.v <-> q.v LIMIT 7) n $$);
SELECT count(*) FROM knn_scan_queries q
CROSS JOIN LATERAL (SELECT t.id FROM knn_scan_items t ORDER BY t.v <-> q.v LIMIT 7) n;
SELECT pg_temp.knn_uses_join($$
	SELECT count(*), sum(n.dist) FROM knn_scan_queries q
	CROSS JOIN LATERAL (SELECT t.v <-> q.v AS dist FROM knn_scan_items t ORDER BY 1 LIMIT 7) n $$);
SELECT count(*), sum(n.dist) FROM knn_scan_queries q
CROSS JOIN LATERAL (SELECT t.v <-> q.v AS dist FROM knn_scan_items t ORDER BY 1 LIMIT 7) n;
SET knn_gpu.enable_knn_join = off;
SELECT count(*), sum(n.dist) FROM knn_scan_queries q
CROSS JOIN LATERAL (SELECT t.v <-> q.v AS dist FROM knn_scan_items t ORDER BY 1 LIMIT 7) n;
RESET knn_gpu.enable_knn_join;

-- A partitioned inner relation: the inner scan plan is PostgreSQL's.
CREATE TABLE knn_scan_parts (id int, v vector) PARTITION BY RANGE (id);
CREATE TABLE knn_scan_parts_low PARTITION OF knn_scan_parts FOR VALUES FROM (0) TO (1000);
CREATE TABLE knn_scan_parts_high PARTITION OF knn_scan_parts FOR VALUES FROM (1000) TO (10000);
INSERT INTO knn_scan_parts SELECT id, v FROM knn_scan_items;
ANALYZE knn_scan_parts;
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM knn_scan_queries q
CROSS JOIN LATERAL (SELECT t.id FROM knn_scan_parts t WHERE t.id <> 3
                    ORDER BY t.v <-> q.v LIMIT 3) n;
SELECT * FROM pg_temp.knn_check($$
	SELECT q.id AS qid, n.id AS nid, n.dist
	FROM knn_scan_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_scan_parts t WHERE t.id <> 3
	                    ORDER BY t.v <-> q.v LIMIT 3) n $$, false);

-- EXPLAIN VERBOSE: the node's output, and each child's.
EXPLAIN (VERBOSE, COSTS OFF)
SELECT q.name, n.tag, n.dist
FROM knn_scan_queries q
CROSS JOIN LATERAL (SELECT t.tag, t.v <=> q.v AS dist FROM knn_scan_items t
                    ORDER BY t.v <=> q.v LIMIT 2) n;

-- EXPLAIN ANALYZE adds the engine's statistics (pg_temp.knn_explain_analyze
-- of sql/knn_scan_helpers.psql masks what depends on the machine).
SELECT * FROM pg_temp.knn_explain_analyze($$
	SELECT q.id, n.id, n.dist
	FROM knn_scan_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_scan_items t
	                    ORDER BY t.v <-> q.v LIMIT 3) n
	WHERE n.dist > 0 $$);

-- Prepared statements: LIMIT $1, custom and generic plans.
PREPARE knn_scan_stmt(int) AS
	SELECT q.id, n.id AS neighbour, n.dist
	FROM knn_scan_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_scan_items t
	                    ORDER BY t.v <-> q.v LIMIT $1) n;
EXPLAIN (COSTS OFF) EXECUTE knn_scan_stmt(1);
-- The first column of the table above.
EXECUTE knn_scan_stmt(1);
SET plan_cache_mode = force_generic_plan;
EXPLAIN (COSTS OFF) EXECUTE knn_scan_stmt(2);
-- The first two columns of the table above.
EXECUTE knn_scan_stmt(2);
EXECUTE knn_scan_stmt(0);
EXECUTE knn_scan_stmt(-1);
RESET plan_cache_mode;
DEALLOCATE knn_scan_stmt;

-- Rescans: the node inside a correlated subquery, re-run per outer row with
-- a new parameter (o.x filters its outer side). Nearest of each query:
-- 1>1 2>2 3>1 4>4 5>1 6>8 7>7 8>4 (3 has a NULL vector: the first row).
EXPLAIN (COSTS OFF)
SELECT o.x, (SELECT string_agg(q.id || '>' || n.id, ' ')
             FROM knn_scan_queries q
             CROSS JOIN LATERAL (SELECT t.id FROM knn_scan_items t
                                 ORDER BY t.v <-> q.v LIMIT 1) n
             WHERE q.id <> o.x)
FROM generate_series(2, 4) o(x);
SELECT o.x, (SELECT string_agg(q.id || '>' || n.id, ' ')
             FROM knn_scan_queries q
             CROSS JOIN LATERAL (SELECT t.id FROM knn_scan_items t
                                 ORDER BY t.v <-> q.v LIMIT 1) n
             WHERE q.id <> o.x)
FROM generate_series(2, 4) o(x);
-- EXPLAIN ANALYZE of the rescanned node: its statistics cover every
-- execution, as PostgreSQL's figures cover every loop: "Engine Calls" and
-- the sums of the queries (6 + 7 + 6: one has a NULL vector), targets
-- (3010 each) and pairs.
SELECT * FROM pg_temp.knn_explain_analyze($$
SELECT o.x, (SELECT string_agg(q.id || '>' || n.id, ' ')
             FROM knn_scan_queries q
             CROSS JOIN LATERAL (SELECT t.id FROM knn_scan_items t
                                 ORDER BY t.v <-> q.v LIMIT 1) n
             WHERE q.id <> o.x)
FROM generate_series(2, 4) o(x) $$);
-- An execution that runs no engine (no outer row) adds nothing; the
-- others' runs are still shown (one run: no "Engine Calls").
SELECT * FROM pg_temp.knn_explain_analyze($$
SELECT o.x, (SELECT string_agg(q.id || '>' || n.id, ' ')
             FROM knn_scan_queries q
             CROSS JOIN LATERAL (SELECT t.id FROM knn_scan_items t
                                 ORDER BY t.v <-> q.v LIMIT 1) n
             WHERE q.id < o.x)
FROM (VALUES (2), (0)) o(x) $$);

-- Cursors: fetched in pieces, and scrollable (the planner puts a
-- Materialize on top, as the node reads its children only forwards).
SET cursor_tuple_fraction = 1.0;
BEGIN;
DECLARE knn_scan_cursor CURSOR FOR
	SELECT q.id, n.id AS neighbour, n.dist
	FROM knn_scan_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_scan_items t
	                    ORDER BY t.v <-> q.v LIMIT 2) n;
FETCH 3 FROM knn_scan_cursor;
FETCH 14 FROM knn_scan_cursor;
FETCH 5 FROM knn_scan_cursor;
CLOSE knn_scan_cursor;
EXPLAIN (COSTS OFF) DECLARE knn_scan_scroll SCROLL CURSOR FOR
	SELECT q.id, n.id AS neighbour, n.dist
	FROM knn_scan_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_scan_items t
	                    ORDER BY t.v <-> q.v LIMIT 2) n;
DECLARE knn_scan_scroll SCROLL CURSOR FOR
	SELECT q.id, n.id AS neighbour, n.dist
	FROM knn_scan_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_scan_items t
	                    ORDER BY t.v <-> q.v LIMIT 2) n;
FETCH 4 FROM knn_scan_scroll;
FETCH BACKWARD 3 FROM knn_scan_scroll;
FETCH LAST FROM knn_scan_scroll;
COMMIT;
RESET cursor_tuple_fraction;

-- Parallel query settings: the node stays in the leader; its children may
-- be parallel plans.
SET parallel_setup_cost = 0;
SET parallel_tuple_cost = 0;
SET min_parallel_table_scan_size = 0;
SET max_parallel_workers_per_gather = 2;
SELECT * FROM pg_temp.knn_check($$
	SELECT q.id AS qid, n.id AS nid, n.dist
	FROM knn_scan_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_scan_items t
	                    ORDER BY t.v <-> q.v LIMIT 3) n $$, false);
RESET parallel_setup_cost;
RESET parallel_tuple_cost;
RESET min_parallel_table_scan_size;
RESET max_parallel_workers_per_gather;

-- Errors happen where the nested loop's would. Vectors of different
-- dimensions: the operator's error, with the node and without.
CREATE TABLE knn_scan_mixed (id int, v vector);
INSERT INTO knn_scan_mixed SELECT id, v FROM knn_scan_items WHERE v IS NOT NULL;
INSERT INTO knn_scan_mixed VALUES (5000, '[1,2,3]');
ANALYZE knn_scan_mixed;
SELECT pg_temp.knn_uses_join($$
	SELECT q.id, n.id FROM knn_scan_queries q
	CROSS JOIN LATERAL (SELECT t.id FROM knn_scan_mixed t ORDER BY t.v <-> q.v LIMIT 1) n $$);
SELECT q.id, n.id FROM knn_scan_queries q
CROSS JOIN LATERAL (SELECT t.id FROM knn_scan_mixed t ORDER BY t.v <-> q.v LIMIT 1) n;
SET knn_gpu.enable_knn_join = off;
SELECT q.id, n.id FROM knn_scan_queries q
CROSS JOIN LATERAL (SELECT t.id FROM knn_scan_mixed t ORDER BY t.v <-> q.v LIMIT 1) n;
RESET knn_gpu.enable_knn_join;
-- With only NULL query vectors there is no pair of vectors, so no error:
-- every distance is NULL and the first k rows come.
CREATE TABLE knn_scan_no_vectors (id int, v vector);
INSERT INTO knn_scan_no_vectors SELECT i, NULL FROM generate_series(1, 50) i;
ANALYZE knn_scan_no_vectors;
SELECT * FROM pg_temp.knn_show($$
	SELECT q.id AS qid, n.id AS nid, n.dist
	FROM knn_scan_no_vectors q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_scan_mixed t
	                    ORDER BY t.v <-> q.v LIMIT 2) n $$)
WHERE qid <= 2;
-- A negative LIMIT is an error once there is an outer row, not before
-- (knn_scan_empty has never been analysed: the planner expects rows).
SELECT q.id, n.id FROM knn_scan_queries q
CROSS JOIN LATERAL (SELECT t.id FROM knn_scan_items t ORDER BY t.v <-> q.v LIMIT -1) n;
CREATE TABLE knn_scan_empty (id int, v vector);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.id AS qid, n.id AS nid, n.dist
	FROM knn_scan_empty q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_scan_items t
	                    ORDER BY t.v <-> q.v LIMIT -1) n $$);

-- A self-join of one table: both sides read the same vectors in the same
-- order, so the engine gets one matrix (with the CPU's TI join, one shared
-- clustering); the rows are the nested loop's (ties by id: the data has
-- equal distances at the k-th place).
SET knn_gpu.device = cpu;
CREATE TABLE knn_scan_self AS
SELECT i AS id, format('[%s,%s,%s]', (i * 37) % 1001, (i * 11) % 997, (i * 7) % 89)::vector AS v
FROM generate_series(1, 3000) i;
ANALYZE knn_scan_self;
SELECT * FROM pg_temp.knn_check($$
	SELECT q.id AS qid, n.id AS nid, n.dist
	FROM knn_scan_self q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_scan_self t
	                    ORDER BY t.v <-> q.v, t.id LIMIT 4) n $$);
SELECT count(*) FROM knn_scan_self q
CROSS JOIN LATERAL (SELECT t.id FROM knn_scan_self t ORDER BY t.v <-> q.v, t.id LIMIT 4) n;
SELECT s->>'method' <> 'ti' OR s->>'variant' LIKE '%shared-clusters%' AS one_matrix
FROM knn_gpu_last_stats() s;
RESET knn_gpu.device;

DROP TABLE knn_scan_items, knn_scan_queries, knn_scan_parts, knn_scan_mixed,
	knn_scan_no_vectors, knn_scan_empty, knn_scan_self;
