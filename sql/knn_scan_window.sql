--
-- The top-k-per-row query written with row_number(), rank() or DISTINCT ON
-- over a join of two tables, planned as the KNN Join (knn_scan_window.c
-- rewrites it into the LATERAL form before planning), with the rows,
-- distances and row numbers (ranks) of PostgreSQL's own plan
-- (knn_gpu.enable_knn_join = off, which also turns the rewrite off); and the
-- shapes it leaves alone.
-- (The rewrite needs the library loaded before the statement is planned:
-- the INSERTs' vector literals below load it.)
--
SET extra_float_digits = 0;
SET jit = off;

-- A coarse grid (many equal distances), NULL vectors, a group column and a
-- halfvec copy; queries with a unique NOT NULL key, one with a NULL vector.
CREATE TABLE knn_w_items (id int PRIMARY KEY, v vector(3), h halfvec(3), g int);
INSERT INTO knn_w_items
SELECT i, CASE WHEN i % 41 = 0 THEN NULL
               ELSE format('[%s,%s,%s]', i % 7, (i / 7) % 5, i % 3)::vector(3) END,
       CASE WHEN i % 41 = 0 THEN NULL
            ELSE format('[%s,%s,%s]', i % 7, (i / 7) % 5, i % 3)::halfvec(3) END,
       i % 4
FROM generate_series(1, 1200) i;
CREATE TABLE knn_w_queries (id int PRIMARY KEY, v vector(3), h halfvec(3), g int, name text);
INSERT INTO knn_w_queries
SELECT i, CASE WHEN i = 13 THEN NULL
               ELSE format('[%s,%s,%s]', (i * 3) % 8, (i * 5) % 6, i % 4)::vector(3) END,
       format('[%s,%s,%s]', (i * 3) % 8, (i * 5) % 6, i % 4)::halfvec(3),
       i % 4, 'q' || i
FROM generate_series(1, 80) i;
-- Fewer rows than k, two of them with a NULL vector, some equal.
CREATE TABLE knn_w_few (id int PRIMARY KEY, v vector(3));
INSERT INTO knn_w_few
SELECT i, CASE WHEN i % 5 = 0 THEN NULL ELSE format('[%s,%s,0]', i % 3, i % 2)::vector(3) END
FROM generate_series(1, 12) i;
-- Keys that do not make one partition one row.
CREATE TABLE knn_w_no_key (id int, v vector(3));
INSERT INTO knn_w_no_key SELECT id, v FROM knn_w_queries;
CREATE TABLE knn_w_nullable (id int UNIQUE, v vector(3));
INSERT INTO knn_w_nullable SELECT id, v FROM knn_w_queries;
CREATE TABLE knn_w_deferred (id int UNIQUE DEFERRABLE INITIALLY DEFERRED NOT NULL, v vector(3));
INSERT INTO knn_w_deferred SELECT id, v FROM knn_w_queries;
-- (a parent's primary key does not cover its inheritance children)
CREATE TABLE knn_w_parent (id int PRIMARY KEY, v vector(3));
CREATE TABLE knn_w_child () INHERITS (knn_w_parent);
INSERT INTO knn_w_parent SELECT id, v FROM knn_w_queries;
INSERT INTO knn_w_child SELECT id, v FROM knn_w_queries;
ANALYZE knn_w_items, knn_w_queries, knn_w_few, knn_w_no_key, knn_w_nullable, knn_w_deferred,
        knn_w_parent, knn_w_child;

\i sql/knn_scan_helpers.psql
\i sql/same_under.psql

-- Runs a query with the node (and the rewrite) on and off and compares:
-- which plan had the node, the row counts, and the rows in one result and
-- not the other (EXCEPT ALL both ways, whole rows).
CREATE FUNCTION pg_temp.window_check(query text)
RETURNS TABLE (node_on boolean, node_off boolean, rows_on bigint, rows_off bigint, differing bigint)
LANGUAGE plpgsql AS $$
DECLARE
	saved text := current_setting('knn_gpu.enable_knn_join');
BEGIN
	PERFORM set_config('knn_gpu.enable_knn_join', 'on', true);
	node_on := pg_temp.knn_uses_join(query);
	EXECUTE 'CREATE TEMP TABLE knn_w_on AS SELECT r::text AS r FROM (' || query || ') r';
	PERFORM set_config('knn_gpu.enable_knn_join', 'off', true);
	node_off := pg_temp.knn_uses_join(query);
	EXECUTE 'CREATE TEMP TABLE knn_w_off AS SELECT r::text AS r FROM (' || query || ') r';
	PERFORM set_config('knn_gpu.enable_knn_join', saved, true);
	SELECT count(*) INTO rows_on FROM knn_w_on;
	SELECT count(*) INTO rows_off FROM knn_w_off;
	SELECT count(*) INTO differing FROM (
		(SELECT r FROM knn_w_on EXCEPT ALL SELECT r FROM knn_w_off)
		UNION ALL
		(SELECT r FROM knn_w_off EXCEPT ALL SELECT r FROM knn_w_on)) d;
	DROP TABLE knn_w_on, knn_w_off;
	RETURN NEXT;
END
$$;

-- The plans.
EXPLAIN (COSTS OFF)
SELECT query_id, target_id, d FROM (
  SELECT q.id AS query_id, t.id AS target_id, t.v <-> q.v AS d,
         row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v, t.id) AS rn
  FROM knn_w_queries q, knn_w_items t) s
WHERE rn <= 10;
EXPLAIN (COSTS OFF)
SELECT DISTINCT ON (q.id) q.id, t.id, t.v <-> q.v
FROM knn_w_queries q, knn_w_items t
ORDER BY q.id, t.v <-> q.v, t.id;
-- The rewrite is said at DEBUG1.
SET client_min_messages = debug1;
SELECT count(*) FROM (
  SELECT row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v) AS rn
  FROM knn_w_queries q, knn_w_items t) s
WHERE rn <= 10;
RESET client_min_messages;

-- row_number() with a tie key: the same rows, ids and row numbers.
SELECT * FROM pg_temp.window_check($$
  SELECT query_id, target_id, d, rn FROM (
    SELECT q.id AS query_id, t.id AS target_id, t.v <-> q.v AS d,
           row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v, t.id) AS rn
    FROM knn_w_queries q, knn_w_items t) s
  WHERE rn <= 10 $$);
-- A tie key descending, with "rn < 11", CROSS JOIN.
SELECT * FROM pg_temp.window_check($$
  SELECT query_id, target_id, d, rn FROM (
    SELECT q.id AS query_id, t.id AS target_id, t.v <-> q.v AS d,
           row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v, t.id DESC) AS rn
    FROM knn_w_queries q CROSS JOIN knn_w_items t) s
  WHERE rn < 11 $$);
-- Without a tie key (PostgreSQL numbers equal distances in any order): the
-- distance at each row number; "11 > rn", JOIN ... ON true.
SELECT * FROM pg_temp.window_check($$
  SELECT query_id, d, rn FROM (
    SELECT q.id AS query_id, t.id AS target_id, t.v <-> q.v AS d,
           row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v) AS rn
    FROM knn_w_queries q JOIN knn_w_items t ON true) s
  WHERE 11 > rn $$);
-- Self-exclusion (in the WHERE, and as the JOIN's ON), other conditions on
-- rn beside the bound, the cosine distance.
SELECT * FROM pg_temp.window_check($$
  SELECT * FROM (
    SELECT q.id AS query_id, t.id AS target_id, t.v <=> q.v AS d,
           row_number() OVER (PARTITION BY q.id ORDER BY t.v <=> q.v, t.id) AS rn
    FROM knn_w_items q, knn_w_items t WHERE t.id <> q.id) s
  WHERE rn <= 5 AND rn % 2 = 1 $$);
SELECT * FROM pg_temp.window_check($$
  SELECT * FROM (
    SELECT q.id AS query_id, t.id AS target_id, t.v <-> q.v AS d,
           row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v, t.id) AS rn
    FROM knn_w_items q JOIN knn_w_items t ON t.id <> q.id) s
  WHERE rn <= 3 $$);
-- Conditions on t alone, on q alone, and a group equality.
SELECT * FROM pg_temp.window_check($$
  SELECT * FROM (
    SELECT q.id AS query_id, q.name, t.id AS target_id, t.g, t.v <-> q.v AS d,
           row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v, t.id) AS rn
    FROM knn_w_queries q, knn_w_items t
    WHERE t.g <> 2 AND t.id % 5 <> 0 AND q.id < 50) s
  WHERE rn <= 4 $$);
SELECT * FROM pg_temp.window_check($$
  SELECT * FROM (
    SELECT q.id AS query_id, t.id AS target_id, t.v <-> q.v AS d,
           row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v, t.id) AS rn
    FROM knn_w_queries q, knn_w_items t WHERE t.g = q.g) s
  WHERE rn <= 4 $$);
-- Fewer targets than k, NULL vectors among them (numbered last).
SELECT * FROM pg_temp.window_check($$
  SELECT * FROM (
    SELECT q.id AS query_id, t.id AS target_id, t.v <-> q.v AS d,
           row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v, t.id) AS rn
    FROM knn_w_items q, knn_w_few t) s
  WHERE rn <= 20 $$);
SELECT s.* FROM (
  SELECT q.id AS query_id, t.id AS target_id, t.v <-> q.v AS d,
         row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v, t.id) AS rn
  FROM knn_w_queries q, knn_w_few t) s
WHERE rn <= 20 AND query_id IN (1, 13) ORDER BY query_id, rn;
-- The roles by the PARTITION BY: here the few rows are the queries.
SELECT * FROM pg_temp.window_check($$
  SELECT * FROM (
    SELECT q.id AS item_id, t.id AS few_id, t.v <-> q.v AS d,
           row_number() OVER (PARTITION BY t.id ORDER BY t.v <-> q.v, q.id) AS rn
    FROM knn_w_items q, knn_w_few t) s
  WHERE rn <= 3 $$);
-- halfvec.
SELECT * FROM pg_temp.window_check($$
  SELECT * FROM (
    SELECT q.id AS query_id, t.id AS target_id, t.h <-> q.h AS d,
           row_number() OVER (PARTITION BY q.id ORDER BY t.h <-> q.h, t.id) AS rn
    FROM knn_w_queries q, knn_w_items t) s
  WHERE rn <= 6 $$);
-- The select list through s: whole rows of both relations, their names
-- and types, the partitioning by a key and another column.
SELECT * FROM pg_temp.window_check($$
  SELECT s.* FROM (
    SELECT q.*, t.*, t.v <-> q.v AS d,
           row_number() OVER (PARTITION BY q.name, q.id ORDER BY t.v <-> q.v, t.id) AS rn
    FROM knn_w_queries q, knn_w_items t) s
  WHERE rn <= 2 $$);
SELECT s.* FROM (
  SELECT q.*, t.*, t.v <-> q.v AS d,
         row_number() OVER (PARTITION BY q.name, q.id ORDER BY t.v <-> q.v, t.id) AS rn
  FROM knn_w_queries q, knn_w_items t) s
WHERE rn <= 2 ORDER BY 1, rn LIMIT 4;
-- k as a parameter (a generic plan), also one that keeps no row, and in a WITH.
SET plan_cache_mode = force_generic_plan;
PREPARE knn_w_top(int) AS
SELECT query_id, target_id, d, rn FROM (
  SELECT q.id AS query_id, t.id AS target_id, t.v <-> q.v AS d,
         row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v, t.id) AS rn
  FROM knn_w_queries q, knn_w_items t) s
WHERE rn <= $1 ORDER BY query_id, rn;
SELECT pg_temp.knn_uses_join('EXECUTE knn_w_top(3)') AS node;
CREATE TEMP TABLE knn_w_param AS EXECUTE knn_w_top(3);
SET knn_gpu.enable_knn_join = off;
CREATE TEMP TABLE knn_w_literal AS
SELECT query_id, target_id, d, rn FROM (
  SELECT q.id AS query_id, t.id AS target_id, t.v <-> q.v AS d,
         row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v, t.id) AS rn
  FROM knn_w_queries q, knn_w_items t) s
WHERE rn <= 3;
RESET knn_gpu.enable_knn_join;
SELECT (SELECT count(*) FROM knn_w_param) AS rows,
       (SELECT count(*) FROM ((TABLE knn_w_param EXCEPT ALL TABLE knn_w_literal)
                              UNION ALL (TABLE knn_w_literal EXCEPT ALL TABLE knn_w_param)) d) AS differing;
DROP TABLE knn_w_param, knn_w_literal;
EXECUTE knn_w_top(0);
EXECUTE knn_w_top(NULL);
-- "rn < $1": LIMIT GREATEST($1, 1) - 1, so that 1, a very negative k or
-- NULL, which keep no row, are no error.
PREPARE knn_w_below(bigint) AS
SELECT count(*) FROM (
  SELECT row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v) AS rn
  FROM knn_w_queries q, knn_w_items t) s
WHERE rn < $1;
SELECT pg_temp.knn_uses_join('EXECUTE knn_w_below(4)') AS node;
EXECUTE knn_w_below(4);
EXECUTE knn_w_below(1);
EXECUTE knn_w_below(-9223372036854775808);
EXECUTE knn_w_below(NULL);
RESET plan_cache_mode;
SELECT * FROM pg_temp.window_check($$
  WITH s AS (
    SELECT q.id AS query_id, t.id AS target_id, t.v <-> q.v AS d,
           row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v, t.id) AS rn
    FROM knn_w_queries q, knn_w_items t)
  SELECT query_id, target_id, d, rn FROM s WHERE rn <= 7 $$);

-- DISTINCT ON, with and without a tie key, with self-exclusion, and with
-- LIMIT after it (the order by q's key is kept).
SELECT * FROM pg_temp.window_check($$
  SELECT DISTINCT ON (q.id) q.id, t.id AS target_id, t.v <-> q.v AS d
  FROM knn_w_queries q, knn_w_items t ORDER BY q.id, t.v <-> q.v, t.id $$);
SELECT * FROM pg_temp.window_check($$
  SELECT DISTINCT ON (q.id) q.id, t.v <-> q.v AS d
  FROM knn_w_queries q, knn_w_items t ORDER BY q.id, t.v <-> q.v $$);
SELECT * FROM pg_temp.window_check($$
  SELECT DISTINCT ON (q.id) q.id, t.id AS target_id, t.v <-> q.v AS d
  FROM knn_w_items q, knn_w_items t WHERE t.id <> q.id ORDER BY q.id, t.v <-> q.v, t.id $$);
SELECT pg_temp.knn_uses_join($$
  SELECT DISTINCT ON (q.id) q.id, t.id AS target_id, t.v <-> q.v AS d
  FROM knn_w_queries q, knn_w_items t ORDER BY q.id DESC, t.v <-> q.v, t.id LIMIT 5 OFFSET 2 $$) AS node,
  pg_temp.same_under($$
  SELECT DISTINCT ON (q.id) q.id, t.id AS target_id, t.v <-> q.v AS d
  FROM knn_w_queries q, knn_w_items t ORDER BY q.id DESC, t.v <-> q.v, t.id LIMIT 5 OFFSET 2 $$,
  'knn_gpu.enable_knn_join', 'on', 'off');
SELECT DISTINCT ON (q.id) q.id, t.id AS target_id, t.v <-> q.v AS d
FROM knn_w_queries q, knn_w_items t ORDER BY q.id DESC, t.v <-> q.v, t.id LIMIT 5 OFFSET 2;

-- The window form needs no key of q: its window numbers each partition's
-- rows again above the k rows per q row. Partitions of several q rows: a
-- column that is not a key, a parent read with its children (every row
-- twice), keys without a constraint, nullable or deferred. (Selected columns
-- are those that two equal pairs of different q rows share: such complete
-- ties may take either row number.)
SELECT * FROM pg_temp.window_check($$
  SELECT * FROM (SELECT q.g, t.id, t.v <-> q.v AS d,
                        row_number() OVER (PARTITION BY q.g ORDER BY t.v <-> q.v, t.id) AS rn
                 FROM knn_w_queries q, knn_w_items t WHERE t.id % 3 <> 0) s WHERE rn <= 7 $$);
SELECT * FROM pg_temp.window_check($$
  SELECT * FROM (SELECT q.id, t.id, t.v <-> q.v AS d,
                        row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v, t.id) AS rn
                 FROM knn_w_parent q, knn_w_items t) s WHERE rn <= 3 $$);
SELECT * FROM pg_temp.window_check($$
  SELECT * FROM (SELECT q.id, t.id, t.v <-> q.v AS d,
                        row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v, t.id) AS rn
                 FROM knn_w_no_key q, knn_w_items t) s WHERE rn <= 4 $$);
SELECT * FROM pg_temp.window_check($$
  SELECT * FROM (SELECT q.id, t.id, t.v <-> q.v AS d,
                        row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v, t.id) AS rn
                 FROM knn_w_nullable q, knn_w_items t) s WHERE rn < 3 $$);
SELECT * FROM pg_temp.window_check($$
  SELECT * FROM (SELECT q.id, t.id, t.v <-> q.v AS d,
                        row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v, t.id) AS rn
                 FROM knn_w_deferred q, knn_w_items t) s WHERE rn <= 2 $$);
-- a NULL partition key is one partition of its own, in both plans
INSERT INTO knn_w_nullable VALUES (NULL, '[1,1,1]'), (NULL, '[2,0,1]'), (NULL, NULL);
SELECT * FROM pg_temp.window_check($$
  SELECT * FROM (SELECT q.id, t.id, t.v <-> q.v AS d,
                        row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v, t.id) AS rn
                 FROM knn_w_nullable q, knn_w_items t) s WHERE rn <= 5 $$);
DELETE FROM knn_w_nullable WHERE id IS NULL;

-- rank() in place of row_number(): the LATERAL subquery keeps FETCH FIRST k
-- ROWS WITH TIES (every row tied with the k-th on all the window's ORDER BY
-- keys), rank() ranks them again above (knn_scan_window.c's header says why
-- the same rows pass with the same ranks). rank() keeps all ties, so the
-- whole rows, target ids included, are the same in both plans, also without
-- a tie key; the coarse grid has many equal distances.
EXPLAIN (COSTS OFF)
SELECT query_id, target_id, d FROM (
  SELECT q.id AS query_id, t.id AS target_id, t.v <-> q.v AS d,
         rank() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v, t.g) AS r
  FROM knn_w_queries q, knn_w_items t) s
WHERE r <= 10;
SET client_min_messages = debug1;
SELECT count(*) FROM (
  SELECT rank() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v) AS r
  FROM knn_w_queries q, knn_w_items t) s
WHERE r <= 10;
RESET client_min_messages;
-- Without a tie key ("r <= k", "r < k", "k >= r"); query 13's NULL vector
-- ties all items at rank 1.
SELECT * FROM pg_temp.window_check($$
  SELECT query_id, target_id, d, r FROM (
    SELECT q.id AS query_id, t.id AS target_id, t.v <-> q.v AS d,
           rank() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v) AS r
    FROM knn_w_queries q, knn_w_items t) s
  WHERE r <= 10 $$);
SELECT * FROM pg_temp.window_check($$
  SELECT query_id, target_id, d, r FROM (
    SELECT q.id AS query_id, t.id AS target_id, t.v <-> q.v AS d,
           rank() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v) AS r
    FROM knn_w_queries q CROSS JOIN knn_w_items t) s
  WHERE r < 4 $$);
SELECT * FROM pg_temp.window_check($$
  SELECT query_id, target_id, d, r FROM (
    SELECT q.id AS query_id, t.id AS target_id, t.v <=> q.v AS d,
           rank() OVER (PARTITION BY q.id ORDER BY t.v <=> q.v) AS r
    FROM knn_w_queries q JOIN knn_w_items t ON true) s
  WHERE 1 >= r $$);
-- Tie keys: one that ties (t.g), descending, and a unique one (t.id: the
-- ranks are row numbers).
SELECT * FROM pg_temp.window_check($$
  SELECT * FROM (
    SELECT q.id AS query_id, t.id AS target_id, t.g, t.v <-> q.v AS d,
           rank() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v, t.g DESC) AS r
    FROM knn_w_queries q, knn_w_items t) s
  WHERE r <= 6 $$);
SELECT * FROM pg_temp.window_check($$
  SELECT * FROM (
    SELECT q.id AS query_id, t.id AS target_id, t.v <-> q.v AS d,
           rank() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v, t.id) AS r
    FROM knn_w_queries q, knn_w_items t) s
  WHERE r < 8 $$);
-- Self-exclusion, conditions on t, on q and on both, other conditions on
-- the rank beside its bound, halfvec.
SELECT * FROM pg_temp.window_check($$
  SELECT * FROM (
    SELECT q.id AS query_id, t.id AS target_id, t.v <-> q.v AS d,
           rank() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v) AS r
    FROM knn_w_items q JOIN knn_w_items t ON t.id <> q.id WHERE q.id % 3 = 0) s
  WHERE r <= 5 AND r <> 2 $$);
SELECT * FROM pg_temp.window_check($$
  SELECT * FROM (
    SELECT q.id AS query_id, q.name, t.id AS target_id, t.v <-> q.v AS d,
           rank() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v) AS r
    FROM knn_w_queries q, knn_w_items t WHERE t.g <> 2 AND t.id % 5 <> 0 AND q.id < 60) s
  WHERE r <= 4 $$);
SELECT * FROM pg_temp.window_check($$
  SELECT * FROM (
    SELECT q.id AS query_id, t.id AS target_id, t.v <-> q.v AS d,
           rank() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v) AS r
    FROM knn_w_queries q, knn_w_items t WHERE t.g = q.g) s
  WHERE r <= 4 $$);
SELECT * FROM pg_temp.window_check($$
  SELECT * FROM (
    SELECT q.id AS query_id, t.id AS target_id, t.h <-> q.h AS d,
           rank() OVER (PARTITION BY q.id ORDER BY t.h <-> q.h) AS r
    FROM knn_w_queries q, knn_w_items t) s
  WHERE r <= 3 $$);
-- Fewer targets than k, NULL vectors among them (tied, ranked last); k that
-- cuts between the two NULL ones keeps both.
SELECT * FROM pg_temp.window_check($$
  SELECT * FROM (
    SELECT q.id AS query_id, t.id AS target_id, t.v <-> q.v AS d,
           rank() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v) AS r
    FROM knn_w_items q, knn_w_few t) s
  WHERE r <= 20 $$);
SELECT * FROM pg_temp.window_check($$
  SELECT * FROM (
    SELECT q.id AS query_id, t.id AS target_id, t.v <-> q.v AS d,
           rank() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v) AS r
    FROM knn_w_items q, knn_w_few t) s
  WHERE r <= 11 $$);
SELECT * FROM pg_temp.window_check($$
  SELECT * FROM (
    SELECT q.id AS query_id, t.id AS target_id, t.v <-> q.v AS d,
           rank() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v) AS r
    FROM knn_w_items q, knn_w_few t) s
  WHERE r <= 5 $$);
SELECT s.* FROM (
  SELECT q.id AS query_id, t.id AS target_id, t.v <-> q.v AS d,
         rank() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v) AS r
  FROM knn_w_queries q, knn_w_few t) s
WHERE r <= 11 AND query_id IN (1, 13) ORDER BY query_id, r, target_id;
-- Partitions of several q rows: a column that is not a key (with and
-- without a tie key), a parent read with its children (every pair twice),
-- keys without a constraint, a NULL partition key. (Unlike row_number(),
-- every column may be selected: ranks do not depend on the order of ties.)
SELECT * FROM pg_temp.window_check($$
  SELECT * FROM (SELECT q.g AS qg, q.id AS query_id, t.id AS target_id, t.v <-> q.v AS d,
                        rank() OVER (PARTITION BY q.g ORDER BY t.v <-> q.v) AS r
                 FROM knn_w_queries q, knn_w_items t WHERE t.id % 3 <> 0) s WHERE r <= 7 $$);
SELECT * FROM pg_temp.window_check($$
  SELECT * FROM (SELECT q.g AS qg, q.id AS query_id, t.id AS target_id, t.v <-> q.v AS d,
                        rank() OVER (PARTITION BY q.g ORDER BY t.v <-> q.v, t.g) AS r
                 FROM knn_w_queries q, knn_w_items t) s WHERE r < 30 $$);
SELECT * FROM pg_temp.window_check($$
  SELECT * FROM (SELECT q.id, t.id, t.v <-> q.v AS d,
                        rank() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v) AS r
                 FROM knn_w_parent q, knn_w_items t) s WHERE r <= 3 $$);
SELECT * FROM pg_temp.window_check($$
  SELECT * FROM (SELECT q.id, t.id, t.v <-> q.v AS d,
                        rank() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v, t.id) AS r
                 FROM knn_w_no_key q, knn_w_items t) s WHERE r <= 4 $$);
INSERT INTO knn_w_nullable VALUES (NULL, '[1,1,1]'), (NULL, '[2,0,1]'), (NULL, NULL);
SELECT * FROM pg_temp.window_check($$
  SELECT * FROM (SELECT q.id, q.v AS qv, t.id, t.v <-> q.v AS d,
                        rank() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v) AS r
                 FROM knn_w_nullable q, knn_w_items t) s WHERE r <= 5 $$);
DELETE FROM knn_w_nullable WHERE id IS NULL;
-- k as a parameter of a generic plan: the node, the rows of the literal, and
-- bounds that keep no row (0, NULL; "r < $1" with 1, a very negative k, NULL).
SET plan_cache_mode = force_generic_plan;
PREPARE knn_w_rank(int) AS
SELECT query_id, target_id, d, r FROM (
  SELECT q.id AS query_id, t.id AS target_id, t.v <-> q.v AS d,
         rank() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v) AS r
  FROM knn_w_queries q, knn_w_items t) s
WHERE r <= $1;
SELECT pg_temp.knn_uses_join('EXECUTE knn_w_rank(3)') AS node;
CREATE TEMP TABLE knn_w_param AS EXECUTE knn_w_rank(3);
SET knn_gpu.enable_knn_join = off;
CREATE TEMP TABLE knn_w_literal AS
SELECT query_id, target_id, d, r FROM (
  SELECT q.id AS query_id, t.id AS target_id, t.v <-> q.v AS d,
         rank() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v) AS r
  FROM knn_w_queries q, knn_w_items t) s
WHERE r <= 3;
RESET knn_gpu.enable_knn_join;
SELECT (SELECT count(*) FROM knn_w_param) AS rows,
       (SELECT count(*) FROM ((TABLE knn_w_param EXCEPT ALL TABLE knn_w_literal)
                              UNION ALL (TABLE knn_w_literal EXCEPT ALL TABLE knn_w_param)) d) AS differing;
DROP TABLE knn_w_param, knn_w_literal;
EXECUTE knn_w_rank(0);
EXECUTE knn_w_rank(-5);
EXECUTE knn_w_rank(NULL);
PREPARE knn_w_rank_below(bigint) AS
SELECT count(*) FROM (
  SELECT rank() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v) AS r
  FROM knn_w_queries q, knn_w_items t) s
WHERE r < $1;
SELECT pg_temp.knn_uses_join('EXECUTE knn_w_rank_below(4)') AS node;
EXECUTE knn_w_rank_below(4);
EXECUTE knn_w_rank_below(1);
EXECUTE knn_w_rank_below(-9223372036854775808);
EXECUTE knn_w_rank_below(NULL);
RESET plan_cache_mode;
SET knn_gpu.enable_knn_join = off;
SELECT count(*) FROM (
  SELECT rank() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v) AS r
  FROM knn_w_queries q, knn_w_items t) s
WHERE r < 4;
RESET knn_gpu.enable_knn_join;

-- Left alone: PostgreSQL's plan, and why.
SET client_min_messages = debug1;
-- PARTITION BY an expression
SELECT pg_temp.knn_uses_join($$
  SELECT * FROM (SELECT q.id, t.id, row_number() OVER (PARTITION BY q.id + 0 ORDER BY t.v <-> q.v) AS rn
                 FROM knn_w_queries q, knn_w_few t) s WHERE rn <= 2 $$);
-- DISTINCT ON keys that are not a key of q (not unique, nullable, deferred,
-- a parent read with its inheritance children): one row per key is not one
-- per q row
SELECT pg_temp.knn_uses_join($$
  SELECT DISTINCT ON (q.id) q.id, t.id FROM knn_w_no_key q, knn_w_few t ORDER BY q.id, t.v <-> q.v, t.id $$);
SELECT pg_temp.knn_uses_join($$
  SELECT DISTINCT ON (q.id) q.id, t.id FROM knn_w_nullable q, knn_w_few t ORDER BY q.id, t.v <-> q.v, t.id $$);
SELECT pg_temp.knn_uses_join($$
  SELECT DISTINCT ON (q.id) q.id, t.id FROM knn_w_deferred q, knn_w_few t ORDER BY q.id, t.v <-> q.v, t.id $$);
SELECT pg_temp.knn_uses_join($$
  SELECT DISTINCT ON (q.id) q.id, t.id FROM knn_w_parent q, knn_w_few t ORDER BY q.id, t.v <-> q.v, t.id $$);
-- DESC
SELECT pg_temp.knn_uses_join($$
  SELECT * FROM (SELECT q.id, t.id, row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v DESC) AS rn
                 FROM knn_w_queries q, knn_w_few t) s WHERE rn <= 2 $$);
-- other window functions: dense_rank() <= k may need more than k rows with
-- ties of each q row; percent_rank(), cume_dist() and ntile() count the
-- whole partition; rank() inside an expression
SELECT pg_temp.knn_uses_join($$
  SELECT * FROM (SELECT q.id, t.id, dense_rank() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v) AS rn
                 FROM knn_w_queries q, knn_w_few t) s WHERE rn <= 2 $$);
SELECT pg_temp.knn_uses_join($$
  SELECT * FROM (SELECT q.id, t.id, percent_rank() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v) AS rn
                 FROM knn_w_queries q, knn_w_few t) s WHERE rn <= 0.2 $$);
SELECT pg_temp.knn_uses_join($$
  SELECT * FROM (SELECT q.id, t.id, cume_dist() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v) AS rn
                 FROM knn_w_queries q, knn_w_few t) s WHERE rn <= 0.2 $$);
SELECT pg_temp.knn_uses_join($$
  SELECT * FROM (SELECT q.id, t.id, ntile(4) OVER (PARTITION BY q.id ORDER BY t.v <-> q.v) AS rn
                 FROM knn_w_queries q, knn_w_few t) s WHERE rn <= 1 $$);
SELECT pg_temp.knn_uses_join($$
  SELECT * FROM (SELECT q.id, t.id, count(*) OVER (PARTITION BY q.id ORDER BY t.v <-> q.v) AS rn
                 FROM knn_w_queries q, knn_w_few t) s WHERE rn <= 2 $$);
SELECT pg_temp.knn_uses_join($$
  SELECT * FROM (SELECT q.id, t.id, rank() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v) + 0 AS rn
                 FROM knn_w_queries q, knn_w_few t) s WHERE rn <= 2 $$);
SELECT pg_temp.knn_uses_join($$
  SELECT * FROM (SELECT q.id, t.id, row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v) AS rn,
                        count(*) OVER (PARTITION BY q.id) AS n
                 FROM knn_w_queries q, knn_w_few t) s WHERE rn <= 2 $$);
-- no upper bound on rn, or a condition on another column
SELECT pg_temp.knn_uses_join($$
  SELECT * FROM (SELECT q.id, t.id, row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v) AS rn
                 FROM knn_w_queries q, knn_w_few t) s WHERE rn >= 2 $$);
SELECT pg_temp.knn_uses_join($$
  SELECT * FROM (SELECT q.id, t.id, t.v <-> q.v AS d,
                        row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v) AS rn
                 FROM knn_w_queries q, knn_w_few t) s WHERE rn <= 2 OR d < 1 $$);
SELECT pg_temp.knn_uses_join($$
  SELECT * FROM (SELECT q.id, t.id, t.v <-> q.v AS d,
                        row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v) AS rn
                 FROM knn_w_queries q, knn_w_few t) s WHERE rn <= 2 AND d < 1 $$);
-- three relations
SELECT pg_temp.knn_uses_join($$
  SELECT * FROM (SELECT q.id, t.id, row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v) AS rn
                 FROM knn_w_queries q, knn_w_few t, knn_w_few u WHERE u.id = t.id) s WHERE rn <= 2 $$);
-- a view or a subquery as either relation (written as LATERAL, a view as
-- the inner relation has the node)
CREATE VIEW knn_w_items_view AS SELECT id, v FROM knn_w_items;
CREATE VIEW knn_w_queries_view AS SELECT id, v FROM knn_w_queries;
SELECT pg_temp.knn_uses_join($$
  SELECT * FROM (SELECT q.id, t.id, row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v) AS rn
                 FROM knn_w_queries q, knn_w_items_view t) s WHERE rn <= 2 $$);
SELECT pg_temp.knn_uses_join($$
  SELECT * FROM (SELECT q.id, t.id, rank() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v) AS r
                 FROM knn_w_queries_view q, knn_w_few t) s WHERE r <= 2 $$);
SELECT pg_temp.knn_uses_join($$
  SELECT * FROM (SELECT q.id, t.id, row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v) AS rn
                 FROM knn_w_queries q, (SELECT id, v FROM knn_w_few WHERE id > 2) t) s WHERE rn <= 2 $$);
SELECT pg_temp.knn_uses_join($$
  SELECT DISTINCT ON (q.id) q.id, t.id FROM knn_w_queries q, knn_w_items_view t ORDER BY q.id, t.v <-> q.v, t.id $$);
SELECT pg_temp.knn_uses_join($$
  SELECT q.id, n.id FROM knn_w_queries q CROSS JOIN LATERAL (
    SELECT t.id FROM knn_w_items_view t ORDER BY t.v <-> q.v, t.id LIMIT 2) n $$);
DROP VIEW knn_w_items_view, knn_w_queries_view;
-- a volatile function
SELECT pg_temp.knn_uses_join($$
  SELECT * FROM (SELECT q.id, t.id, random() AS r,
                        row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v) AS rn
                 FROM knn_w_queries q, knn_w_few t) s WHERE rn <= 2 $$);
-- an expression of the target relation in the select list
SELECT pg_temp.knn_uses_join($$
  SELECT * FROM (SELECT q.id, t.id * 2, row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v) AS rn
                 FROM knn_w_queries q, knn_w_few t) s WHERE rn <= 2 $$);
-- DISTINCT ON a column that is not a key
SELECT pg_temp.knn_uses_join($$
  SELECT DISTINCT ON (q.g) q.g, t.id FROM knn_w_queries q, knn_w_few t ORDER BY q.g, t.v <-> q.v $$);
-- the node turned off turns the rewrite off
SET knn_gpu.enable_knn_join = off;
SELECT pg_temp.knn_uses_join($$
  SELECT * FROM (SELECT q.id, t.id, row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v) AS rn
                 FROM knn_w_queries q, knn_w_few t) s WHERE rn <= 2 $$);
RESET knn_gpu.enable_knn_join;
RESET client_min_messages;

-- EXPLAIN names the rewrite on the KNN Join it produced ("Rewritten From",
-- above: row_number() window, rank() window, DISTINCT ON), in every format,
-- with VERBOSE and ANALYZE, in a WITH, and in a generic plan that the plan
-- cache keeps; the same LATERAL query written so (even with the rewrite's
-- alias, "nearest", and its column names) has no such line.
CREATE FUNCTION pg_temp.rewritten_from_json(query text)
RETURNS TABLE (provider text, rewritten_from text)
LANGUAGE plpgsql AS $$
DECLARE
	plan jsonb;
BEGIN
	EXECUTE 'EXPLAIN (FORMAT JSON, COSTS OFF) ' || query INTO plan;
	RETURN QUERY
	SELECT node ->> 'Custom Plan Provider', node ->> 'Rewritten From'
	FROM jsonb_path_query(plan, 'strict $.** ? (exists(@."Custom Plan Provider"))') node;
END
$$;
CREATE FUNCTION pg_temp.rewritten_from_yaml(query text) RETURNS SETOF text
LANGUAGE plpgsql AS $$
DECLARE
	plan text;
BEGIN
	EXECUTE 'EXPLAIN (FORMAT YAML, COSTS OFF) ' || query INTO plan;
	RETURN QUERY
	SELECT btrim(line) FROM regexp_split_to_table(plan, '\n') line
	WHERE line ~ '(Custom Plan Provider|Rewritten From):';
END
$$;
EXPLAIN (VERBOSE, COSTS OFF)
SELECT query_id, target_id, d FROM (
  SELECT q.id AS query_id, t.id AS target_id, t.v <-> q.v AS d,
         row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v, t.id) AS rn
  FROM knn_w_queries q JOIN knn_w_items t ON t.id <> q.id) s
WHERE rn <= 3;
SELECT * FROM pg_temp.knn_explain_analyze($$
  SELECT query_id, target_id, d FROM (
    SELECT q.id AS query_id, t.id AS target_id, t.v <-> q.v AS d,
           rank() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v) AS r
    FROM knn_w_queries q, knn_w_items t WHERE q.id <= 5) s
  WHERE r <= 2 $$);
SELECT * FROM pg_temp.rewritten_from_json($$
  SELECT * FROM (SELECT q.id, t.id, row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v) AS rn
                 FROM knn_w_queries q, knn_w_items t) s WHERE rn <= 2 $$);
SELECT * FROM pg_temp.rewritten_from_json($$
  SELECT * FROM (SELECT q.id, t.id, rank() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v) AS r
                 FROM knn_w_queries q, knn_w_items t) s WHERE r <= 2 $$);
SELECT * FROM pg_temp.rewritten_from_json($$
  SELECT DISTINCT ON (q.id) q.id, t.id FROM knn_w_queries q, knn_w_items t
  ORDER BY q.id, t.v <-> q.v $$);
SELECT * FROM pg_temp.rewritten_from_yaml($$
  WITH s AS (SELECT q.id, t.id, row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v) AS rn
             FROM knn_w_queries q, knn_w_items t)
  SELECT * FROM s WHERE rn <= 2 $$);
SELECT * FROM pg_temp.rewritten_from_yaml($$
  SELECT DISTINCT ON (q.id) q.id, t.id FROM knn_w_queries q, knn_w_items t
  ORDER BY q.id, t.v <-> q.v $$);
-- written as LATERAL: the node, no "Rewritten From"
EXPLAIN (COSTS OFF)
SELECT q.id, nearest.id, nearest.distance
FROM knn_w_queries q CROSS JOIN LATERAL (
  SELECT t.v <-> q.v AS distance, t.id FROM knn_w_items t
  ORDER BY t.v <-> q.v, t.id LIMIT 1) nearest
ORDER BY q.id;
SELECT * FROM pg_temp.rewritten_from_json($$
  SELECT q.id, nearest.id FROM knn_w_queries q CROSS JOIN LATERAL (
    SELECT t.v <-> q.v AS distance, t.id FROM knn_w_items t
    ORDER BY t.v <-> q.v FETCH FIRST 2 ROWS WITH TIES) nearest $$);
-- both in one statement: only the rewritten one says so
SELECT * FROM pg_temp.rewritten_from_json($$
  SELECT * FROM (SELECT q.id, t.id, row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v) AS rn
                 FROM knn_w_queries q, knn_w_items t) s WHERE rn <= 2
  UNION ALL
  SELECT q.id, nearest.id, 1 FROM knn_w_queries q CROSS JOIN LATERAL (
    SELECT t.v <-> q.v AS distance, t.id FROM knn_w_items t
    ORDER BY t.v <-> q.v LIMIT 2) nearest $$);
-- a generic plan, planned once and kept in the plan cache
PREPARE knn_w_prepared(int) AS
SELECT * FROM (SELECT q.id, t.id, rank() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v) AS r
               FROM knn_w_queries q, knn_w_items t) s WHERE r <= $1;
SET plan_cache_mode = force_generic_plan;
EXECUTE knn_w_prepared(1) \g /dev/null
EXPLAIN (COSTS OFF) EXECUTE knn_w_prepared(2);
EXPLAIN (COSTS OFF) EXECUTE knn_w_prepared(3);
RESET plan_cache_mode;
DEALLOCATE knn_w_prepared;

-- Where no KNN Join runs a rewritten subquery (here the node loses on cost:
-- two queries, three items), the statement is planned as written, not as
-- the LATERAL form without a word in EXPLAIN (nor over an approximate index
-- that the query as written never reads: knn_pgvector); DEBUG1 says so.
CREATE TABLE knn_w_tiny_q (id int PRIMARY KEY, v vector(2));
CREATE TABLE knn_w_tiny_t (id int PRIMARY KEY, v vector(2));
INSERT INTO knn_w_tiny_q VALUES (1, '[1,0]'), (2, '[2,0]');
INSERT INTO knn_w_tiny_t VALUES (1, '[1,1]'), (2, '[2,1]'), (3, '[3,1]');
ANALYZE knn_w_tiny_q, knn_w_tiny_t;
SET client_min_messages = debug1;
EXPLAIN (COSTS OFF)
SELECT * FROM (SELECT q.id AS qid, t.id AS tid,
                      row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v, t.id) AS rn
               FROM knn_w_tiny_q q, knn_w_tiny_t t) s WHERE rn <= 2;
EXPLAIN (COSTS OFF)
SELECT DISTINCT ON (q.id) q.id, t.id FROM knn_w_tiny_q q, knn_w_tiny_t t
ORDER BY q.id, t.v <-> q.v, t.id;
-- two rewrites in one statement, one of them run by a KNN Join: the whole
-- statement as written
EXPLAIN (COSTS OFF)
SELECT * FROM (SELECT q.id, t.id, row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v, t.id) AS rn
               FROM knn_w_queries q, knn_w_items t) s WHERE rn <= 2
UNION ALL
SELECT * FROM (SELECT q.id, t.id, row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v, t.id) AS rn
               FROM knn_w_tiny_q q, knn_w_tiny_t t) s WHERE rn <= 2;
-- Each rewrite is checked by itself: here one rewrite planned twice (a CTE
-- inlined twice), both run by KNN Joins, beside one no KNN Join runs: two
-- KNN Joins for two rewrites, yet the statement as written.
EXPLAIN (COSTS OFF)
WITH w AS NOT MATERIALIZED (
  SELECT * FROM (SELECT q.id AS qid, t.id AS tid,
                        row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v, t.id) AS rn
                 FROM knn_w_queries q, knn_w_items t) s WHERE rn <= 2)
SELECT a.qid, a.tid, b.rn FROM w a JOIN w b ON a.qid = b.qid AND a.tid = b.tid
UNION ALL
SELECT * FROM (SELECT q.id, t.id, row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v, t.id) AS rn
               FROM knn_w_tiny_q q, knn_w_tiny_t t) s WHERE rn <= 2;
-- A rewrite the planner drops (a CTE no one reads) needs no KNN Join.
EXPLAIN (COSTS OFF)
WITH unread AS (
  SELECT DISTINCT ON (q.id) q.id, t.id FROM knn_w_tiny_q q, knn_w_tiny_t t ORDER BY q.id, t.v <-> q.v, t.id)
SELECT * FROM (SELECT q.id, t.id, row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v, t.id) AS rn
               FROM knn_w_queries q, knn_w_items t) s WHERE rn <= 2;
-- The query as written is the one written: the JOIN's ON condition beside
-- the WHERE's, each once.
EXPLAIN (COSTS OFF)
SELECT * FROM (SELECT q.id AS qid, t.id AS tid,
                      row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v, t.id) AS rn
               FROM knn_w_tiny_q q JOIN knn_w_tiny_t t ON t.id <> q.id
               WHERE q.id > 0 AND t.id > 0) s WHERE rn <= 2;
-- A correlated EXISTS under OR is planned twice (an AlternativeSubPlan: hashed,
-- and once per row); setrefs keeps one of the two plans, a KNN Join runs the
-- rewrite in it, and the rewrite stands (the plan dropped counts for nothing).
EXPLAIN (COSTS OFF)
SELECT o.id FROM knn_w_no_key o WHERE o.id < 3 OR EXISTS (
  SELECT 1 FROM (SELECT * FROM (SELECT q.id AS qid, t.id AS tid,
                                       row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v, t.id) AS rn
                                FROM knn_w_queries q, knn_w_items t) s WHERE rn <= 2) w
  WHERE w.tid = o.id);
-- Nested: the EXISTS inside a correlated EXISTS under OR. Each plan of the
-- outer EXISTS holds both plans of the inner one; setrefs keeps the outer
-- plan run per row (one row of knn_w_one_row), and in it the inner plan run
-- per row (the index finds one row of knn_w_by_c), where no KNN Join runs the
-- rewrite (one query row: a nested loop). The outer plan dropped is never
-- resolved: its inner hashed plan, with a KNN Join, stays in the statement's
-- list unreferenced, and counts for nothing either: the query is planned as
-- written (no LATERAL subquery without a "Rewritten From" line).
SET client_min_messages = notice;
CREATE TABLE knn_w_one_row (a int, c int);
INSERT INTO knn_w_one_row VALUES (1, 1);
CREATE TABLE knn_w_by_c (id int, c int, d int);
INSERT INTO knn_w_by_c SELECT i, i, i FROM generate_series(1, 5000) i;
CREATE INDEX ON knn_w_by_c (c);
ANALYZE knn_w_one_row, knn_w_by_c;
SET client_min_messages = debug1;
EXPLAIN (COSTS OFF)
SELECT o.a FROM knn_w_one_row o WHERE o.a < 0 OR EXISTS (
  SELECT 1 FROM knn_w_by_c x WHERE x.c = o.c AND (x.d < 0 OR EXISTS (
    SELECT 1 FROM (SELECT * FROM (SELECT q.id AS qid, t.id AS tid,
                                         row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v, t.id) AS rn
                                  FROM knn_w_queries q, knn_w_items t) s WHERE rn <= 2) w
    WHERE w.qid = x.id)));
RESET client_min_messages;
SELECT * FROM pg_temp.window_check($$
  SELECT o.id FROM knn_w_no_key o WHERE o.id < 3 OR EXISTS (
    SELECT 1 FROM (SELECT * FROM (SELECT q.id AS qid, t.id AS tid,
                                         row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v, t.id) AS rn
                                  FROM knn_w_queries q, knn_w_items t) s WHERE rn <= 2) w
    WHERE w.tid = o.id) $$);
SELECT * FROM pg_temp.window_check($$
  SELECT * FROM (SELECT q.id AS qid, t.id AS tid,
                        row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v, t.id) AS rn
                 FROM knn_w_tiny_q q, knn_w_tiny_t t) s WHERE rn <= 2 $$);
DROP TABLE knn_w_tiny_q, knn_w_tiny_t;
SELECT * FROM pg_temp.window_check($$
  SELECT o.a FROM knn_w_one_row o WHERE o.a < 0 OR EXISTS (
    SELECT 1 FROM knn_w_by_c x WHERE x.c = o.c AND (x.d < 0 OR EXISTS (
      SELECT 1 FROM (SELECT * FROM (SELECT q.id AS qid, t.id AS tid,
                                           row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v, t.id) AS rn
                                    FROM knn_w_queries q, knn_w_items t) s WHERE rn <= 2) w
      WHERE w.qid = x.id))) $$);
DROP TABLE knn_w_one_row, knn_w_by_c;

DROP TABLE knn_w_items, knn_w_queries, knn_w_few, knn_w_no_key, knn_w_nullable, knn_w_deferred,
           knn_w_parent, knn_w_child;

-- Row-level security on the target table: its policy's condition moves
-- into the LATERAL subquery with the table (the target second in FROM, so
-- its index there changes), and still applies; a table the role may not
-- read is still refused.
CREATE TABLE knn_w_rls_queries (id int PRIMARY KEY, v vector(3));
INSERT INTO knn_w_rls_queries
SELECT i, format('[%s,%s,%s]', (i * 3) % 8, (i * 5) % 6, i % 4)::vector(3) FROM generate_series(1, 30) i;
CREATE TABLE knn_w_rls_items (id int PRIMARY KEY, v vector(3), owner text);
INSERT INTO knn_w_rls_items
SELECT i, format('[%s,%s,%s]', i % 7, (i / 7) % 5, i % 3)::vector(3),
       CASE WHEN i % 3 = 0 THEN 'knn_w_reader' ELSE 'someone_else' END
FROM generate_series(1, 300) i;
CREATE TABLE knn_w_hidden (id int PRIMARY KEY, v vector(3));
INSERT INTO knn_w_hidden SELECT id, v FROM knn_w_rls_queries;
ALTER TABLE knn_w_rls_items ENABLE ROW LEVEL SECURITY;
CREATE POLICY knn_w_own ON knn_w_rls_items USING (owner = current_user);
SET client_min_messages = warning;
DROP ROLE IF EXISTS knn_w_reader;
RESET client_min_messages;
CREATE ROLE knn_w_reader;
GRANT SELECT ON knn_w_rls_queries, knn_w_rls_items TO knn_w_reader;
SET ROLE knn_w_reader;
SELECT * FROM pg_temp.window_check($$
  SELECT * FROM (
    SELECT q.id AS query_id, t.id AS target_id, t.owner, t.v <-> q.v AS d,
           row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v, t.id) AS rn
    FROM knn_w_rls_queries q, knn_w_rls_items t) s
  WHERE rn <= 4 $$);
SELECT count(*) AS rows, count(*) FILTER (WHERE owner <> 'knn_w_reader') AS not_own FROM (
  SELECT q.id AS query_id, t.id AS target_id, t.owner,
         row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v, t.id) AS rn
  FROM knn_w_rls_queries q, knn_w_rls_items t) s
WHERE rn <= 4;
SELECT * FROM pg_temp.window_check($$
  SELECT DISTINCT ON (q.id) q.id, t.id AS target_id, t.owner, t.v <-> q.v AS d
  FROM knn_w_rls_queries q JOIN knn_w_rls_items t ON t.id <> q.id
  ORDER BY q.id, t.v <-> q.v, t.id $$);
SELECT * FROM (
  SELECT q.id, t.id, row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v, t.id) AS rn
  FROM knn_w_rls_queries q, knn_w_hidden t) s
WHERE rn <= 2;
RESET ROLE;
DROP TABLE knn_w_rls_queries, knn_w_rls_items, knn_w_hidden;
DROP ROLE knn_w_reader;

-- MERGE keeps its ON condition where a SELECT keeps its WHERE; a source row
-- for which "rn <= 2" is false is NOT MATCHED (inserted here), not dropped:
-- the query is left alone, all 12 rows of every query row are inserted.
CREATE TABLE knn_w_merge_queries (id int PRIMARY KEY, v vector(3));
INSERT INTO knn_w_merge_queries
SELECT i, format('[%s,%s,0]', i % 3, i % 2)::vector(3) FROM generate_series(1, 5) i;
CREATE TABLE knn_w_merge_items (id int PRIMARY KEY, v vector(3));
INSERT INTO knn_w_merge_items
SELECT i, format('[%s,%s,1]', i % 4, i % 3)::vector(3) FROM generate_series(1, 12) i;
CREATE TABLE knn_w_merged (query_id int, target_id int, rn bigint);
MERGE INTO knn_w_merged m
USING (SELECT q.id AS query_id, t.id AS target_id,
              row_number() OVER (PARTITION BY q.id ORDER BY t.v <-> q.v, t.id) AS rn
       FROM knn_w_merge_queries q, knn_w_merge_items t) s
ON s.rn <= 2
WHEN NOT MATCHED THEN INSERT VALUES (s.query_id, s.target_id, s.rn);
SELECT count(*) AS rows, count(DISTINCT query_id) AS queries, max(rn) AS max_rn FROM knn_w_merged;
DROP TABLE knn_w_merge_queries, knn_w_merge_items, knn_w_merged;

