-- knn_join on small tables whose answers are worked out by hand.
SET extra_float_digits = 0;

CREATE TABLE items (id bigint PRIMARY KEY, v vector(3));
INSERT INTO items VALUES (1, '[1,2,3]'), (2, '[4,5,6]'), (3, '[1,2,4]');

-- The issue's example. Distances: 1-3 = 1, 1-2 = sqrt(27), 2-3 = sqrt(22).
SELECT * FROM knn_join('SELECT id, v FROM items', 'SELECT id, v FROM items', 2);
SELECT query_id, target_id, rank, round(distance::numeric, 6) AS distance
FROM knn_join('SELECT id, v FROM items', 'SELECT id, v FROM items', 2, exclude_self => true);

-- Every metric on one query. q = [1,0], targets a=[0,1], b=[2,0], c=[1,1], d=[-1,0].
CREATE TABLE q2 (id int, v vector(2));
CREATE TABLE t2 (id int, v vector(2));
INSERT INTO q2 VALUES (10, '[1,0]');
INSERT INTO t2 VALUES (1, '[0,1]'), (2, '[2,0]'), (3, '[1,1]'), (4, '[-1,0]');
-- l2: c 1, b 1, a sqrt(2), d 2 (c and b tie at 1: smaller id first)
SELECT target_id, rank, round(distance::numeric, 6) FROM knn_join('SELECT id, v FROM q2', 'SELECT id, v FROM t2', 4, 'l2');
-- cosine: b 0, c 1-1/sqrt(2), a 1, d 2
SELECT target_id, rank, round(distance::numeric, 6) FROM knn_join('SELECT id, v FROM q2', 'SELECT id, v FROM t2', 4, 'cosine');
-- ip (negative inner product): b -2, c -1, a 0, d 1
SELECT target_id, rank, distance FROM knn_join('SELECT id, v FROM q2', 'SELECT id, v FROM t2', 4, 'ip');
-- l1: c 1, b 1, a 2, d 2
SELECT target_id, rank, distance FROM knn_join('SELECT id, v FROM q2', 'SELECT id, v FROM t2', 4, 'l1');
-- The distances are exactly the operators' values.
SELECT bool_and(j.distance = (CASE m WHEN 'l2' THEN q.v <-> t.v WHEN 'cosine' THEN q.v <=> t.v
                                     WHEN 'ip' THEN q.v <#> t.v ELSE q.v <+> t.v END)) AS same_as_operators,
       count(*)
FROM unnest(ARRAY['l2', 'cosine', 'ip', 'l1']) AS m,
     knn_join('SELECT id, v FROM q2', 'SELECT id, v FROM t2', 4, m) j
     JOIN q2 q ON q.id = j.query_id JOIN t2 t ON t.id = j.target_id;

-- Ties are broken by the smaller target id, whatever the order of the rows.
CREATE TABLE ties (id int, v vector(1));
INSERT INTO ties SELECT i, '[5]' FROM generate_series(9, 1, -1) i;
INSERT INTO ties VALUES (100, '[0]');
SELECT query_id, target_id, rank, distance
FROM knn_join('SELECT id, v FROM ties WHERE id = 100', 'SELECT id, v FROM ties', 4);

-- k larger than the target count returns every target.
SELECT count(*), max(rank) FROM knn_join('SELECT id, v FROM items', 'SELECT id, v FROM items', 1000);

-- Rows with a NULL vector take no part; empty sets give no rows.
INSERT INTO items VALUES (4, NULL);
SELECT query_id, target_id, rank FROM knn_join('SELECT id, v FROM items', 'SELECT id, v FROM items', 1);
SELECT count(*) FROM knn_join('SELECT id, v FROM items WHERE false', 'SELECT id, v FROM items', 3);
SELECT count(*) FROM knn_join('SELECT id, v FROM items', 'SELECT id, v FROM items WHERE id = 4', 3);

-- real[] and double precision[] columns, smallint and integer ids.
SELECT query_id, target_id, rank, distance
FROM knn_join('SELECT 1::smallint, ARRAY[0,0]::real[]',
              'SELECT i, ARRAY[i, 0]::float8[] FROM generate_series(1, 5) i', 2);
-- The same answer from vector, real[] and double precision[] inputs.
SELECT count(*) AS differing FROM (
  (SELECT * FROM knn_join('SELECT id, v FROM items', 'SELECT id, v FROM items', 3)
   EXCEPT ALL
   SELECT * FROM knn_join('SELECT id, v::real[] FROM items', 'SELECT id, v::real[]::float8[] FROM items', 3))
) d;

-- The engine that would run, and the last join's statistics.
SELECT knn_gpu_info() ~ '^(gpu|cpu): ' AS describes_engine;
SELECT count(*) FROM knn_join('SELECT id, v FROM items', 'SELECT id, v FROM items', 1);
SELECT s->>'metric' AS metric, (s->>'queries')::int AS queries, (s->>'targets')::int AS targets,
       (s->>'k')::int AS k, s->>'method' IN ('ti', 'brute') AS method_named,
       (s->'seconds'->>'engine_total')::float8 >= 0 AS timed
FROM knn_gpu_last_stats() s;
SET knn_gpu.device = cpu;
-- (threads and BLAS depend on the machine)
SELECT knn_gpu_info() ~ '^cpu: [0-9]+ threads, BLAS: .+ \(knn_gpu.device = cpu\)$' AS describes_cpu;
SELECT count(*) FROM knn_join('SELECT id, v FROM items', 'SELECT id, v FROM items', 2, method => 'ti');
SELECT knn_gpu_last_stats()->>'device' ~ '^cpu' AS ran_on_cpu, knn_gpu_last_stats()->>'method' AS method;
SELECT count(*) FROM knn_join('SELECT id, v FROM items', 'SELECT id, v FROM items', 2, method => 'brute');
SELECT knn_gpu_last_stats()->>'method' AS method;
RESET knn_gpu.device;

-- The same text on both sides, with no volatile function, is read once (one
-- scan of the table) and joined as a self-join; the result is the one two
-- reads give. A volatile text is run once per side.
CREATE TABLE self_rows AS
SELECT i AS id, format('[%s,%s]', (i * 37) % 101, (i * 11) % 17)::vector AS v
FROM generate_series(1, 500) i;
CREATE FUNCTION pg_temp.scans() RETURNS bigint LANGUAGE sql AS
$$ SELECT seq_scan FROM pg_stat_xact_user_tables WHERE relname = 'self_rows' $$;
BEGIN;
SELECT pg_temp.scans() AS before \gset
CREATE TEMP TABLE once AS
SELECT * FROM knn_join('SELECT id, v FROM self_rows', 'SELECT id, v FROM self_rows', 5, exclude_self => true);
SELECT pg_temp.scans() - :before AS scans_for_one_text;
SELECT pg_temp.scans() AS before \gset
CREATE TEMP TABLE twice AS
SELECT * FROM knn_join('SELECT id, v FROM self_rows', 'SELECT id, v FROM  self_rows', 5, exclude_self => true);
SELECT pg_temp.scans() - :before AS scans_for_two_texts;
SELECT pg_temp.scans() AS before \gset
SELECT count(*) FROM knn_join('SELECT id, v FROM self_rows WHERE random() >= 0', 'SELECT id, v FROM self_rows WHERE random() >= 0', 5);
SELECT pg_temp.scans() - :before AS scans_for_a_volatile_text;
COMMIT;
SELECT count(*) AS rows,
       (SELECT count(*) FROM (TABLE once EXCEPT ALL TABLE twice) a) +
       (SELECT count(*) FROM (TABLE twice EXCEPT ALL TABLE once) b) AS differing
FROM once;
DROP TABLE self_rows, once, twice;

-- The row estimate: |Q| x min(k, |T|) from the planner's estimates of the
-- two texts; the default 1000 for a text that does not plan (its error
-- comes when the join runs).
CREATE TABLE est_q AS SELECT i AS id, format('[%s,%s]', i, i)::vector AS v FROM generate_series(1, 20) i;
CREATE TABLE est_t AS SELECT i AS id, format('[%s,%s]', i, i)::vector AS v FROM generate_series(1, 100) i;
ANALYZE est_q, est_t;
CREATE FUNCTION pg_temp.estimated_rows(statement text) RETURNS float8 LANGUAGE plpgsql AS $$
DECLARE
  plan json;
BEGIN
  EXECUTE 'EXPLAIN (FORMAT JSON) ' || statement INTO plan;
  RETURN (plan->0->'Plan'->>'Plan Rows')::float8;
END $$;
SELECT pg_temp.estimated_rows($q$SELECT * FROM knn_join('SELECT id, v FROM est_q', 'SELECT id, v FROM est_t', 5)$q$) AS k5,
       pg_temp.estimated_rows($q$SELECT * FROM knn_join('SELECT id, v FROM est_q', 'SELECT id, v FROM est_t', 500)$q$) AS k500,
       pg_temp.estimated_rows($q$SELECT * FROM knn_join('SELECT id, v FROM est_t', 'SELECT id, v FROM est_t', 3, exclude_self => true)$q$) AS self_k3,
       pg_temp.estimated_rows($q$SELECT * FROM knn_join('SELECT id, v FROM no_such_table', 'SELECT id, v FROM est_t', 5)$q$) AS no_table,
       pg_temp.estimated_rows($q$SELECT * FROM knn_join('DELETE FROM est_q RETURNING id, v', 'SELECT id, v FROM est_t', 5)$q$) AS not_select;
SELECT count(*) AS rows_left FROM est_q;
\i sql/error_of.psql
-- A text that estimates another knn_join: that one gets the default, so a
-- view over itself plans once per level (it planned two texts more at
-- every level, its memory never freed, until the server ran out of it).
CREATE VIEW est_nested AS SELECT id::bigint AS id, v FROM est_q;
CREATE OR REPLACE VIEW est_nested AS
SELECT query_id AS id, '[1,2]'::vector AS v FROM knn_join('SELECT id, v FROM est_nested', 'SELECT id, v FROM est_nested', 1);
SELECT pg_temp.estimated_rows('SELECT * FROM est_nested') AS self_referencing_view;
SELECT pg_temp.error_of('SELECT count(*) FROM est_nested') AS self_referencing_view_runs;
DROP VIEW est_nested;
DROP TABLE est_q, est_t;
