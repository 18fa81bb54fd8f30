--
-- What the two sides of a KNN Join may be. The inner relation: a table, or
-- a view or a subquery in FROM that selects from one table (columns that
-- are expressions, a WHERE, views over views, security barriers, row-level
-- security of the table); PostgreSQL plans it as the node's inner scan. The
-- outer side: any plan (a CTE, a set-returning function, unnest of an array
-- parameter, VALUES, a subquery), its query vector a column or an
-- expression of its columns (which the node computes: see
-- knn_scan_expressions). Each runs as Custom Scan (KNN Join), or as
-- PostgreSQL's own plan where declined, and returns what that returns.
--
SET extra_float_digits = 0;

CREATE TABLE knn_rel_items (id int, v vector(2), flag boolean, g int, tag text);
INSERT INTO knn_rel_items
SELECT i, CASE WHEN i % 41 = 0 THEN NULL
               ELSE format('[%s,%s]', (i * 7) % 23, (i * 3) % 19)::vector(2) END,
       i % 3 <> 0, i % 4, 'tag' || (i % 5)
FROM generate_series(1, 2500) i;
CREATE TABLE knn_rel_queries (qn int, id int, v vector(2), g int);
INSERT INTO knn_rel_queries
SELECT i, i * 11, CASE WHEN i % 29 = 0 THEN NULL
                       ELSE format('[%s,%s]', (i * 5) % 23, (i * 2) % 19)::vector(2) END,
       CASE WHEN i % 17 = 0 THEN NULL ELSE i % 4 END
FROM generate_series(1, 120) i;
ANALYZE knn_rel_items, knn_rel_queries;

\i sql/knn_scan_helpers.psql

--
-- 1. The inner relation is a view or a subquery in FROM.
--
CREATE VIEW knn_rel_flagged AS SELECT id, v, g, tag FROM knn_rel_items WHERE flag;
-- Columns renamed and reordered, a computed vector (a cast to vector(2)
-- and a sum), a view over that view.
CREATE VIEW knn_rel_shifted (vec, ident, grp) AS
	SELECT v + '[1,1]'::vector(2), id, g FROM knn_rel_items WHERE id % 5 <> 0;
CREATE VIEW knn_rel_nested AS SELECT ident AS id, vec AS v, grp AS g FROM knn_rel_shifted
	WHERE grp <> 3;

EXPLAIN (COSTS OFF)
SELECT q.qn, n.id, n.dist
FROM knn_rel_queries q
CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_rel_flagged t
                    ORDER BY t.v <-> q.v LIMIT 3) n;
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_rel_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_rel_flagged t
	                    ORDER BY t.v <-> q.v, t.id LIMIT 3) n $$);
-- (With a condition on the outer row, t.id <> q.id or t.grp = q.g, the
-- views' id % 5 <> 0, which may fail -- int4mod is not leakproof -- and
-- which PostgreSQL evaluates after that cheaper one, keeps PostgreSQL's
-- plan: knn_scan_shapes.)
EXPLAIN (COSTS OFF)
SELECT q.qn, n.id, n.dist
FROM knn_rel_queries q
CROSS JOIN LATERAL (SELECT t.id, t.v <=> q.v AS dist FROM knn_rel_nested t
                    WHERE t.id <> q.id ORDER BY t.v <=> q.v, t.id LIMIT 4) n;
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_rel_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <=> q.v AS dist FROM knn_rel_nested t
	                    WHERE t.id <> q.id ORDER BY t.v <=> q.v, t.id LIMIT 4) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.ident AS nid, n.dist
	FROM knn_rel_queries q
	LEFT JOIN LATERAL (SELECT t.ident, t.vec <+> q.v AS dist FROM knn_rel_shifted t
	                   WHERE t.grp = q.g ORDER BY t.vec <+> q.v, t.ident LIMIT 2) n
	ON n.dist < 6 $$);
-- A subquery in FROM, with a filter of its own and one of the LATERAL's.
EXPLAIN (COSTS OFF)
SELECT q.qn, n.id, n.dist
FROM knn_rel_queries q
CROSS JOIN LATERAL (SELECT t.id, t.v <#> q.v AS dist
                    FROM (SELECT id, v, g FROM knn_rel_items WHERE id > 100) t
                    WHERE t.g = q.g AND t.id <> 107
                    ORDER BY t.v <#> q.v, t.id LIMIT 5) n;
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_rel_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <#> q.v AS dist
	                    FROM (SELECT id, v, g FROM knn_rel_items WHERE id > 100) t
	                    WHERE t.g = q.g AND t.id <> 107
	                    ORDER BY t.v <#> q.v, t.id LIMIT 5) n $$);
-- A radius and WITH TIES over a view; tie keys of the view's columns.
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_rel_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_rel_flagged t
	                    WHERE t.v <-> q.v < 2.5 ORDER BY t.v <-> q.v, t.id) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_rel_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_rel_flagged t
	                    ORDER BY t.v <-> q.v, t.tag FETCH FIRST 2 ROWS WITH TIES) n $$);

-- A security-barrier view: its WHERE runs before anything of the query's,
-- as in PostgreSQL's plan (the inner scan is PostgreSQL's plan of the view).
CREATE VIEW knn_rel_barrier WITH (security_barrier) AS
	SELECT id, v FROM knn_rel_items WHERE g = 1;
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_rel_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_rel_barrier t
	                    WHERE t.id % 3 = 0 ORDER BY t.v <-> q.v, t.id LIMIT 3) n $$);

-- Row-level security of the table, for a user it applies to, through the
-- table and through a view that checks the invoker: the rows that user
-- sees (ids divisible by 3 are hidden).
CREATE ROLE knn_rel_reader;
GRANT SELECT ON knn_rel_items, knn_rel_queries TO knn_rel_reader;
CREATE VIEW knn_rel_invoker WITH (security_invoker) AS SELECT id, v FROM knn_rel_items;
GRANT SELECT ON knn_rel_invoker TO knn_rel_reader;
ALTER TABLE knn_rel_items ENABLE ROW LEVEL SECURITY;
CREATE POLICY knn_rel_visible ON knn_rel_items FOR SELECT USING (id % 3 <> 0);
SET ROLE knn_rel_reader;
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_rel_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_rel_invoker t
	                    ORDER BY t.v <-> q.v, t.id LIMIT 3) n $$);
SELECT count(*) AS hidden_rows_returned
FROM knn_rel_queries q
CROSS JOIN LATERAL (SELECT t.id FROM knn_rel_invoker t ORDER BY t.v <-> q.v, t.id LIMIT 3) n
WHERE n.id % 3 = 0;
RESET ROLE;
ALTER TABLE knn_rel_items DISABLE ROW LEVEL SECURITY;
DROP POLICY knn_rel_visible ON knn_rel_items;
DROP VIEW knn_rel_invoker;
REVOKE ALL ON knn_rel_items, knn_rel_queries FROM knn_rel_reader;
DROP ROLE knn_rel_reader;

--
-- 2. The outer side is any plan.
--
-- A CTE (materialized), a set-returning SQL function, a plpgsql one.
EXPLAIN (COSTS OFF)
WITH picked AS MATERIALIZED (SELECT qn, v FROM knn_rel_queries WHERE qn > 10)
SELECT q.qn, n.id, n.dist
FROM picked q
CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_rel_items t
                    ORDER BY t.v <-> q.v, t.id LIMIT 3) n;
SELECT * FROM pg_temp.knn_check($$
	WITH picked AS MATERIALIZED (SELECT qn, v FROM knn_rel_queries WHERE qn > 10)
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM picked q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_rel_items t
	                    ORDER BY t.v <-> q.v, t.id LIMIT 3) n $$);
CREATE FUNCTION knn_rel_sql_queries() RETURNS TABLE (qn int, v vector)
	LANGUAGE sql STABLE AS 'SELECT qn, v FROM knn_rel_queries';
CREATE FUNCTION knn_rel_plpgsql_queries() RETURNS TABLE (qn int, v vector)
	LANGUAGE plpgsql AS 'BEGIN RETURN QUERY SELECT q.qn, q.v FROM knn_rel_queries q; END';
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_rel_sql_queries() q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_rel_items t
	                    ORDER BY t.v <-> q.v, t.id LIMIT 3) n $$);
EXPLAIN (COSTS OFF)
SELECT q.qn, n.id, n.dist
FROM knn_rel_plpgsql_queries() q
CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_rel_items t
                    ORDER BY t.v <-> q.v, t.id LIMIT 3) n;
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_rel_plpgsql_queries() q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_rel_items t
	                    ORDER BY t.v <-> q.v, t.id LIMIT 3) n $$);
-- unnest of an array parameter, WITH ORDINALITY (a generic plan: the
-- array's size is unknown to the planner).
PREPARE knn_rel_unnest(vector[]) AS
	SELECT q.ord::int AS qid, n.id AS nid, n.dist
	FROM unnest($1) WITH ORDINALITY q(v, ord)
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_rel_items t
	                    ORDER BY t.v <-> q.v, t.id LIMIT 2) n;
SET plan_cache_mode = force_generic_plan;
SELECT array_agg(v ORDER BY qn) AS query_vectors FROM knn_rel_queries \gset
EXPLAIN (COSTS OFF) EXECUTE knn_rel_unnest(ARRAY['[1,1]', '[5,2]']::vector[]);
CREATE TEMP TABLE unnest_on AS
	EXECUTE knn_rel_unnest(:'query_vectors');
DEALLOCATE knn_rel_unnest;
SET knn_gpu.enable_knn_join = off;
PREPARE knn_rel_unnest(vector[]) AS
	SELECT q.ord::int AS qid, n.id AS nid, n.dist
	FROM unnest($1) WITH ORDINALITY q(v, ord)
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_rel_items t
	                    ORDER BY t.v <-> q.v, t.id LIMIT 2) n;
SELECT pg_temp.knn_uses_join('EXECUTE knn_rel_unnest(NULL)') AS node_off;
CREATE TEMP TABLE unnest_off AS
	EXECUTE knn_rel_unnest(:'query_vectors');
DEALLOCATE knn_rel_unnest;
RESET knn_gpu.enable_knn_join;
RESET plan_cache_mode;
SELECT (SELECT count(*) FROM unnest_on) AS rows_on,
       (SELECT count(*) FROM ((TABLE unnest_on EXCEPT ALL TABLE unnest_off)
                              UNION ALL (TABLE unnest_off EXCEPT ALL TABLE unnest_on)) d) AS differing;
-- VALUES and a subquery with its own LIMIT on the outer side.
SELECT * FROM pg_temp.knn_check($$
	SELECT q.x AS qid, n.id AS nid, n.dist
	FROM (SELECT qn, v FROM knn_rel_queries UNION ALL
	      VALUES (1000, '[3,3]'::vector), (1001, NULL), (1002, '[0,0]')) q(x, v)
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_rel_items t
	                    ORDER BY t.v <-> q.v, t.id LIMIT 2) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM (SELECT qn, v FROM knn_rel_queries ORDER BY qn DESC LIMIT 90) q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_rel_items t
	                    ORDER BY t.v <-> q.v, t.id LIMIT 2) n $$);

-- The query vector an expression of the outer row: a column of a subquery
-- PostgreSQL pulls up (a sum, a cast), and a sum written in the ORDER BY.
-- The node computes it, for the outer rows whose subquery sorts rows, as
-- PostgreSQL does (knn_scan_expressions); EXPLAIN shows it.
EXPLAIN (COSTS OFF, VERBOSE)
SELECT q.qn, n.id, n.dist
FROM (SELECT qn, v + '[1,0]' AS v FROM knn_rel_queries) q
CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_rel_items t
                    ORDER BY t.v <-> q.v LIMIT 2) n;
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM (SELECT qn, v + '[1,0]' AS v FROM knn_rel_queries) q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_rel_items t
	                    ORDER BY t.v <-> q.v, t.id LIMIT 2) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM (SELECT qn, v::text::vector(2) AS v FROM knn_rel_queries) q
	CROSS JOIN LATERAL (SELECT t.id, t.v <+> q.v AS dist FROM knn_rel_items t
	                    WHERE t.id <> q.qn ORDER BY t.v <+> q.v, t.id LIMIT 2) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_rel_queries q
	LEFT JOIN LATERAL (SELECT t.id, t.v <=> (q.v + '[0.5,-1]') AS dist FROM knn_rel_items t
	                   WHERE t.v <=> (q.v + '[0.5,-1]') <= 0.01
	                   ORDER BY t.v <=> (q.v + '[0.5,-1]'), t.id LIMIT 4) n ON true $$);

DROP FUNCTION knn_rel_sql_queries(), knn_rel_plpgsql_queries();
DROP VIEW knn_rel_nested, knn_rel_shifted, knn_rel_flagged, knn_rel_barrier;
DROP TABLE knn_rel_items, knn_rel_queries;
