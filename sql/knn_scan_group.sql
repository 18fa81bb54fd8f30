--
-- The KNN Join with group equalities in the LATERAL subquery
-- ("WHERE t.g = q.g [AND t.h = q.h ...]"): one engine call that joins each
-- group's outer rows with that group's inner rows, returning what
-- PostgreSQL's own plan returns (knn_gpu.enable_knn_join = off): same rows,
-- order and distances, NULL keys equal to nothing.
--
SET extra_float_digits = 0;
SELECT setseed(0.23);

-- Coarse 2-d points (ties and duplicates), NULL vectors on both sides, NULL
-- keys, groups on one side only, a key column in a case-insensitive
-- collation (upper case on the query side).
CREATE COLLATION knn_group_ci (provider = icu, locale = 'und-u-ks-level2',
							   deterministic = false);
CREATE TABLE knn_group_items (id int, v vector(2), g text, h int, u uuid,
							  ci text COLLATE knn_group_ci);
INSERT INTO knn_group_items
SELECT i, CASE WHEN i % 41 = 0 THEN NULL
			   ELSE format('[%s,%s]', floor(random() * 6), floor(random() * 6))::vector(2) END,
	   (ARRAY['a', 'b', 'c', 'items-only', NULL])[1 + i % 5], i % 3, md5((i % 4)::text)::uuid,
	   (ARRAY['x', 'y', 'Z'])[1 + i % 3]
FROM generate_series(1, 600) i;
CREATE TABLE knn_group_queries (qn int, id int, v vector(2), g text, h int, u uuid,
								ci text COLLATE knn_group_ci);
INSERT INTO knn_group_queries
SELECT i, i * 3, CASE WHEN i % 17 = 0 THEN NULL
				   ELSE format('[%s,%s]', floor(random() * 6), floor(random() * 6))::vector(2) END,
	   (ARRAY['a', 'b', 'c', 'queries-only', NULL, 'a'])[1 + i % 6], i % 4, md5((i % 5)::text)::uuid,
	   (ARRAY['X', 'Y', 'z', 'w'])[1 + i % 4]
FROM generate_series(1, 120) i;
ANALYZE knn_group_items, knn_group_queries;

\i sql/knn_scan_helpers.psql

-- The plan: one KNN Join, the group keys shown.
EXPLAIN (COSTS OFF)
SELECT q.qn, n.id, n.dist
FROM knn_group_queries q
CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_group_items t
                    WHERE t.g = q.g ORDER BY t.v <-> q.v, t.id LIMIT 4) n;
EXPLAIN (COSTS OFF)
SELECT q.qn, n.id, n.dist
FROM knn_group_queries q
CROSS JOIN LATERAL (SELECT t.id, t.v <=> q.v AS dist FROM knn_group_items t
                    WHERE q.h = t.h AND t.g = q.g AND t.id <> q.id AND t.id > 5
                    ORDER BY t.v <=> q.v, t.id LIMIT 4) n;

-- One key column; k below and above the groups' sizes; every metric.
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_group_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_group_items t
	                    WHERE t.g = q.g ORDER BY t.v <-> q.v, t.id LIMIT 4) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_group_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <+> q.v AS dist FROM knn_group_items t
	                    WHERE q.g = t.g ORDER BY t.v <+> q.v, t.id LIMIT 1000) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_group_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <#> q.v AS dist FROM knn_group_items t
	                    WHERE t.h = q.h ORDER BY t.v <#> q.v, t.id LIMIT 3) n $$);
-- Two key columns, self-exclusion and a filter on the inner relation.
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_group_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <=> q.v AS dist FROM knn_group_items t
	                    WHERE q.h = t.h AND t.g = q.g AND t.id <> q.id AND t.id > 5
	                    ORDER BY t.v <=> q.v, t.id LIMIT 4) n $$);
-- uuid keys, and text keys under a nondeterministic collation ('x' = 'X').
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_group_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_group_items t
	                    WHERE t.u = q.u ORDER BY t.v <-> q.v, t.id LIMIT 5) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_group_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_group_items t
	                    WHERE t.ci = q.ci ORDER BY t.v <-> q.v, t.id LIMIT 5) n $$);
SELECT count(*) AS ci_rows FROM knn_group_queries q
CROSS JOIN LATERAL (SELECT t.id FROM knn_group_items t WHERE t.ci = q.ci
                    ORDER BY t.v <-> q.v, t.id LIMIT 2) n;
-- A domain over text and a composite type as keys.
CREATE DOMAIN knn_group_label AS text;
CREATE TYPE knn_group_pair AS (g text, h int);
CREATE TABLE knn_group_dq AS SELECT qn, id, v, g::knn_group_label AS d, ROW(g, h)::knn_group_pair AS p
FROM knn_group_queries;
CREATE TABLE knn_group_di AS SELECT id, v, g::knn_group_label AS d, ROW(g, h)::knn_group_pair AS p
FROM knn_group_items;
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_group_dq q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_group_di t
	                    WHERE t.d = q.d ORDER BY t.v <-> q.v, t.id LIMIT 3) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_group_dq q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_group_di t
	                    WHERE t.p = q.p ORDER BY t.v <-> q.v, t.id LIMIT 3) n $$);
-- LEFT JOIN LATERAL (queries of no group keep one row) and OFFSET.
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_group_queries q
	LEFT JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_group_items t
	                   WHERE t.g = q.g ORDER BY t.v <-> q.v, t.id LIMIT 3 OFFSET 2) n
	ON n.dist < 3 $$);
-- A self-join of one table within groups, without the self-matches.
SELECT * FROM pg_temp.knn_check($$
	SELECT q.id AS qid, n.id AS nid, n.dist
	FROM knn_group_items q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_group_items t
	                    WHERE t.g = q.g AND t.h = q.h AND t.id <> q.id
	                    ORDER BY t.v <-> q.v, t.id LIMIT 3) n $$);
-- Rescans: the join inside a correlated subquery, run once per o.x.
SELECT * FROM pg_temp.knn_check($$
	SELECT o.x AS qid, 0 AS nid,
	       (SELECT sum(n.dist * q.qn) FROM knn_group_queries q
	        CROSS JOIN LATERAL (SELECT t.v <-> q.v AS dist FROM knn_group_items t
	                            WHERE t.h = q.h ORDER BY t.v <-> q.v, t.id LIMIT 2) n
	        WHERE q.h = o.x % 4)::float8 AS dist
	FROM generate_series(1, 5) o(x) $$);
-- halfvec and bit columns.
CREATE TABLE knn_group_hq AS SELECT qn, id, v::halfvec(2) AS v, g FROM knn_group_queries;
CREATE TABLE knn_group_hi AS SELECT id, v::halfvec(2) AS v, g FROM knn_group_items;
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_group_hq q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_group_hi t
	                    WHERE t.g = q.g ORDER BY t.v <-> q.v, t.id LIMIT 3) n $$);
CREATE TABLE knn_group_bq AS SELECT qn, id, (qn * 37 % 256)::bit(8) AS v, g FROM knn_group_queries;
CREATE TABLE knn_group_bi AS SELECT id, (id * 101 % 256)::bit(8) AS v, g FROM knn_group_items;
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_group_bq q
	CROSS JOIN LATERAL (SELECT t.id, t.v <~> q.v AS dist FROM knn_group_bi t
	                    WHERE t.g = q.g ORDER BY t.v <~> q.v, t.id LIMIT 3) n $$);

-- Shapes still declined say why.
SET client_min_messages = debug1;
EXPLAIN (COSTS OFF)
SELECT q.qn, n.id FROM knn_group_queries q
CROSS JOIN LATERAL (SELECT t.id FROM knn_group_items t WHERE t.g = lower(q.g)
                    ORDER BY t.v <-> q.v LIMIT 3) n;
EXPLAIN (COSTS OFF)
SELECT q.qn, n.id FROM knn_group_queries q
CROSS JOIN LATERAL (SELECT t.id FROM knn_group_items t WHERE t.h = q.h::bigint
                    ORDER BY t.v <-> q.v LIMIT 3) n;
RESET client_min_messages;

-- Vectors of two dimensions in two groups: only pairs of one group are
-- ever compared, so neither plan fails; a query of the wrong dimension in
-- a group fails in both.
CREATE TABLE knn_group_mixed_items (id int, v vector, g text);
INSERT INTO knn_group_mixed_items VALUES
	(1, '[0,0]', 'two'), (2, '[1,1]', 'two'), (3, '[0,0,0]', 'three'), (4, '[1,2,3]', 'three'),
	(5, '[9,9,9,9]', 'four'), (6, NULL, 'two');
CREATE TABLE knn_group_mixed_queries (qn int, v vector, g text);
INSERT INTO knn_group_mixed_queries VALUES
	(1, '[1,0]', 'two'), (2, '[1,1,1]', 'three'), (3, NULL, 'three'), (4, '[5]', 'one');
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_group_mixed_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_group_mixed_items t
	                    WHERE t.g = q.g ORDER BY t.v <-> q.v, t.id LIMIT 2) n $$);
-- One engine run per dimension: EXPLAIN ANALYZE shows both, summed (the
-- queries of both dimensions, their targets and pairs), and the range of
-- the dimensions.
SELECT * FROM pg_temp.knn_explain_analyze($$
	SELECT q.qn, n.id FROM knn_group_mixed_queries q
	CROSS JOIN LATERAL (SELECT t.id FROM knn_group_mixed_items t WHERE t.g = q.g
	                    ORDER BY t.v <-> q.v, t.id LIMIT 2) n $$);
INSERT INTO knn_group_mixed_queries VALUES (5, '[1,1,1]', 'two');
SELECT q.qn, n.id FROM knn_group_mixed_queries q
CROSS JOIN LATERAL (SELECT t.id FROM knn_group_mixed_items t WHERE t.g = q.g
                    ORDER BY t.v <-> q.v, t.id LIMIT 2) n;
SET knn_gpu.enable_knn_join = off;
SELECT q.qn, n.id FROM knn_group_mixed_queries q
CROSS JOIN LATERAL (SELECT t.id FROM knn_group_mixed_items t WHERE t.g = q.g
                    ORDER BY t.v <-> q.v, t.id LIMIT 2) n;
RESET knn_gpu.enable_knn_join;
