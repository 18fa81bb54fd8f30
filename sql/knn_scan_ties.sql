--
-- FETCH FIRST n ROWS WITH TIES inside the LATERAL subquery, as a KNN Join:
-- the first n rows and every further row equal to the n-th on all ORDER BY
-- keys (the distance, then the keys after it), exactly as PostgreSQL's plan
-- (knn_gpu.enable_knn_join = off) returns them. Ties can run far past n:
-- the engine is asked for n + 1 rows and the queries whose ties go on run
-- again with twice as many (knn_scan_ties.c), which the groups of 40 and
-- 300 duplicates below exercise.
--
SET extra_float_digits = 0;

-- A coarse grid (many equal distances), 40 copies of [0,0], 300 of [9,9],
-- NULL vectors, and a text tag in a case-insensitive collation (tie keys
-- that are equal without being identical).
CREATE COLLATION knn_ties_ci (provider = icu, locale = 'und-u-ks-level2',
                              deterministic = false);
CREATE TABLE knn_ties_items (id int, v vector(2), g int, tag text COLLATE knn_ties_ci);
INSERT INTO knn_ties_items
SELECT i, CASE WHEN i % 53 = 0 THEN NULL
               ELSE format('[%s,%s]', i % 7, (i / 7) % 5)::vector(2) END,
       i % 3, CASE i % 4 WHEN 0 THEN 'a' WHEN 1 THEN 'A' WHEN 2 THEN 'b' ELSE NULL END
FROM generate_series(1, 1500) i;
INSERT INTO knn_ties_items SELECT 2000 + i, '[0,0]', i % 3, 'x' FROM generate_series(1, 40) i;
INSERT INTO knn_ties_items SELECT 3000 + i, '[9,9]', i % 3, 'y' FROM generate_series(1, 300) i;
CREATE TABLE knn_ties_queries (qn int, id int, v vector(2), g int);
INSERT INTO knn_ties_queries
SELECT i, i * 5, CASE WHEN i % 17 = 0 THEN NULL
                      ELSE format('[%s,%s]', (i * 3) % 10, (i * 7) % 10)::vector(2) END,
       CASE WHEN i % 13 = 0 THEN NULL ELSE i % 3 END
FROM generate_series(1, 60) i;
INSERT INTO knn_ties_queries VALUES (100, 2001, '[0,0]', 1), (101, 3001, '[9,9]', 2),
	(102, 7, '[9.5,9.5]', 0);
ANALYZE knn_ties_items, knn_ties_queries;

\i sql/knn_scan_helpers.psql

-- The plan says "With Ties".
EXPLAIN (COSTS OFF)
SELECT q.qn, n.id, n.dist
FROM knn_ties_queries q
CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_ties_items t
                    ORDER BY t.v <-> q.v FETCH FIRST 3 ROWS WITH TIES) n;

-- Ties on the distance alone: every row tied with the n-th comes, so the
-- ids are compared too (only their order within a tie is PostgreSQL's to
-- choose). By hand for the duplicates: qn 100 at [0,0] gets all 40 copies
-- and item 35 ([0,0] too: 35 % 7 = 0, 35 / 7 % 5 = 0), ...
SELECT qid, count(*) AS rows, count(DISTINCT dist) AS distances
FROM pg_temp.knn_show($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_ties_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_ties_items t
	                    ORDER BY t.v <-> q.v FETCH FIRST 3 ROWS WITH TIES) n $$) s,
	LATERAL (SELECT split_part(x, ':', 2) AS dist FROM unnest(string_to_array(s.neighbours, ' ')) x) d
WHERE qid >= 100 GROUP BY qid ORDER BY qid;
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_ties_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_ties_items t
	                    ORDER BY t.v <-> q.v FETCH FIRST 3 ROWS WITH TIES) n $$);
-- Every metric, n from 1 to beyond one group of duplicates.
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_ties_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <=> q.v AS dist FROM knn_ties_items t
	                    ORDER BY t.v <=> q.v FETCH FIRST 1 ROW WITH TIES) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_ties_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <#> q.v AS dist FROM knn_ties_items t
	                    ORDER BY t.v <#> q.v FETCH FIRST 7 ROWS WITH TIES) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_ties_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <+> q.v AS dist FROM knn_ties_items t
	                    ORDER BY t.v <+> q.v FETCH FIRST 45 ROWS WITH TIES) n $$);

-- Keys after the distance: a row must equal the n-th on them too. A key
-- with many equal values (g), a unique one (as LIMIT), a nondeterministic
-- collation ('a' and 'A' are equal: both tie), NULLs (equal to each other,
-- as the Limit node compares them), DESC.
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_ties_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_ties_items t
	                    ORDER BY t.v <-> q.v, t.g FETCH FIRST 4 ROWS WITH TIES) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_ties_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_ties_items t
	                    ORDER BY t.v <-> q.v, t.id FETCH FIRST 4 ROWS WITH TIES) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_ties_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_ties_items t
	                    ORDER BY t.v <-> q.v, t.tag FETCH FIRST 5 ROWS WITH TIES) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_ties_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_ties_items t
	                    ORDER BY t.v <-> q.v, t.tag DESC NULLS LAST, t.g
	                    FETCH FIRST 6 ROWS WITH TIES) n $$);
-- The number of rows per query of "ORDER BY t.v <-> q.v<keys> FETCH FIRST
-- n ROWS WITH TIES", from the node.
CREATE FUNCTION pg_temp.tie_rows(keys text, n int) RETURNS TABLE (qid int, rows bigint)
LANGUAGE sql AS $$
  SELECT s.qid, (SELECT count(*) FROM unnest(string_to_array(s.neighbours, ' ')))
  FROM pg_temp.knn_show(format($q$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_ties_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_ties_items t
	                    ORDER BY t.v <-> q.v%s FETCH FIRST %s ROWS WITH TIES) n $q$, keys, n)) s
$$;
-- By hand, for [9.5,9.5] (qn 102): the 300 copies of [9,9] are nearest;
-- the first 2 by tag ('y' for all), so all 300 tie on (distance, tag);
-- by (distance, g), the 100 of the first g.
SELECT * FROM pg_temp.tie_rows(', t.tag', 2) WHERE qid = 102;
SELECT * FROM pg_temp.tie_rows(', t.g', 2) WHERE qid = 102;

-- NULL distances tie with each other: a NULL query vector (qn 17, 34, 51)
-- ties every row (all 1840 of them), or with a key after the distance
-- those equal on it; an n reaching into the NULL vectors of the items.
SELECT * FROM pg_temp.tie_rows('', 3) WHERE qid % 17 = 0;
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_ties_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_ties_items t
	                    ORDER BY t.v <-> q.v, t.g FETCH FIRST 3 ROWS WITH TIES) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_ties_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_ties_items t
	                    WHERE t.id < 110 ORDER BY t.v <-> q.v, t.g
	                    FETCH FIRST 107 ROWS WITH TIES) n $$);
-- NaN distances (cosine with a zero vector) tie with each other.
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_ties_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <=> q.v AS dist FROM knn_ties_items t
	                    WHERE t.id < 100 OR t.id > 2000
	                    ORDER BY t.v <=> q.v, t.g FETCH FIRST 100 ROWS WITH TIES) n $$);

-- OFFSET, LEFT JOIN with an ON clause, self-exclusion, groups, a radius.
-- (Which of the rows tied at the OFFSET are skipped is the plan's choice
-- without a key that orders them: distances compared, then with one.)
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_ties_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_ties_items t
	                    ORDER BY t.v <-> q.v OFFSET 5 ROWS FETCH FIRST 2 ROWS WITH TIES) n $$,
	false);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_ties_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_ties_items t
	                    ORDER BY t.v <-> q.v, t.id OFFSET 5 ROWS FETCH FIRST 2 ROWS WITH TIES) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_ties_queries q
	LEFT JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_ties_items t
	                   ORDER BY t.v <-> q.v, t.g FETCH FIRST 2 ROWS WITH TIES) n
	ON n.dist < 1 $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_ties_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_ties_items t
	                    WHERE t.id <> q.id AND t.g = q.g
	                    ORDER BY t.v <-> q.v FETCH FIRST 3 ROWS WITH TIES) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_ties_queries q
	LEFT JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_ties_items t
	                   WHERE t.v <-> q.v <= 1 AND t.id <> q.id
	                   ORDER BY t.v <-> q.v, t.g FETCH FIRST 2 ROWS WITH TIES) n ON true $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_ties_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <+> q.v AS dist FROM knn_ties_items t
	                    WHERE t.v <+> q.v < 3 AND t.g = q.g
	                    ORDER BY t.v <+> q.v FETCH FIRST 1 ROW WITH TIES) n $$);

-- The count as a parameter (generic plans, with the node and without);
-- 0 rows; NULL (all rows, as FETCH FIRST NULL ROWS gives); a negative
-- count is the Limit node's error.
PREPARE knn_ties_stmt(bigint) AS
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_ties_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_ties_items t
	                    ORDER BY t.v <-> q.v, t.id % 2
	                    FETCH FIRST $1 ROWS WITH TIES) n;
SET plan_cache_mode = force_generic_plan;
EXPLAIN (COSTS OFF) EXECUTE knn_ties_stmt(2);
CREATE TEMP TABLE ties_on_2 AS EXECUTE knn_ties_stmt(2);
CREATE TEMP TABLE ties_on_0 AS EXECUTE knn_ties_stmt(0);
CREATE TEMP TABLE ties_on_null AS EXECUTE knn_ties_stmt(NULL);
EXECUTE knn_ties_stmt(-1);
DEALLOCATE knn_ties_stmt;
SET knn_gpu.enable_knn_join = off;
PREPARE knn_ties_stmt(bigint) AS
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_ties_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_ties_items t
	                    ORDER BY t.v <-> q.v, t.id % 2
	                    FETCH FIRST $1 ROWS WITH TIES) n;
SELECT pg_temp.knn_uses_join('EXECUTE knn_ties_stmt(2)') AS node_off;
CREATE TEMP TABLE ties_off_2 AS EXECUTE knn_ties_stmt(2);
CREATE TEMP TABLE ties_off_0 AS EXECUTE knn_ties_stmt(0);
CREATE TEMP TABLE ties_off_null AS EXECUTE knn_ties_stmt(NULL);
EXECUTE knn_ties_stmt(-1);
DEALLOCATE knn_ties_stmt;
RESET knn_gpu.enable_knn_join;
RESET plan_cache_mode;
SELECT (SELECT count(*) FROM ties_on_2) AS rows_2,
       (SELECT count(*) FROM ((TABLE ties_on_2 EXCEPT ALL TABLE ties_off_2)
                              UNION ALL (TABLE ties_off_2 EXCEPT ALL TABLE ties_on_2)) d) AS differing_2,
       (SELECT count(*) FROM ties_on_0) + (SELECT count(*) FROM ties_off_0) AS rows_0,
       (SELECT count(*) FROM ties_on_null) AS rows_null,
       (SELECT count(*) FROM ((TABLE ties_on_null EXCEPT ALL TABLE ties_off_null)
                              UNION ALL (TABLE ties_off_null EXCEPT ALL TABLE ties_on_null)) d) AS differing_null;

-- halfvec and bit (Hamming distances are small integers: ties everywhere).
CREATE TABLE knn_ties_h AS SELECT id, v::halfvec(2) AS v, g FROM knn_ties_items;
CREATE TABLE knn_ties_qh AS SELECT qn, id, v::halfvec(2) AS v FROM knn_ties_queries;
ANALYZE knn_ties_h, knn_ties_qh;
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_ties_qh q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_ties_h t
	                    ORDER BY t.v <-> q.v, t.g FETCH FIRST 3 ROWS WITH TIES) n $$);
CREATE TABLE knn_ties_b AS SELECT i AS id, ((i * 37) % 4096)::bit(12) AS v FROM generate_series(1, 400) i;
ANALYZE knn_ties_b;
SELECT * FROM pg_temp.knn_check($$
	SELECT a.id AS qid, n.id AS nid, n.dist
	FROM knn_ties_b a
	CROSS JOIN LATERAL (SELECT t.id, t.v <~> a.v AS dist FROM knn_ties_b t
	                    WHERE t.id <> a.id
	                    ORDER BY t.v <~> a.v FETCH FIRST 2 ROWS WITH TIES) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT a.id AS qid, n.id AS nid, n.dist
	FROM knn_ties_b a
	CROSS JOIN LATERAL (SELECT t.id, t.v <%> a.v AS dist FROM knn_ties_b t
	                    ORDER BY t.v <%> a.v FETCH FIRST 3 ROWS WITH TIES) n $$);

DROP TABLE knn_ties_items, knn_ties_queries, knn_ties_h, knn_ties_qh, knn_ties_b;
DROP COLLATION knn_ties_ci;
