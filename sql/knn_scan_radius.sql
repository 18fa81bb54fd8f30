--
-- The KNN Join with a radius in the LATERAL subquery
-- ("WHERE t.v <-> q.v < r", or <=, r a constant or a parameter), with or
-- without LIMIT: the engine's range join, returning what PostgreSQL's own
-- plan returns (knn_gpu.enable_knn_join = off): same rows, order and
-- distances.
--
SET extra_float_digits = 0;
SELECT setseed(0.31);

-- Coarse 2-d points (tied distances, duplicates), NULL vectors on both
-- sides, and a zero vector (cosine distance NaN).
CREATE TABLE knn_radius_items (id int, v vector(2));
INSERT INTO knn_radius_items
SELECT i, CASE WHEN i % 37 = 0 THEN NULL
			   ELSE format('[%s,%s]', floor(random() * 6), floor(random() * 6))::vector(2) END
FROM generate_series(1, 500) i;
INSERT INTO knn_radius_items VALUES (1000, '[0,0]');
CREATE TABLE knn_radius_queries (qn int, id int, v vector(2));
INSERT INTO knn_radius_queries
SELECT i, i * 3, CASE WHEN i % 19 = 0 THEN NULL
				   ELSE format('[%s,%s]', floor(random() * 6), floor(random() * 6))::vector(2) END
FROM generate_series(1, 100) i;
ANALYZE knn_radius_items, knn_radius_queries;

\i sql/knn_scan_helpers.psql

-- The plans: the radius shown, with and without LIMIT, either operand order.
EXPLAIN (COSTS OFF)
SELECT q.qn, n.id, n.dist
FROM knn_radius_queries q
CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_radius_items t
                    WHERE t.v <-> q.v < 1.5 ORDER BY t.v <-> q.v, t.id) n;
EXPLAIN (COSTS OFF)
SELECT q.qn, n.id, n.dist
FROM knn_radius_queries q
CROSS JOIN LATERAL (SELECT t.id, q.v <+> t.v AS dist FROM knn_radius_items t
                    WHERE 2 >= t.v <+> q.v AND t.id <> q.id
                    ORDER BY t.v <+> q.v LIMIT 3 OFFSET 1) n;
EXPLAIN (COSTS OFF)
SELECT q.qn, n.id, n.dist
FROM knn_radius_queries q
LEFT JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_radius_items t
                   WHERE t.v <-> q.v <= 1 AND t.id > 10 ORDER BY t.v <-> q.v, t.id) n ON true;

-- Every metric, < and <= at a tied distance, with and without LIMIT.
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_radius_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_radius_items t
	                    WHERE t.v <-> q.v < 2 ORDER BY t.v <-> q.v, t.id) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_radius_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_radius_items t
	                    WHERE t.v <-> q.v <= 2 ORDER BY t.v <-> q.v, t.id) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_radius_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <=> q.v AS dist FROM knn_radius_items t
	                    WHERE t.v <=> q.v <= 0.1 ORDER BY t.v <=> q.v, t.id) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_radius_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <#> q.v AS dist FROM knn_radius_items t
	                    WHERE t.v <#> q.v < -20 ORDER BY t.v <#> q.v, t.id LIMIT 5) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_radius_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <+> q.v AS dist FROM knn_radius_items t
	                    WHERE t.v <+> q.v <= 3 ORDER BY t.v <+> q.v, t.id LIMIT 4 OFFSET 2) n $$);

-- Radius 0 (duplicates only; none with <), a huge radius, a negative one.
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_radius_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_radius_items t
	                    WHERE t.v <-> q.v <= 0 ORDER BY t.v <-> q.v, t.id) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_radius_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_radius_items t
	                    WHERE t.v <-> q.v < 0 ORDER BY t.v <-> q.v, t.id) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_radius_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_radius_items t
	                    WHERE t.v <-> q.v < 1e300 ORDER BY t.v <-> q.v, t.id) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_radius_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_radius_items t
	                    WHERE t.v <-> q.v <= -1 ORDER BY t.v <-> q.v, t.id) n $$);

-- exclude_self, a filter on the inner relation, LEFT JOIN (rows without
-- neighbours within the radius kept with NULLs). (The filter cannot fail:
-- one that may, after the cheaper t.id <> q.id, keeps PostgreSQL's plan,
-- knn_scan_shapes.)
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_radius_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_radius_items t
	                    WHERE t.v <-> q.v <= 1.5 AND t.id <> q.id AND t.id > 250
	                    ORDER BY t.v <-> q.v, t.id) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_radius_queries q
	LEFT JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_radius_items t
	                   WHERE t.v <-> q.v < 0.5 ORDER BY t.v <-> q.v, t.id) n ON true $$);
-- A self-join of one table.
SELECT * FROM pg_temp.knn_check($$
	SELECT a.id AS qid, n.id AS nid, n.dist
	FROM knn_radius_items a
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> a.v AS dist FROM knn_radius_items t
	                    WHERE t.v <-> a.v < 1 AND t.id <> a.id ORDER BY t.v <-> a.v, t.id) n $$);

-- The radius as a parameter (a generic plan: evaluated once when the
-- node starts); NULL gives no neighbour (LEFT JOIN keeps the outer rows).
PREPARE knn_radius_p(float8) AS
SELECT q.qn AS qid, n.id AS nid, n.dist
FROM knn_radius_queries q
LEFT JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_radius_items t
                   WHERE t.v <-> q.v < $1 ORDER BY t.v <-> q.v, t.id) n ON true;
SET plan_cache_mode = force_generic_plan;
EXPLAIN (COSTS OFF) EXECUTE knn_radius_p(1.5);
CREATE TEMP TABLE radius_param_on AS EXECUTE knn_radius_p(1.5);
CREATE TEMP TABLE radius_param_null AS EXECUTE knn_radius_p(NULL);
DEALLOCATE knn_radius_p;
SET knn_gpu.enable_knn_join = off;
PREPARE knn_radius_p(float8) AS
SELECT q.qn AS qid, n.id AS nid, n.dist
FROM knn_radius_queries q
LEFT JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_radius_items t
                   WHERE t.v <-> q.v < $1 ORDER BY t.v <-> q.v, t.id) n ON true;
SELECT pg_temp.knn_uses_join('EXECUTE knn_radius_p(1.5)') AS node_off;
CREATE TEMP TABLE radius_param_off AS EXECUTE knn_radius_p(1.5);
CREATE TEMP TABLE radius_param_null_off AS EXECUTE knn_radius_p(NULL);
RESET knn_gpu.enable_knn_join;
RESET plan_cache_mode;
SELECT (SELECT count(*) FROM radius_param_on) AS rows_on,
       (SELECT count(*) FROM radius_param_off) AS rows_off,
       (SELECT count(*) FROM ((TABLE radius_param_on EXCEPT ALL TABLE radius_param_off)
                              UNION ALL
                              (TABLE radius_param_off EXCEPT ALL TABLE radius_param_on)) d) AS differing,
       (SELECT count(*) FROM radius_param_null WHERE nid IS NULL) AS null_rows_on,
       (SELECT count(*) FROM radius_param_null_off WHERE nid IS NULL) AS null_rows_off;

-- Group equalities with a radius: each group's queries against that
-- group's items; a NULL group matches nothing; one group of another
-- dimension (only pairs of one group are compared).
CREATE TABLE knn_radius_gi AS
SELECT id, v::vector AS v, CASE WHEN id % 7 = 0 THEN NULL ELSE id % 4 END AS g
FROM knn_radius_items;
INSERT INTO knn_radius_gi SELECT 2000 + i, format('[%s,%s,1]', i % 3, i % 2)::vector, 9
FROM generate_series(1, 20) i;
CREATE TABLE knn_radius_gq AS
SELECT qn, id, v::vector AS v, CASE WHEN qn % 11 = 0 THEN NULL ELSE qn % 5 END AS g
FROM knn_radius_queries;
INSERT INTO knn_radius_gq SELECT 200 + i, 3000 + i, format('[%s,1,%s]', i % 2, i % 3)::vector, 9
FROM generate_series(1, 5) i;
ANALYZE knn_radius_gi, knn_radius_gq;
EXPLAIN (COSTS OFF)
SELECT q.qn, n.id, n.dist
FROM knn_radius_gq q
CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_radius_gi t
                    WHERE t.g = q.g AND t.v <-> q.v <= 2 ORDER BY t.v <-> q.v, t.id) n;
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_radius_gq q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_radius_gi t
	                    WHERE t.g = q.g AND t.v <-> q.v <= 2 ORDER BY t.v <-> q.v, t.id) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_radius_gq q
	LEFT JOIN LATERAL (SELECT t.id, t.v <+> q.v AS dist FROM knn_radius_gi t
	                   WHERE t.g = q.g AND t.id <> q.id AND t.v <+> q.v < 2
	                   ORDER BY t.v <+> q.v, t.id LIMIT 3) n ON true $$);

-- halfvec and bit columns.
CREATE TABLE knn_radius_h AS SELECT id, v::halfvec(2) AS v FROM knn_radius_items;
CREATE TABLE knn_radius_qh AS SELECT qn, id, v::halfvec(2) AS v FROM knn_radius_queries;
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_radius_qh q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_radius_h t
	                    WHERE t.v <-> q.v <= 2 ORDER BY 2, t.id) n $$);
CREATE TABLE knn_radius_b AS SELECT i AS id, ((i * 37) % 4096)::bit(12) AS v FROM generate_series(1, 200) i;
SELECT * FROM pg_temp.knn_check($$
	SELECT a.id AS qid, n.id AS nid, n.dist
	FROM knn_radius_b a
	CROSS JOIN LATERAL (SELECT t.id, t.v <~> a.v AS dist FROM knn_radius_b t
	                    WHERE t.v <~> a.v <= 3 ORDER BY t.v <~> a.v, t.id) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT a.id AS qid, n.id AS nid, n.dist
	FROM knn_radius_b a
	CROSS JOIN LATERAL (SELECT t.id, t.v <%> a.v AS dist FROM knn_radius_b t
	                    WHERE t.v <%> a.v < 0.5 ORDER BY t.v <%> a.v, t.id LIMIT 3) n $$);

-- Without ORDER BY and LIMIT PostgreSQL pulls the subquery up into a plain
-- join; that join, however written, is a radius join too. Its rows have no
-- order: compared as multisets.
EXPLAIN (COSTS OFF)
SELECT q.qn, n.id
FROM knn_radius_queries q
CROSS JOIN LATERAL (SELECT t.id FROM knn_radius_items t WHERE t.v <-> q.v < 1.5) n;
EXPLAIN (COSTS OFF)
SELECT q.qn, t.id, t.v <+> q.v
FROM knn_radius_queries q JOIN knn_radius_items t ON 2 >= q.v <+> t.v AND t.id <> q.id
WHERE t.id % 3 <> 0;
EXPLAIN (COSTS OFF)
SELECT q.qn, t.id
FROM knn_radius_queries q LEFT JOIN knn_radius_items t ON t.v <-> q.v <= 0.5
WHERE t.id IS NULL OR t.id > 100;
SELECT node_on, node_off, rows_on, rows_off, differing FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_radius_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_radius_items t
	                    WHERE t.v <-> q.v < 1.5) n $$);
SELECT node_on, node_off, rows_on, rows_off, differing FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, t.id AS nid, t.v <+> q.v AS dist
	FROM knn_radius_queries q JOIN knn_radius_items t ON 2 >= q.v <+> t.v AND t.id <> q.id
	WHERE t.id % 3 <> 0 $$);
SELECT node_on, node_off, rows_on, rows_off, differing FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, t.id AS nid, t.v <=> q.v AS dist
	FROM knn_radius_queries q, knn_radius_items t WHERE t.v <=> q.v < 0.01 $$);
SELECT node_on, node_off, rows_on, rows_off, differing FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, t.id AS nid, t.v <-> q.v AS dist
	FROM knn_radius_queries q LEFT JOIN knn_radius_items t ON t.v <-> q.v <= 0.5
	WHERE t.id IS NULL OR t.id > 100 $$);
SELECT node_on, node_off, rows_on, rows_off, differing FROM pg_temp.knn_check($$
	SELECT a.id AS qid, b.id AS nid, a.v <~> b.v AS dist
	FROM knn_radius_b a JOIN knn_radius_b b ON a.v <~> b.v <= 2 AND a.id < b.id $$);
-- The outer side a join of its own, the inner side a subquery of its own.
SELECT node_on, node_off, rows_on, rows_off, differing FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, t.id AS nid, t.v <-> q2.v AS dist
	FROM knn_radius_queries q JOIN knn_radius_queries q2 ON q2.qn = q.qn + 1
	JOIN (SELECT id, v FROM knn_radius_items WHERE id > 50) t ON t.v <-> q2.v < 1 $$);

-- What keeps PostgreSQL's plan: a radius that depends on the outer row or
-- is a sub-select, a second radius; a NULL constant radius (PostgreSQL
-- folds the condition away).
SELECT pg_temp.knn_uses_join($$
	SELECT q.qn, n.id FROM knn_radius_queries q
	CROSS JOIN LATERAL (SELECT t.id FROM knn_radius_items t
	                    WHERE t.v <-> q.v < q.qn ORDER BY t.v <-> q.v) n $$) AS outer_radius;
SELECT pg_temp.knn_uses_join($$
	SELECT q.qn, n.id FROM knn_radius_queries q
	CROSS JOIN LATERAL (SELECT t.id FROM knn_radius_items t
	                    WHERE t.v <-> q.v < 1 AND t.v <-> q.v < 2 ORDER BY t.v <-> q.v) n $$) AS two_radii;
SELECT pg_temp.knn_uses_join($$
	SELECT q.qn, n.id FROM knn_radius_queries q
	CROSS JOIN LATERAL (SELECT t.id FROM knn_radius_items t
	                    WHERE t.v <-> q.v < (SELECT 1.5::float8) ORDER BY t.v <-> q.v) n $$) AS sub_select;
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_radius_queries q
	LEFT JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_radius_items t
	                   WHERE t.v <-> q.v < NULL::float8 ORDER BY t.v <-> q.v, t.id) n ON true $$);

DROP TABLE knn_radius_items, knn_radius_queries, knn_radius_h, knn_radius_qh, knn_radius_b,
	knn_radius_gi, knn_radius_gq;
