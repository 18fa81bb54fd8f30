--
-- The KNN Join's variants of the LATERAL top-k query: LEFT JOIN LATERAL,
-- self-exclusion "WHERE t.id <> q.id", further ORDER BY keys after the
-- distance (the tie order), and OFFSET. Each runs as Custom Scan (KNN Join)
-- and returns what PostgreSQL's own plan returns.
--
SET extra_float_digits = 0;

-- 13 rows near the origin (two NULL vectors, a duplicate of [1,0], a row
-- whose keys are all NULL, a duplicate tag 'b'), then 3000 far rows.
-- Every key column holds the same value in another type: id, tag (text),
-- uid (uuid), big (bigint), num (numeric, written with another scale on
-- the query side), code (bpchar, with trailing blanks on the query side)
-- and ci (text in a case-insensitive ICU collation, upper case on the query
-- side).
CREATE COLLATION knn_shapes_ci (provider = icu, locale = 'und-u-ks-level2',
								deterministic = false);
CREATE TABLE knn_shapes_items (id int, v vector, tag text, uid uuid, big bigint,
							   num numeric, code bpchar, ci text COLLATE knn_shapes_ci);
INSERT INTO knn_shapes_items (id, v, tag) VALUES
	(1, '[0,0]', 'a'), (2, '[1,0]', 'b'), (3, '[0,1]', 'c'), (4, '[1,1]', 'd'),
	(5, '[2,0]', 'e'), (6, NULL, 'f'), (7, '[3,4]', 'g'), (8, '[-1,0]', 'h'),
	(9, NULL, 'i'), (10, '[0,-2]', 'j'), (11, '[1,0]', 'b'), (12, '[5,5]', NULL),
	(NULL, '[0,0]', NULL);
INSERT INTO knn_shapes_items (id, v, tag)
	SELECT i, format('[%s,%s]', 100 + i % 50, 200 + i % 70)::vector, 'far' || i
	FROM generate_series(1001, 4000) i;
UPDATE knn_shapes_items SET uid = md5(id::text)::uuid, big = id + 10000000000,
	num = id, code = 'k' || id, ci = tag;
CREATE TABLE knn_shapes_queries (qn int, id int, v vector, tag text, uid uuid, big bigint,
								 num numeric, code bpchar, ci text COLLATE knn_shapes_ci);
INSERT INTO knn_shapes_queries (qn, id, v, tag) VALUES
	(1, 1, '[0,0]', 'a'), (2, 2, '[1,0]', 'b'), (3, 3, NULL, 'c'), (4, 4, '[2,2]', 'd'),
	(5, NULL, '[0,0]', NULL), (6, 6, '[-3,1]', 'f'), (7, 7, '[4,4]', 'g'),
	(8, 99, '[1,2]', 'zz'), (9, 11, '[1,0]', 'b');
UPDATE knn_shapes_queries SET uid = md5(id::text)::uuid, big = id + 10000000000,
	num = id + 0.00, code = 'k' || id || '  ', ci = upper(tag);
CREATE TABLE knn_shapes_empty (id int, v vector, tag text);
ANALYZE knn_shapes_items, knn_shapes_queries;

\i sql/knn_scan_helpers.psql

--
-- 1. LEFT JOIN LATERAL ... ON ...: an outer row none of whose rows passes the
-- ON clause keeps one row with NULLs for the subquery's columns.
--
EXPLAIN (COSTS OFF)
SELECT q.qn, n.id, n.dist
FROM knn_shapes_queries q
LEFT JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_items t
                   ORDER BY t.v <-> q.v LIMIT 3) n ON true;
-- With nothing filtered it is the inner join's result; a NULL query vector
-- (qn 3) gets the first 3 rows with NULL distances, as in knn_scan.
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	LEFT JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_items t
	                   ORDER BY t.v <-> q.v LIMIT 3) n ON true $$, false);
-- The ON clause on the subquery's output and on both sides: rows at
-- distance below 1.5 to a neighbour of another id. Worked out by hand
-- (the top 3 by distance, then id, NULL id last; then the ON clause):
--  1 [0,0]:  1 0, NULL 0, 2 1 (1: own id, NULL: "<>" is NULL) -> 2
--  2 [1,0]:  2 0, 11 0, 1 1                                   -> 11, 1
--  3 NULL:   NULL distances                              -> NULL-extended
--  4 [2,2]:  4 sqrt(2), 5 2, 2 sqrt(5) (4: own id)       -> NULL-extended
--  5 [0,0]:  id NULL: "n.id <> q.id" is NULL             -> NULL-extended
--  6 [-3,1]: 8 sqrt(5) ...                               -> NULL-extended
--  7 [4,4]:  7 1, 12 sqrt(2), 4 sqrt(18) (7: own id)     -> 12
--  8 [1,2]:  4 1, 3 sqrt(2), 2 2 (id 99)                 -> 4, 3
--  9 [1,0]:  2 0, 11 0, 1 1 (id 11)                      -> 2, 1
EXPLAIN (COSTS OFF)
SELECT q.qn, n.id, n.dist
FROM knn_shapes_queries q
LEFT JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_items t
                   ORDER BY t.v <-> q.v, t.id LIMIT 3) n ON n.dist < 1.5 AND n.id <> q.id;
SELECT * FROM pg_temp.knn_show($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	LEFT JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_items t
	                   ORDER BY t.v <-> q.v, t.id LIMIT 3) n ON n.dist < 1.5 AND n.id <> q.id $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	LEFT JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_items t
	                   ORDER BY t.v <-> q.v, t.id LIMIT 3) n ON n.dist < 1.5 AND n.id <> q.id $$);
-- An ON clause on the outer side alone decides a match too; a constant
-- column of the subquery is NULL in a NULL-extended row.
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	LEFT JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_items t
	                   ORDER BY t.v <-> q.v, t.id LIMIT 2) n ON q.qn > 3 $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.one AS dist
	FROM knn_shapes_queries q
	LEFT JOIN LATERAL (SELECT t.id, 1.0::float8 AS one FROM knn_shapes_items t
	                   ORDER BY t.v <-> q.v, t.id LIMIT 2) n ON n.id > 3 $$);
-- A WHERE clause that is not strict stays above the outer join ("Filter"):
-- it sees the NULL-extended rows too. Expressions over the NULLs.
EXPLAIN (COSTS OFF)
SELECT q.qn, n.id, coalesce(n.dist, -1) AS dist
FROM knn_shapes_queries q
LEFT JOIN LATERAL (SELECT t.id, t.v <=> q.v AS dist FROM knn_shapes_items t
                   ORDER BY t.v <=> q.v LIMIT 2) n ON n.dist < 0.1
WHERE n.id IS NULL OR n.id % 2 = 0;
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, coalesce(n.dist, -1) AS dist
	FROM knn_shapes_queries q
	LEFT JOIN LATERAL (SELECT t.id, t.v <=> q.v AS dist FROM knn_shapes_items t
	                   ORDER BY t.v <=> q.v, t.id LIMIT 2) n ON n.dist < 0.1
	WHERE n.id IS NULL OR n.id % 2 = 0 $$);
-- The inner relation filtered to nothing, empty, LIMIT 0, OFFSET past the
-- end: every outer row once, with NULLs.
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	LEFT JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_items t
	                   WHERE t.id < 0 ORDER BY t.v <-> q.v LIMIT 3) n ON true $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	LEFT JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_empty t
	                   ORDER BY t.v <-> q.v LIMIT 3) n ON true $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	LEFT JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_items t
	                   ORDER BY t.v <-> q.v LIMIT 0) n ON true $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	LEFT JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_items t
	                   WHERE t.id < 100 ORDER BY t.v <-> q.v LIMIT 3 OFFSET 13) n ON true $$);
-- Every metric; only some outer rows have matches.
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	LEFT JOIN LATERAL (SELECT t.id, t.v <#> q.v AS dist FROM knn_shapes_items t
	                   WHERE t.id < 100 ORDER BY t.v <#> q.v, t.id LIMIT 4) n ON n.dist < -2 $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	LEFT JOIN LATERAL (SELECT t.id, q.v <+> t.v AS dist FROM knn_shapes_items t
	                   ORDER BY t.v <+> q.v, t.id LIMIT 4) n ON n.dist <= 2 $$);
-- The anti-join idiom: outer rows without a neighbour within 2.
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	LEFT JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_items t
	                   ORDER BY t.v <-> q.v LIMIT 1) n ON n.dist < 2
	WHERE n.id IS NULL $$);
-- No outer rows: nothing, and no error for a negative LIMIT.
SELECT * FROM pg_temp.knn_check($$
	SELECT q.id AS qid, n.id AS nid, n.dist
	FROM knn_shapes_empty q
	LEFT JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_items t
	                   ORDER BY t.v <-> q.v LIMIT -1) n ON true $$);

--
-- 2. Self-exclusion: "t.id <> q.id" in the subquery is the engine's
-- exclusion of equal keys. A NULL on either side makes "<>" NULL: an outer
-- row with a NULL id (qn 5) has no rows, an inner row with a NULL id (the
-- one at [0,0]) belongs to none.
--
EXPLAIN (COSTS OFF)
SELECT q.qn, n.id, n.dist
FROM knn_shapes_queries q
CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_items t
                    WHERE t.id <> q.id AND t.id < 3000
                    ORDER BY t.v <-> q.v LIMIT 3) n;
-- By hand (ties in id order):
--  1 [0,0]:  (1 excluded) 2, 3, 8 at 1
--  2 [1,0]:  (2 excluded) 11 0, 1 1, 4 1
--  3 NULL:   NULL distances: 1, 2, 4 (3 excluded)
--  4 [2,2]:  (4 excluded) 5 2, 2 and 3 sqrt(5)
--  5 [0,0]:  id NULL: nothing
--  6 [-3,1]: 8 sqrt(5), 3 3, 1 sqrt(10)
--  7 [4,4]:  (7 excluded) 12 sqrt(2), 4 sqrt(18), 5 sqrt(20)
--  8 [1,2]:  99 is no item's: 4 1, 3 sqrt(2), 2 2
--  9 [1,0]:  (11 excluded) 2 0, 1 1, 4 1
SELECT * FROM pg_temp.knn_show($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_items t
	                    WHERE t.id <> q.id AND t.id < 3000
	                    ORDER BY t.v <-> q.v LIMIT 3) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_items t
	                    WHERE t.id <> q.id ORDER BY t.v <-> q.v, t.id LIMIT 3) n $$);
-- Operands in the other order; every key type: bigint, text (two items
-- share tag 'b', both excluded for qn 2 and 9; item 12's tag is NULL),
-- uuid, numeric (1 = 1.00) and bpchar ('k1' = 'k1  ').
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_items t
	                    WHERE q.big <> t.big ORDER BY t.v <-> q.v, t.id LIMIT 4) n $$);
SELECT * FROM pg_temp.knn_show($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_items t
	                    WHERE t.tag <> q.tag AND t.id <= 12
	                    ORDER BY t.v <-> q.v, t.id LIMIT 12) n $$)
WHERE qid IN (2, 7, 9);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <=> q.v AS dist FROM knn_shapes_items t
	                    WHERE t.tag <> q.tag ORDER BY t.v <=> q.v, t.id LIMIT 5) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <#> q.v AS dist FROM knn_shapes_items t
	                    WHERE t.uid <> q.uid ORDER BY t.v <#> q.v, t.id LIMIT 5) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <+> q.v AS dist FROM knn_shapes_items t
	                    WHERE t.num <> q.num ORDER BY t.v <+> q.v, t.id LIMIT 5) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_items t
	                    WHERE t.code <> q.code ORDER BY t.v <-> q.v, t.id LIMIT 5) n $$);
-- A case-insensitive collation: 'B' (qn 2 and 9) excludes both 'b' items.
SELECT * FROM pg_temp.knn_show($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_items t
	                    WHERE t.ci <> q.ci ORDER BY t.v <-> q.v, t.id LIMIT 3) n $$)
WHERE qid IN (2, 9);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_items t
	                    WHERE t.ci <> q.ci ORDER BY t.v <-> q.v, t.id LIMIT 3) n $$);
-- NULL target vectors fill the last places (items 6 and 9), except the
-- excluded one; k beyond the rows left.
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_items t
	                    WHERE t.id <> q.id AND t.id BETWEEN 4 AND 9
	                    ORDER BY t.v <-> q.v, t.id LIMIT 7) n $$);
-- The all-kNN graph of one table: a self-join, with LEFT JOIN and OFFSET.
SELECT * FROM pg_temp.knn_check($$
	SELECT a.id AS qid, n.id AS nid, n.dist
	FROM knn_shapes_items a
	CROSS JOIN LATERAL (SELECT b.id, a.v <-> b.v AS dist FROM knn_shapes_items b
	                    WHERE b.id <> a.id ORDER BY a.v <-> b.v, b.id LIMIT 3) n
	WHERE a.id % 10 = 3 OR a.id < 20 OR a.id IS NULL $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT a.id AS qid, n.id AS nid, n.dist
	FROM knn_shapes_items a
	LEFT JOIN LATERAL (SELECT b.id, a.v <-> b.v AS dist FROM knn_shapes_items b
	                   WHERE b.id <> a.id AND b.id < 1000
	                   ORDER BY a.v <-> b.v, b.id LIMIT 2 OFFSET 9) n ON true
	WHERE a.id % 100 = 3 OR a.id < 20 OR a.id IS NULL $$);
-- A pair the exclusion removes never computes its distance, so vectors
-- of different dimensions in it are no error: the 3-D item 5000 is only
-- the 2-D outer rows' own id. Another outer row would meet it: an error.
CREATE TABLE knn_shapes_mixed (id int, v vector);
INSERT INTO knn_shapes_mixed SELECT id, v FROM knn_shapes_items WHERE v IS NOT NULL;
INSERT INTO knn_shapes_mixed VALUES (5000, '[1,2,3]');
CREATE TABLE knn_shapes_own (id int, v vector);
INSERT INTO knn_shapes_own SELECT 5000, format('[%s,2]', i)::vector FROM generate_series(1, 50) i;
ANALYZE knn_shapes_mixed, knn_shapes_own;
SELECT * FROM pg_temp.knn_check($$
	SELECT q.v::text AS qid, n.id AS nid, n.dist
	FROM knn_shapes_own q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_mixed t
	                    WHERE t.id <> q.id ORDER BY t.v <-> q.v, t.id LIMIT 3) n $$);
INSERT INTO knn_shapes_own VALUES (1, '[0,0]');
SELECT pg_temp.knn_uses_join($$
	SELECT count(*) FROM knn_shapes_own q
	CROSS JOIN LATERAL (SELECT t.id FROM knn_shapes_mixed t WHERE t.id <> q.id
	                    ORDER BY t.v <-> q.v LIMIT 3) n $$);
SELECT count(*) FROM knn_shapes_own q
CROSS JOIN LATERAL (SELECT t.id FROM knn_shapes_mixed t WHERE t.id <> q.id
                    ORDER BY t.v <-> q.v LIMIT 3) n;
SET knn_gpu.enable_knn_join = off;
SELECT count(*) FROM knn_shapes_own q
CROSS JOIN LATERAL (SELECT t.id FROM knn_shapes_mixed t WHERE t.id <> q.id
                    ORDER BY t.v <-> q.v LIMIT 3) n;
RESET knn_gpu.enable_knn_join;
DROP TABLE knn_shapes_mixed, knn_shapes_own;
-- Not a self-exclusion: another comparison, an expression, two types,
-- two of them. PostgreSQL's plan stays.
SELECT pg_temp.knn_uses_join($$
	SELECT q.id, n.id FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id FROM knn_shapes_items t WHERE t.id < q.id
	                    ORDER BY t.v <-> q.v LIMIT 3) n $$);
SELECT pg_temp.knn_uses_join($$
	SELECT q.id, n.id FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id FROM knn_shapes_items t WHERE t.id <> q.id + 1
	                    ORDER BY t.v <-> q.v LIMIT 3) n $$);
SELECT pg_temp.knn_uses_join($$
	SELECT q.id, n.id FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id FROM knn_shapes_items t WHERE t.id <> q.big
	                    ORDER BY t.v <-> q.v LIMIT 3) n $$);
SELECT pg_temp.knn_uses_join($$
	SELECT q.id, n.id FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id FROM knn_shapes_items t
	                    WHERE t.id <> q.id AND t.tag <> q.tag
	                    ORDER BY t.v <-> q.v LIMIT 3) n $$);

--
-- 3. ORDER BY the distance, then columns of the relation: the inner scan
-- is sorted by them, and ties come in that order, so even neighbours tied
-- at the k-th place are PostgreSQL's (ids compared below).
--
EXPLAIN (COSTS OFF)
SELECT q.qn, n.id, n.dist
FROM knn_shapes_queries q
CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_items t
                    ORDER BY t.v <-> q.v, t.tag DESC, t.id LIMIT 3) n;
-- By hand, ties by tag descending (NULL first, as DESC sorts it; 'b'
-- twice: then id):
--  1 [0,0]:  at 0: the NULL-id row (tag NULL), 1; then at 1: h 8, c 3, b 2,
--            b 11                                      -> NULL, 1, 8
--  2 [1,0]:  at 0: 2, 11 (both 'b'); then at 1: NULL-id row (tag NULL),
--            e 5, d 4, a 1                             -> 2, 11, NULL
--  4 [2,2]:  4 sqrt(2), 5 2, then at sqrt(5): g 7, c 3, b 2, b 11 -> 4, 5, 7
SELECT * FROM pg_temp.knn_show($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_items t
	                    ORDER BY t.v <-> q.v, t.tag DESC, t.id LIMIT 3) n $$)
WHERE qid IN (1, 2, 4);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_items t
	                    ORDER BY t.v <-> q.v, t.tag DESC, t.id LIMIT 3) n $$);
-- A NULL query vector: every distance is NULL, so the tie keys alone.
-- Keys that are expressions, NULLS FIRST, a key not in the select list.
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_items t
	                    ORDER BY t.v <-> q.v, t.id % 3, t.id DESC LIMIT 5) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <=> q.v AS dist FROM knn_shapes_items t
	                    WHERE t.id IS NULL OR t.id < 13
	                    ORDER BY t.v <=> q.v, t.id NULLS FIRST LIMIT 13) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <#> q.v AS dist FROM knn_shapes_items t
	                    ORDER BY t.v <#> q.v, t.uid LIMIT 6) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <+> q.v AS dist FROM knn_shapes_items t
	                    ORDER BY t.v <+> q.v, t.code COLLATE "C" DESC LIMIT 6) n $$);
-- Not a tie order: the distance not first, a key of the outer query, a
-- volatile key.
SELECT pg_temp.knn_uses_join($$
	SELECT q.id, n.id FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id FROM knn_shapes_items t
	                    ORDER BY t.id, t.v <-> q.v LIMIT 3) n $$);
SELECT pg_temp.knn_uses_join($$
	SELECT q.id, n.id FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id FROM knn_shapes_items t
	                    ORDER BY t.v <-> q.v, t.id + q.id LIMIT 3) n $$);
SELECT pg_temp.knn_uses_join($$
	SELECT q.id, n.id FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id FROM knn_shapes_items t
	                    ORDER BY t.v <-> q.v, random() LIMIT 3) n $$);

--
-- 4. OFFSET: the ranks after the first n.
--
EXPLAIN (COSTS OFF)
SELECT q.qn, n.id, n.dist
FROM knn_shapes_queries q
CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_items t
                    ORDER BY t.v <-> q.v, t.id LIMIT 2 OFFSET 2) n;
-- By hand: ranks 3 and 4 of the table at the top of section 3 (ties by id).
--  1 [0,0]:  1 0, NULL-id 0, 2 1, 3 1, 8 1, 11 1     -> 2, 3
--  3 NULL:   NULL distances in id order, NULL id last -> 3, 4
--  7 [4,4]:  7 1, 12 sqrt(2), 4 sqrt(18), 5 sqrt(20) -> 4, 5
SELECT * FROM pg_temp.knn_show($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_items t
	                    ORDER BY t.v <-> q.v, t.id LIMIT 2 OFFSET 2) n $$)
WHERE qid IN (1, 3, 7);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_items t
	                    ORDER BY t.v <-> q.v, t.id LIMIT 2 OFFSET 2) n $$);
-- Without a tie order (distances compared), into the NULL vectors' places,
-- OFFSET NULL, LIMIT ALL, past the end, every metric.
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_items t
	                    ORDER BY t.v <-> q.v LIMIT 4 OFFSET 5) n $$, false);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <=> q.v AS dist FROM knn_shapes_items t
	                    WHERE t.id < 100 ORDER BY t.v <=> q.v, t.id LIMIT 4 OFFSET 9) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <#> q.v AS dist FROM knn_shapes_items t
	                    ORDER BY t.v <#> q.v, t.id LIMIT 3 OFFSET NULL) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <+> q.v AS dist FROM knn_shapes_items t
	                    WHERE t.id < 100 ORDER BY t.v <+> q.v, t.id LIMIT ALL OFFSET 3) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_items t
	                    WHERE t.id < 100 ORDER BY t.v <-> q.v LIMIT 3 OFFSET 12) n $$, false);
-- OFFSET and LIMIT as parameters, custom and generic plans; a negative
-- OFFSET is the Limit node's error, checked before LIMIT's.
PREPARE knn_shapes_stmt(int, int) AS
	SELECT q.qn, n.id, n.dist
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_items t
	                    WHERE t.id <> q.id ORDER BY t.v <-> q.v, t.id LIMIT $1 OFFSET $2) n
	WHERE q.qn IN (1, 3);
EXPLAIN (COSTS OFF) EXECUTE knn_shapes_stmt(2, 1);
EXECUTE knn_shapes_stmt(2, 1);
SET plan_cache_mode = force_generic_plan;
EXPLAIN (COSTS OFF) EXECUTE knn_shapes_stmt(2, 1);
EXECUTE knn_shapes_stmt(2, 1);
EXECUTE knn_shapes_stmt(1, 3);
EXECUTE knn_shapes_stmt(0, -1);
EXECUTE knn_shapes_stmt(-1, -1);
SET knn_gpu.enable_knn_join = off;
EXECUTE knn_shapes_stmt(0, -1);
RESET knn_gpu.enable_knn_join;
RESET plan_cache_mode;
DEALLOCATE knn_shapes_stmt;

-- All four at once, re-run per outer row with a new parameter (a rescan):
-- the second nearest of another id within o.x, if any.
EXPLAIN (COSTS OFF)
SELECT o.x, (SELECT string_agg(q.qn || '>' || coalesce(n.id::text, '-'), ' ' ORDER BY q.qn)
             FROM knn_shapes_queries q
             LEFT JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_items t
                                WHERE t.id <> q.id ORDER BY t.v <-> q.v, t.id
                                LIMIT 1 OFFSET 1) n ON n.dist < o.x
             WHERE q.qn <> o.x)
FROM generate_series(1, 3) o(x);
SELECT o.x, (SELECT string_agg(q.qn || '>' || coalesce(n.id::text, '-'), ' ' ORDER BY q.qn)
             FROM knn_shapes_queries q
             LEFT JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_items t
                                WHERE t.id <> q.id ORDER BY t.v <-> q.v, t.id
                                LIMIT 1 OFFSET 1) n ON n.dist < o.x
             WHERE q.qn <> o.x)
FROM generate_series(1, 3) o(x);
SET knn_gpu.enable_knn_join = off;
SELECT o.x, (SELECT string_agg(q.qn || '>' || coalesce(n.id::text, '-'), ' ' ORDER BY q.qn)
             FROM knn_shapes_queries q
             LEFT JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_items t
                                WHERE t.id <> q.id ORDER BY t.v <-> q.v, t.id
                                LIMIT 1 OFFSET 1) n ON n.dist < o.x
             WHERE q.qn <> o.x)
FROM generate_series(1, 3) o(x);
RESET knn_gpu.enable_knn_join;

--
-- 5. What is still declined says why at DEBUG1, once per join considered.
--
SET client_min_messages = debug1;
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM knn_shapes_queries q
CROSS JOIN LATERAL (SELECT t.id FROM knn_shapes_items t WHERE t.id < q.id
                    ORDER BY t.v <-> q.v LIMIT 3) n;
EXPLAIN (COSTS OFF)
SELECT q.id, n FROM knn_shapes_queries q
LEFT JOIN LATERAL (SELECT t.id FROM knn_shapes_items t ORDER BY t.v <-> q.v LIMIT 3) n ON true;
-- (No message for a subquery that is not ordered by a distance.)
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM knn_shapes_queries q
CROSS JOIN LATERAL (SELECT t.id FROM knn_shapes_items t WHERE t.id < q.id
                    ORDER BY t.id LIMIT 3) n;
RESET client_min_messages;

--
-- 6. Where PostgreSQL computes an expression only for some rows, the node
-- would compute it for all (review r12keys): such shapes are declined, and
-- return what PostgreSQL returns, neither an error nor a crash.
--
-- A query vector that is an expression (here a function with default
-- arguments, which the node once called with its raw arguments) is now the
-- node's, computed with the arguments PostgreSQL's planning gives it and
-- for the outer rows PostgreSQL computes it for (knn_scan_expressions)
CREATE FUNCTION pg_temp.shifted(a vector, b text DEFAULT 'x', c text DEFAULT 'y', d text DEFAULT 'z')
RETURNS vector LANGUAGE plpgsql IMMUTABLE AS
$$ BEGIN RETURN a + format('[%s,0]', length(b) + length(c) + length(d) - 3)::vector; END $$;
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> pg_temp.shifted(q.v) AS dist FROM knn_shapes_items t
	                    ORDER BY t.v <-> pg_temp.shifted(q.v), t.id LIMIT 2) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> pg_temp.shifted(d => 'w', a => q.v) AS dist FROM knn_shapes_items t
	                    ORDER BY t.v <-> pg_temp.shifted(d => 'w', a => q.v), t.id LIMIT 2) n $$);
-- ... which PostgreSQL never computes for LIMIT 0 or an empty relation
CREATE TEMP TABLE knn_shapes_texts AS SELECT 1 AS qn, 'not a vector'::text AS s;
SELECT count(*) AS no_rows FROM knn_shapes_texts q
CROSS JOIN LATERAL (SELECT t.id FROM knn_shapes_items t ORDER BY t.v <-> q.s::vector LIMIT 0) n;
SELECT count(*) AS no_rows FROM knn_shapes_texts q
CROSS JOIN LATERAL (SELECT t.id FROM knn_shapes_empty t ORDER BY t.v <-> q.s::vector LIMIT 3) n;
-- A subquery in FROM that references the outer row
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist
	                    FROM (SELECT * FROM knn_shapes_items i WHERE i.id <> q.id) t
	                    ORDER BY t.v <-> q.v, t.id LIMIT 3) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist
	                    FROM (SELECT i.*, q.qn AS outer_qn FROM knn_shapes_items i) t
	                    ORDER BY t.v <-> q.v, t.id LIMIT 3) n $$);
-- A costly select-list function, which PostgreSQL calls for the k rows
-- kept only, and one under a WHERE of the outer row's, which it calls for
-- the rows that WHERE keeps only: here each fails for another row
CREATE FUNCTION pg_temp.fails_far(id int) RETURNS int LANGUAGE plpgsql IMMUTABLE AS
$$ BEGIN IF id > 3000 THEN RAISE EXCEPTION 'computed for row %', id; END IF; RETURN id; END $$;
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT pg_temp.fails_far(t.id) AS id, t.v <-> q.v AS dist FROM knn_shapes_items t
	                    WHERE t.id IS NOT NULL ORDER BY t.v <-> q.v, t.id LIMIT 2) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, 10 / (t.id - 3000) AS cheap, t.v <-> q.v AS dist FROM knn_shapes_items t
	                    WHERE t.id <> q.id AND t.id < 2000 ORDER BY t.v <-> q.v, t.id LIMIT 2) n $$);
-- ... while a cheap one where the WHERE has no conjunct of the outer row's
-- is computed for the same rows as PostgreSQL's scan: still the node
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.id * 2 AS twice, t.v <-> q.v AS dist FROM knn_shapes_items t
	                    ORDER BY t.v <-> q.v, t.id LIMIT 2) n $$);
-- A view's column is what the view computes, for every row of the inner
-- scan, and is judged as that (review r13group: the node computed the
-- view's "10 / (id - 3000)" for the row PostgreSQL's WHERE never reached,
-- and its costly column for every row, and failed)
CREATE TEMP VIEW knn_shapes_view_cheap AS
	SELECT id, v, tag, 10 / (id - 3000) AS cheap, id * 2 AS twice FROM knn_shapes_items;
CREATE TEMP VIEW knn_shapes_view_costly AS
	SELECT id, v, tag, pg_temp.fails_far(id) AS costly FROM knn_shapes_items;
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist, n.cheap
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.cheap, t.v <-> q.v AS dist FROM knn_shapes_view_cheap t
	                    WHERE t.tag = q.tag ORDER BY t.v <-> q.v, t.id LIMIT 2) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist, n.costly
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.costly, t.v <-> q.v AS dist FROM knn_shapes_view_costly t
	                    ORDER BY t.v <-> q.v, t.id LIMIT 2) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist, n.whole
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t AS whole, t.v <-> q.v AS dist FROM knn_shapes_view_costly t
	                    ORDER BY t.v <-> q.v, t.id LIMIT 2) n $$);
-- ... also inside an expression (review r13diff2: only a bare column was followed)
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist, n.more
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.costly + 0 AS more, t.v <-> q.v AS dist FROM knn_shapes_view_costly t
	                    ORDER BY t.v <-> q.v, t.id LIMIT 2) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist, n.json
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, row_to_json(t)::text AS json, t.v <-> q.v AS dist FROM knn_shapes_view_costly t
	                    ORDER BY t.v <-> q.v, t.id LIMIT 2) n $$);
-- ... and a cheap one without a WHERE of the outer row's: still the node
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist, n.twice
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.twice, t.v <-> q.v AS dist FROM knn_shapes_view_cheap t
	                    ORDER BY t.v <-> q.v, t.id LIMIT 2) n $$);
DROP VIEW knn_shapes_view_cheap, knn_shapes_view_costly;
-- A condition of the WHERE on the relation alone that may fail (a function
-- that is not leakproof), which PostgreSQL evaluates after a cheaper one on
-- the outer row -- a group equality, a radius, a self-exclusion -- and so
-- only for the rows that one keeps, where the node's inner scan would
-- evaluate it for every row (review r15exprrev): here each fails for a
-- far row that no query's group or radius reaches
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_items t
	                    WHERE t.tag = q.tag AND pg_temp.fails_far(t.id) > 0
	                    ORDER BY t.v <-> q.v, t.id LIMIT 2) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_items t
	                    WHERE t.v <-> q.v < 3 AND pg_temp.fails_far(t.id) > 0
	                    ORDER BY t.v <-> q.v, t.id) n $$);
-- ... also a view's own condition, which joins the subquery's WHERE
CREATE TEMP VIEW knn_shapes_view_checked AS
	SELECT id, v, tag FROM knn_shapes_items WHERE pg_temp.fails_far(id) > 0;
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_view_checked t
	                    WHERE t.tag = q.tag ORDER BY t.v <-> q.v, t.id LIMIT 2) n $$);
DROP VIEW knn_shapes_view_checked;
-- ... while one that cannot fail (leakproof), or that PostgreSQL evaluates
-- first (cheaper than the radius), is evaluated for the same rows: the node
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_items t
	                    WHERE t.tag = q.tag AND t.id < 3500 AND t.tag <> 'c'
	                    ORDER BY t.v <-> q.v, t.id LIMIT 2) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_items t
	                    WHERE t.v <-> q.v < 3 AND t.tag NOT LIKE 'x%'
	                    ORDER BY t.v <-> q.v, t.id) n $$);
-- ... but after a self-exclusion alone the node evaluates such a condition
-- itself (Filter After Self Exclusion), for exactly the inner rows
-- PostgreSQL's plan evaluates it for: a row meets an outer row of another,
-- non-NULL key (outer rows in order, then scan order). Here
-- "t.tag NOT LIKE 'far2%'", "t.id % 3 <> 0" and "t.num > 2.5" (textlike,
-- int4mod and numeric_gt are not leakproof), each after "t.id <> q.id"
-- (of equal cost, written first).
EXPLAIN (COSTS OFF)
SELECT q.qn, n.id, n.dist
FROM knn_shapes_queries q
CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_items t
                    WHERE t.id <> q.id AND t.tag NOT LIKE 'far2%'
                    ORDER BY t.v <-> q.v, t.id LIMIT 3) n;
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_items t
	                    WHERE t.id <> q.id AND t.tag NOT LIKE 'far2%'
	                    ORDER BY t.v <-> q.v, t.id LIMIT 3) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	LEFT JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_items t
	                   WHERE t.id <> q.id AND t.id % 3 <> 0
	                   ORDER BY t.v <-> q.v, t.id LIMIT 4 OFFSET 1) n ON true $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_items t
	                    WHERE t.id <> q.id AND t.num > 2.5 AND t.tag IS NOT NULL
	                    ORDER BY t.v <-> q.v, t.id LIMIT 3) n $$);
-- The errors: a condition that fails for the rows listed (-1: a NULL id),
-- cheap (written first, PostgreSQL evaluates it before the self-exclusion)
-- or costly (after it); each query's error, or none, with the node on and
-- off (few outer rows: the node is made the cheaper plan).
SET enable_nestloop = off;
CREATE FUNCTION pg_temp.fails_on(id int, bad int[]) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS
$$ BEGIN IF coalesce(id, -1) = ANY (bad) THEN RAISE EXCEPTION 'evaluated for row %', id; END IF;
   RETURN true; END $$;
CREATE FUNCTION pg_temp.cheap_fails_on(id int, bad int[]) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE COST 1 AS
$$ BEGIN IF coalesce(id, -1) = ANY (bad) THEN RAISE EXCEPTION 'checked first for row %', id; END IF;
   RETURN true; END $$;
CREATE FUNCTION pg_temp.knn_errors(query text)
RETURNS TABLE (node_on boolean, error_on text, error_off text)
LANGUAGE plpgsql AS $$
DECLARE
	counted text := 'SELECT count(*) FROM (' || query || ') s';
	saved text := current_setting('knn_gpu.enable_knn_join');
BEGIN
	PERFORM set_config('knn_gpu.enable_knn_join', 'on', true);
	node_on := pg_temp.knn_uses_join(counted);
	BEGIN
		EXECUTE counted;
		error_on := 'none';
	EXCEPTION WHEN OTHERS THEN
		error_on := SQLSTATE || ' ' || SQLERRM;
	END;
	PERFORM set_config('knn_gpu.enable_knn_join', 'off', true);
	BEGIN
		EXECUTE counted;
		error_off := 'none';
	EXCEPTION WHEN OTHERS THEN
		error_off := SQLSTATE || ' ' || SQLERRM;
	END;
	PERFORM set_config('knn_gpu.enable_knn_join', saved, true);
	RETURN NEXT;
END
$$;
-- the outer rows (qn, id) in this order; the rows that fail
CREATE FUNCTION pg_temp.knn_error_case(outer_ids text, bad text, extra text DEFAULT '')
RETURNS TABLE (outer_rows text, failing text, node_on boolean, error_on text, error_off text)
LANGUAGE sql AS $$
	SELECT outer_ids, bad, e.*
	FROM pg_temp.knn_errors(format($q$
		SELECT q.qn AS qid, n.id AS nid, n.dist
		FROM (SELECT o.n AS qn, o.id, '[0,0]'::vector AS v
		      FROM unnest(%L::int[]) WITH ORDINALITY o(id, n) ORDER BY o.n) q
		CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_items t
		                    WHERE %s t.id <> q.id AND pg_temp.fails_on(t.id, %L)
		                    ORDER BY t.v <-> q.v, t.id LIMIT 3) n $q$,
		outer_ids, extra, bad)) e
$$;
SELECT * FROM pg_temp.knn_error_case('{1}', '{1}');          -- only its own row: none
SELECT * FROM pg_temp.knn_error_case('{1,1,1}', '{1,-1}');   -- ... and the NULL id: none
SELECT * FROM pg_temp.knn_error_case('{NULL,NULL}', '{1,2,3,1001}');  -- NULL keys: none
SELECT * FROM pg_temp.knn_error_case('{}', '{1,2,3}');       -- no outer row: none
SELECT * FROM pg_temp.knn_error_case('{1,1,5}', '{1}');      -- the third reaches row 1
SELECT * FROM pg_temp.knn_error_case('{1,2}', '{1,2}');      -- the first reaches row 2
SELECT * FROM pg_temp.knn_error_case('{2,1}', '{1,2}');      -- ... row 1
SELECT * FROM pg_temp.knn_error_case('{NULL,3,2}', '{2,3}'); -- the second reaches row 2
SELECT * FROM pg_temp.knn_error_case('{4,4,3}', '{4}');      -- the third reaches row 4
SELECT * FROM pg_temp.knn_error_case('{NULL,2}', '{1003,3}'); -- the second: row 3 (scan order)
-- a cheaper condition before the self-exclusion fails on a later row than
-- this one reaches for the first outer row: the first error is this one's
SELECT * FROM pg_temp.knn_error_case('{1}', '{2}', 'pg_temp.cheap_fails_on(t.id, ''{3}'') AND');
SELECT * FROM pg_temp.knn_error_case('{2}', '{2}', 'pg_temp.cheap_fails_on(t.id, ''{3}'') AND');
-- LIMIT 0 evaluates nothing
SELECT * FROM pg_temp.knn_errors($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_items t
	                    WHERE t.id <> q.id AND pg_temp.fails_on(t.id, '{1,2,3}')
	                    ORDER BY t.v <-> q.v, t.id LIMIT 0) n $$);
RESET enable_nestloop;
-- An index PostgreSQL's plan may scan applies its conditions first: the
-- node declines (PostgreSQL's plan) where one is among its choices, here
-- for "t.num > 3990", not for "t.num > 2.5" (most rows)
CREATE INDEX knn_shapes_items_num ON knn_shapes_items (num);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_items t
	                    WHERE t.id <> q.id AND t.num > 3990
	                    ORDER BY t.v <-> q.v, t.id LIMIT 3) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_items t
	                    WHERE t.id <> q.id AND t.num > 2.5
	                    ORDER BY t.v <-> q.v, t.id LIMIT 3) n $$);
DROP INDEX knn_shapes_items_num;
-- Memory: a node rescanned many times (here in a correlated sub-select)
-- keeps nothing of a run after the next starts; the memory of the
-- statement grows no more with the node than with PostgreSQL's plan.
CREATE TABLE knn_shapes_few (id int, v vector, tag text);
INSERT INTO knn_shapes_few
	SELECT i, format('[%s,%s]', i % 4, i % 3)::vector, 't' || i FROM generate_series(1, 20) i;
ANALYZE knn_shapes_few;
SET enable_nestloop = off;
-- the statement's executor memory after `rescans` runs of the sub-select
CREATE FUNCTION pg_temp.knn_rescan_memory(rescans int) RETURNS bigint
LANGUAGE plpgsql AS $f$
DECLARE
	used bigint;
BEGIN
	EXECUTE format($q$
		SELECT max(used) FROM (
			SELECT (SELECT sum(n.id) FROM knn_shapes_queries q
			        CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_few t
			                            WHERE t.id <> q.id AND t.tag NOT LIKE 't1%%'
			                            ORDER BY t.v <-> q.v, t.id LIMIT 3) n
			        WHERE q.qn <= g %% 3 + 1) AS s,
			       CASE WHEN g = %s THEN
			           (SELECT sum(used_bytes) FROM pg_backend_memory_contexts
			            WHERE name = 'ExecutorState' AND g IS NOT NULL) END AS used
			FROM generate_series(1, %s) g) r WHERE s IS NOT NULL OR used IS NOT NULL $q$,
		rescans, rescans) INTO used;
	RETURN used;
END
$f$;
SELECT pg_temp.knn_uses_join($$SELECT (SELECT sum(n.id) FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM knn_shapes_few t
	                    WHERE t.id <> q.id AND t.tag NOT LIKE 't1%'
	                    ORDER BY t.v <-> q.v, t.id LIMIT 3) n
	WHERE q.qn <= g % 3 + 1) FROM generate_series(1, 2) g$$) AS node;
CREATE TEMP TABLE knn_growth AS
	SELECT true AS node_on, pg_temp.knn_rescan_memory(3000) - pg_temp.knn_rescan_memory(100) AS bytes;
SET knn_gpu.enable_knn_join = off;
INSERT INTO knn_growth
	SELECT false, pg_temp.knn_rescan_memory(3000) - pg_temp.knn_rescan_memory(100);
SELECT max(bytes) FILTER (WHERE node_on) - max(bytes) FILTER (WHERE NOT node_on) < 65536 AS no_growth
FROM knn_growth;
DROP TABLE knn_growth;
RESET knn_gpu.enable_knn_join;
RESET enable_nestloop;
DROP TABLE knn_shapes_few;
-- An OFFSET past every row: no rows (not the node's limit of rows per outer row)
SELECT pg_temp.knn_uses_join($$SELECT q.qn, n.id FROM knn_shapes_queries q
	CROSS JOIN LATERAL (SELECT t.id FROM knn_shapes_items t ORDER BY t.v <-> q.v LIMIT 5 OFFSET 3000000000) n$$) AS node,
       count(*) AS no_rows
FROM knn_shapes_queries q
CROSS JOIN LATERAL (SELECT t.id FROM knn_shapes_items t ORDER BY t.v <-> q.v LIMIT 5 OFFSET 3000000000) n;

DROP TABLE knn_shapes_items, knn_shapes_queries, knn_shapes_empty;
DROP COLLATION knn_shapes_ci;
