-- knn_shard_read_held_blocks(set, query_type, targets, metric, id_type,
-- vector_type, min_dim, max_dim): a shard's read of a sharded self-join's
-- rows that sends them back as it reads them, in knn_shard_held_target_blocks'
-- blocks, and holds them for the set's join; or, where its rows are not the
-- coordinator's declared columns', one 12-byte refusal and nothing held.
-- The calls a coordinator makes, and the hostile ones any user can.
SET jit = off;
\i sql/error_of.psql

CREATE TABLE stream_t AS
SELECT i::bigint AS id, format('[%s,%s,%s]', i % 7, (i * 13) % 11, 1.0 / i)::vector(3) AS v
FROM generate_series(60000, 1, -1) i;
INSERT INTO stream_t VALUES (60001, NULL);
-- A stream's call, as a coordinator makes it (from the target list).
CREATE FUNCTION pg_temp.stream(set bigint, id_type text, vector_type text, lo integer, hi integer,
                               targets text DEFAULT 'SELECT id, v FROM stream_t')
RETURNS SETOF bytea LANGUAGE sql AS $$
  SELECT knn_shard_read_held_blocks(set, 'vector', targets, 'l2', id_type, vector_type, lo, hi)
$$;
CREATE FUNCTION pg_temp.int4_at(b bytea, o integer) RETURNS integer LANGUAGE sql AS
$$ SELECT ('x' || encode(substr(b, o + 1, 4), 'hex'))::bit(32)::integer $$;
-- What a set holds now: its rows sent again by knn_shard_held_target_blocks.
CREATE FUNCTION pg_temp.held_rows(set bigint) RETURNS bigint LANGUAGE sql AS
$$ SELECT coalesce(sum(pg_temp.int4_at(b, 8)), 0) FROM knn_shard_held_target_blocks(set) b $$;

BEGIN;
-- every row with a vector, in blocks of about a megabyte: the same layout as the fetch's
CREATE TEMP TABLE blocks AS
  SELECT n, b FROM pg_temp.stream(1, 'pg_catalog 20', 'knn_gpu vector', 3, 3) WITH ORDINALITY s(b, n);
SELECT count(*) > 1 AS several_blocks,
       bool_and(pg_temp.int4_at(b, 0) = 0 AND pg_temp.int4_at(b, 4) = 3) AS float32_of_3,
       sum(pg_temp.int4_at(b, 8)) AS rows,
       bool_and(length(b) = 12 + pg_temp.int4_at(b, 8) * (8 + 12)) AS lengths
FROM blocks;
-- held for the join: the same rows, in the same blocks
SELECT pg_temp.held_rows(1) AS held,
       (SELECT string_agg(b, ''::bytea ORDER BY n) FROM blocks)
     = (SELECT string_agg(b, ''::bytea) FROM knn_shard_held_target_blocks(1) b) AS same_blocks;
ROLLBACK;

BEGIN;
-- rows other than the declared columns': one refusal, nothing held
SELECT encode(b, 'hex') AS refusal FROM pg_temp.stream(2, 'pg_catalog 23', 'knn_gpu vector', 3, 3) b;
SELECT pg_temp.error_of('SELECT pg_temp.held_rows(2)') AS nothing_held;
SELECT encode(b, 'hex') AS refusal FROM pg_temp.stream(2, 'pg_catalog 20', NULL, 3, 3) b;
SELECT encode(b, 'hex') AS refusal FROM pg_temp.stream(2, 'pg_catalog 20', 'knn_gpu vector', 4, 4) b;
SELECT pg_temp.error_of('SELECT pg_temp.held_rows(2)') AS nothing_held;
ROLLBACK;

-- a query that ends before the stream's last value: nothing held after it
BEGIN;
SELECT length(b) > 12 AS a_block FROM pg_temp.stream(3, 'pg_catalog 20', 'knn_gpu vector', 3, 3) b LIMIT 1;
SELECT length(knn_shard_read_held_blocks(3, 'vector', 'SELECT id, v FROM stream_t', 'l2',
                                         'pg_catalog 20', 'knn_gpu vector', 3, 3)) > 12 AS a_block LIMIT 1;
SELECT pg_temp.error_of('SELECT pg_temp.held_rows(3)') AS nothing_held;
SELECT count(*) AS prefetched_contexts FROM pg_backend_memory_contexts WHERE name = 'knn_gpu prefetched targets';
ROLLBACK;

-- the held rows dropped, replaced or rolled back between two calls: an ERROR, not freed memory read
BEGIN;
DECLARE c CURSOR FOR SELECT length(knn_shard_read_held_blocks(4, 'vector', 'SELECT id, v FROM stream_t', 'l2',
                                                              'pg_catalog 20', 'knn_gpu vector', 3, 3));
FETCH 1 FROM c;
SELECT knn_shard_drop_targets(4);
FETCH ALL FROM c;
ROLLBACK;
BEGIN;
DECLARE c CURSOR FOR SELECT length(knn_shard_read_held_blocks(4, 'vector', 'SELECT id, v FROM stream_t', 'l2',
                                                              'pg_catalog 20', 'knn_gpu vector', 3, 3));
FETCH 1 FROM c;
SELECT count(*) FROM knn_shard_prefetch_self_join(4, 'vector', 'SELECT id, v FROM stream_t WHERE id < 5', 'l2');
FETCH ALL FROM c;
ROLLBACK;
BEGIN;
DECLARE c CURSOR WITH HOLD FOR SELECT 1;
CLOSE c;
DECLARE c CURSOR FOR SELECT length(knn_shard_read_held_blocks(4, 'vector', 'SELECT id, v FROM stream_t', 'l2',
                                                              'pg_catalog 20', 'knn_gpu vector', 3, 3));
SAVEPOINT a;
FETCH 1 FROM c;
ROLLBACK TO a;
FETCH ALL FROM c;
ROLLBACK;
-- two streams in one query: the second's read drops the first's rows
SELECT pg_temp.error_of($q$
  SELECT count(*) FROM (SELECT knn_shard_read_held_blocks(5, 'vector', 'SELECT id, v FROM stream_t', 'l2', 'pg_catalog 20', 'knn_gpu vector', 3, 3),
                               knn_shard_read_held_blocks(6, 'vector', 'SELECT id, v FROM stream_t', 'l2', 'pg_catalog 20', 'knn_gpu vector', 3, 3)) s
$q$) AS two_streams;

-- a targets text whose functions would drop or replace the rows being read into: an ERROR
CREATE FUNCTION pg_temp.drops(set bigint) RETURNS boolean LANGUAGE sql AS
$$ SELECT knn_shard_drop_targets(set) IS NULL $$;
BEGIN;
SELECT count(*) FROM knn_shard_prefetch_self_join(7, 'vector', 'SELECT id, v FROM stream_t WHERE id < 10', 'l2');
SELECT pg_temp.error_of($q$SELECT count(*) FROM knn_shard_prefetch_self_join(7, 'vector',
  'SELECT id, v FROM stream_t WHERE pg_temp.drops(7) IS NOT NULL', 'l2')$q$) AS prefetch_dropping;
SELECT pg_temp.error_of($q$SELECT count(*) FROM pg_temp.stream(7, 'pg_catalog 20', 'knn_gpu vector', 3, 3,
  'SELECT id, v FROM stream_t WHERE pg_temp.drops(7) IS NOT NULL')$q$) AS stream_dropping;
SELECT pg_temp.error_of($q$SELECT count(*) FROM pg_temp.stream(7, 'pg_catalog 20', 'knn_gpu vector', 3, 3,
  'SELECT id, v FROM stream_t WHERE (SELECT count(*) FROM knn_shard_prefetch_targets(8, ''vector'', ''SELECT 1::bigint, NULL::vector'', ''l2'')) >= 0')$q$) AS stream_reading_again;
ROLLBACK;

-- hostile arguments
SELECT pg_temp.error_of($q$SELECT knn_shard_read_held_blocks(9, 'int4'::regtype, 'SELECT id, v FROM stream_t', 'l2', 'pg_catalog 20', 'knn_gpu vector', 3, 3)$q$) AS query_type;
-- a query_type OID no type has: an unknown object (42704), not an internal error (XX000)
SELECT f, pg_temp.error_of(format('SELECT * FROM %s(9, %s::oid::regtype, %L, %s)', f, oid,
                                  'SELECT id, v FROM stream_t', a)) AS unknown_query_type
FROM (VALUES ('knn_shard_prefetch_targets', '''l2''', 0),
             ('knn_shard_prefetch_self_join', '''l2''', 999999),
             ('knn_shard_read_held_blocks', '''l2'', ''pg_catalog 20'', ''knn_gpu vector'', 3, 3', 4294967295)) x(f, a, oid)
ORDER BY f;
SELECT pg_temp.error_of($q$SELECT knn_shard_read_held_blocks(9, 'vector', 'SELECT id FROM stream_t', 'l2', 'pg_catalog 20', 'knn_gpu vector', 3, 3)$q$) AS one_column;
SELECT pg_temp.error_of($q$SELECT knn_shard_read_held_blocks(9, 'vector', 'DELETE FROM stream_t', 'l2', 'pg_catalog 20', 'knn_gpu vector', 3, 3)$q$) AS not_select;
SELECT pg_temp.error_of($q$SELECT knn_shard_read_held_blocks(9, 'vector', 'SELECT id, v FROM stream_t', 'l2', 'pg_catalog 20', 'knn_gpu vector', NULL, 3)$q$) AS null_dim;
SELECT pg_temp.error_of($q$SELECT knn_shard_read_held_blocks(9, 'vector', 'SELECT NULL::bigint, v FROM stream_t', 'l2', 'pg_catalog 20', 'knn_gpu vector', 3, 3)$q$) AS null_id;

-- a stream read to its end while its query goes on (another call of the
-- query takes the memory the stream's state had): nothing of the stream
-- runs on it when the query ends, or when a LATERAL subquery rescans it
SELECT count(*) AS values_after_a_whole_stream FROM (
  SELECT length(b)::numeric FROM (SELECT knn_shard_read_held_blocks(10, 'vector', 'SELECT id, v FROM stream_t WHERE id < 10', 'l2',
                                                                    'pg_catalog 20', 'knn_gpu vector', 3, 3) b) s
  UNION ALL SELECT generate_series(-1.5, 3, 1)) u;
SELECT g, count(b) AS blocks, sum(pg_temp.int4_at(b, 8)) AS rows
FROM generate_series(1, 3) g,
     LATERAL (SELECT knn_shard_read_held_blocks(10 + g, 'vector', 'SELECT id, v FROM stream_t WHERE id < 10 * ' || g, 'l2',
                                                'pg_catalog 20', 'knn_gpu vector', 3, 3) b, generate_series(1.5, g) x) s
GROUP BY g ORDER BY g;

-- the read's own cursor closed by name between two calls: an ERROR, not a crash
BEGIN;
DECLARE c CURSOR FOR SELECT length(knn_shard_read_held_blocks(14, 'vector', 'SELECT id, v FROM stream_t', 'l2',
                                                              'pg_catalog 20', 'knn_gpu vector', 3, 3)) > 12;
FETCH 1 FROM c;
DO $$DECLARE n text; BEGIN SELECT name INTO n FROM pg_cursors WHERE name LIKE '<unnamed portal%'; EXECUTE format('CLOSE %I', n); END$$;
SELECT pg_temp.error_of('FETCH ALL FROM c') AS its_cursor_closed;
ROLLBACK;

DROP TABLE stream_t;
