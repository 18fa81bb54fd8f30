--
-- When the KNN Join is not used: shapes it cannot prove equivalent keep
-- PostgreSQL's own plan and say why at DEBUG1 ("KNN Join not used: ...",
-- once for each join the planner considers); so do the GUC, the cost model
-- and an approximate index on the inner relation (silently: these are
-- choices, not limits).
--
CREATE TABLE knn_plans_items (id int, v vector, w vector);
INSERT INTO knn_plans_items
	SELECT i, format('[%s,%s]', i % 61, i % 37)::vector, format('[%s,%s]', i % 13, 1)::vector
	FROM generate_series(1, 3000) i;
CREATE TABLE knn_plans_queries (id int, v vector, k int);
INSERT INTO knn_plans_queries
	SELECT i, format('[%s,%s]', i, 2 * i)::vector, i % 3 + 1 FROM generate_series(1, 20) i;
ANALYZE knn_plans_items, knn_plans_queries;

-- The supported shape, for reference.
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM knn_plans_queries q
CROSS JOIN LATERAL (SELECT t.id FROM knn_plans_items t ORDER BY t.v <-> q.v LIMIT 3) n;

SET client_min_messages = debug1;
-- Descending order, or ORDER BY another key first. (Keys after the
-- distance are its tie order: knn_scan_shapes.)
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM knn_plans_queries q
CROSS JOIN LATERAL (SELECT t.id FROM knn_plans_items t ORDER BY t.v <-> q.v DESC LIMIT 3) n;
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM knn_plans_queries q
CROSS JOIN LATERAL (SELECT t.id FROM knn_plans_items t ORDER BY t.id, t.v <-> q.v LIMIT 3) n;
-- NULLS FIRST, an expression of the distance; a distance to a constant
-- (no message: the subquery does not depend on the outer row, so
-- PostgreSQL runs it once).
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM knn_plans_queries q
CROSS JOIN LATERAL (SELECT t.id FROM knn_plans_items t ORDER BY t.v <-> q.v NULLS FIRST LIMIT 3) n;
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM knn_plans_queries q
CROSS JOIN LATERAL (SELECT t.id FROM knn_plans_items t ORDER BY (t.v <-> q.v) * 2 LIMIT 3) n;
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM knn_plans_queries q
CROSS JOIN LATERAL (SELECT t.id FROM knn_plans_items t ORDER BY t.v <-> '[1,1]' LIMIT 3) n;
-- Both operands columns of the inner relation (nothing lateral, no message).
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM knn_plans_queries q
CROSS JOIN LATERAL (SELECT t.id FROM knn_plans_items t ORDER BY t.v <-> t.w LIMIT 3) n;
-- OFFSET from the outer row (a constant one is run: knn_scan_shapes),
-- WITH TIES of a count from the outer row (a constant one is run:
-- knn_scan_ties), DISTINCT, aggregates.
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM knn_plans_queries q
CROSS JOIN LATERAL (SELECT t.id FROM knn_plans_items t ORDER BY t.v <-> q.v LIMIT 3 OFFSET q.k) n;
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM knn_plans_queries q
CROSS JOIN LATERAL (SELECT t.id FROM knn_plans_items t ORDER BY t.v <-> q.v
                    FETCH FIRST q.k ROWS WITH TIES) n;
EXPLAIN (COSTS OFF)
SELECT q.id, n.d FROM knn_plans_queries q
CROSS JOIN LATERAL (SELECT DISTINCT t.v <-> q.v AS d FROM knn_plans_items t ORDER BY 1 LIMIT 3) n;
EXPLAIN (COSTS OFF)
SELECT q.id, n.d FROM knn_plans_queries q
CROSS JOIN LATERAL (SELECT min(t.v <-> q.v) AS d FROM knn_plans_items t ORDER BY 1 LIMIT 3) n;
-- Volatile functions in the subquery: they would run for every inner row.
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM knn_plans_queries q
CROSS JOIN LATERAL (SELECT t.id, random() AS r FROM knn_plans_items t ORDER BY t.v <-> q.v LIMIT 3) n;
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM knn_plans_queries q
CROSS JOIN LATERAL (SELECT t.id FROM knn_plans_items t WHERE random() < 2
                    ORDER BY t.v <-> q.v LIMIT 3) n;
-- The subquery referencing other outer columns: in WHERE (other than as
-- a self-exclusion "t.id <> q.id": knn_scan_shapes), in its select list,
-- in LIMIT; a LIMIT from a subquery.
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM knn_plans_queries q
CROSS JOIN LATERAL (SELECT t.id FROM knn_plans_items t WHERE t.id < q.id
                    ORDER BY t.v <-> q.v LIMIT 3) n;
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM knn_plans_queries q
CROSS JOIN LATERAL (SELECT t.id, q.k FROM knn_plans_items t ORDER BY t.v <-> q.v LIMIT 3) n;
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM knn_plans_queries q
CROSS JOIN LATERAL (SELECT t.id FROM knn_plans_items t ORDER BY t.v <-> q.v LIMIT q.k) n;
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM knn_plans_queries q
CROSS JOIN LATERAL (SELECT t.id FROM knn_plans_items t ORDER BY t.v <-> q.v
                    LIMIT (SELECT 3)) n;
-- More than one relation in the subquery; the whole subquery row used
-- above. (LEFT JOIN LATERAL is run: knn_scan_shapes.)
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM knn_plans_queries q
CROSS JOIN LATERAL (SELECT t.id FROM knn_plans_items t JOIN knn_plans_queries u ON u.id = t.id
                    ORDER BY t.v <-> q.v LIMIT 3) n;
EXPLAIN (COSTS OFF)
SELECT q.id, n FROM knn_plans_queries q
CROSS JOIN LATERAL (SELECT t.id FROM knn_plans_items t ORDER BY t.v <-> q.v LIMIT 3) n;
-- Another operator (not one of the four distances on vector): no message,
-- as the subquery is not ordered by a distance.
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM knn_plans_queries q
CROSS JOIN LATERAL (SELECT t.id FROM knn_plans_items t ORDER BY abs(t.id - q.k) LIMIT 3) n;
-- Views and subqueries in FROM that are not a plain selection from one
-- table (those that are run: knn_scan_relations): a join, an aggregate, a
-- LIMIT, a volatile function; TABLESAMPLE, a VALUES list.
CREATE VIEW knn_plans_joined AS
	SELECT t.id, t.v FROM knn_plans_items t JOIN knn_plans_queries u ON u.id = t.id;
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM knn_plans_queries q
CROSS JOIN LATERAL (SELECT t.id FROM knn_plans_joined t ORDER BY t.v <-> q.v LIMIT 3) n;
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM knn_plans_queries q
CROSS JOIN LATERAL (SELECT t.id FROM (SELECT max(id) AS id, v FROM knn_plans_items GROUP BY v) t
                    ORDER BY t.v <-> q.v LIMIT 3) n;
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM knn_plans_queries q
CROSS JOIN LATERAL (SELECT t.id FROM (SELECT id, v FROM knn_plans_items LIMIT 100) t
                    ORDER BY t.v <-> q.v LIMIT 3) n;
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM knn_plans_queries q
CROSS JOIN LATERAL (SELECT t.id FROM (SELECT id, v FROM knn_plans_items WHERE random() < 0.5) t
                    ORDER BY t.v <-> q.v LIMIT 3) n;
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM knn_plans_queries q
CROSS JOIN LATERAL (SELECT t.id FROM knn_plans_items t TABLESAMPLE SYSTEM (50) REPEATABLE (1)
                    ORDER BY t.v <-> q.v LIMIT 3) n;
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM knn_plans_queries q
CROSS JOIN LATERAL (SELECT t.id FROM (VALUES (1, '[1,1]'::vector), (2, '[2,2]')) t(id, v)
                    ORDER BY t.v <-> q.v LIMIT 3) n;
-- A query vector of another type (a halfvec cast of the outer column).
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM knn_plans_queries q
CROSS JOIN LATERAL (SELECT t.id FROM knn_plans_items t ORDER BY t.v <-> q.v::halfvec LIMIT 3) n;
-- A plain join on a distance that is not a radius of a constant or a
-- parameter (one from a row; a distance of an expression); a join without
-- any distance says nothing.
EXPLAIN (COSTS OFF)
SELECT q.id, t.id FROM knn_plans_queries q JOIN knn_plans_items t ON t.v <-> q.v < q.k;
EXPLAIN (COSTS OFF)
SELECT q.id, t.id FROM knn_plans_queries q JOIN knn_plans_items t ON (t.v + t.w) <-> q.v < 2;
EXPLAIN (COSTS OFF)
SELECT q.id, t.id FROM knn_plans_queries q JOIN knn_plans_items t ON t.id = q.k;
-- The top-k query as a sub-select (in a select list, in EXISTS, in IN) is
-- no join: it says how to write it.
EXPLAIN (COSTS OFF)
SELECT q.id, (SELECT t.id FROM knn_plans_items t ORDER BY t.v <-> q.v LIMIT 1) AS nearest
FROM knn_plans_queries q;
EXPLAIN (COSTS OFF)
SELECT q.id FROM knn_plans_queries q
WHERE EXISTS (SELECT FROM (SELECT t.v <-> q.v AS d FROM knn_plans_items t
                           ORDER BY t.v <-> q.v LIMIT 3) n WHERE n.d < 1);
EXPLAIN (COSTS OFF)
SELECT q.id FROM knn_plans_queries q
WHERE q.k IN (SELECT n.id FROM LATERAL (SELECT t.id FROM knn_plans_items t
                                        ORDER BY t.v <-> q.v LIMIT 3) n);
DROP VIEW knn_plans_joined;
RESET client_min_messages;

-- knn_gpu.enable_knn_join = off.
SET knn_gpu.enable_knn_join = off;
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM knn_plans_queries q
CROSS JOIN LATERAL (SELECT t.id FROM knn_plans_items t ORDER BY t.v <-> q.v LIMIT 3) n;
RESET knn_gpu.enable_knn_join;

-- The cost model: one outer row against the table is cheaper as PostgreSQL's
-- single sort; twenty are not.
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM knn_plans_queries q
CROSS JOIN LATERAL (SELECT t.id FROM knn_plans_items t ORDER BY t.v <-> q.v LIMIT 3) n
WHERE q.id = 7;

-- An approximate index (pgvector's hnsw or ivfflat) on the inner column is
-- recognised by catalog identity: its access method belongs to pgvector.
-- A user's access method that is merely called hnsw (here built on GiST's
-- handler, with an ordering operator class) is an exact index like any
-- other: the costs decide, and knn_gpu.exact_over_index changes nothing.
-- (The table stays empty, so the stand-in's support functions are never
-- called; only the plans are looked at. pgvector's own index access methods
-- are tested with pgvector, test/pgvector/.)
BEGIN;
CREATE ACCESS METHOD hnsw TYPE INDEX HANDLER gisthandler;
CREATE FUNCTION knn_plans_consistent(internal, vector, smallint, oid, internal) RETURNS bool
	LANGUAGE internal IMMUTABLE AS 'gist_box_consistent';
CREATE FUNCTION knn_plans_union(internal, internal) RETURNS vector
	LANGUAGE internal IMMUTABLE AS 'gist_box_union';
CREATE FUNCTION knn_plans_penalty(internal, internal, internal) RETURNS internal
	LANGUAGE internal IMMUTABLE AS 'gist_box_penalty';
CREATE FUNCTION knn_plans_picksplit(internal, internal) RETURNS internal
	LANGUAGE internal IMMUTABLE AS 'gist_box_picksplit';
CREATE FUNCTION knn_plans_same(vector, vector, internal) RETURNS internal
	LANGUAGE internal IMMUTABLE AS 'gist_box_same';
CREATE FUNCTION knn_plans_distance(internal, vector, smallint, oid, internal) RETURNS float8
	LANGUAGE internal IMMUTABLE AS 'gist_box_distance';
CREATE OPERATOR CLASS knn_plans_l2_ops FOR TYPE vector USING hnsw AS
	OPERATOR 1 <-> (vector, vector) FOR ORDER BY float_ops,
	FUNCTION 1 knn_plans_consistent(internal, vector, smallint, oid, internal),
	FUNCTION 2 knn_plans_union(internal, internal),
	FUNCTION 5 knn_plans_penalty(internal, internal, internal),
	FUNCTION 6 knn_plans_picksplit(internal, internal),
	FUNCTION 7 knn_plans_same(vector, vector, internal),
	FUNCTION 8 knn_plans_distance(internal, vector, smallint, oid, internal);
CREATE TABLE knn_plans_indexed (id int, v vector);
CREATE INDEX ON knn_plans_indexed USING hnsw (v knn_plans_l2_ops);
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM knn_plans_queries q
CROSS JOIN LATERAL (SELECT t.id FROM knn_plans_indexed t ORDER BY t.v <-> q.v LIMIT 3) n;
SET LOCAL knn_gpu.exact_over_index = on;
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM knn_plans_queries q
CROSS JOIN LATERAL (SELECT t.id FROM knn_plans_indexed t ORDER BY t.v <-> q.v LIMIT 3) n;
SET LOCAL knn_gpu.exact_over_index = off;
-- An index whose operator class does not order by this operator is no reason.
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM knn_plans_queries q
CROSS JOIN LATERAL (SELECT t.id FROM knn_plans_indexed t ORDER BY t.v <=> q.v LIMIT 3) n;
ROLLBACK;

DROP TABLE knn_plans_items, knn_plans_queries;
