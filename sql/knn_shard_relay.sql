-- A sharded self-join whose coordinator relays each shard's held rows to
-- the other shards unchanged: knn_shard_receive_held_rows(set, type, block)
-- takes a block another shard's knn_shard_held_target_blocks() made and
-- puts its rows after the rows this backend holds as the set's targets
-- (knn_shard_prefetch_self_join); knn_join_received_held_packed() then
-- joins all of them as queries against its own rows. On one server here:
-- "the other shard" is a prefetch of another table in the same backend
-- (a new set drops the old one's rows, its blocks kept), and the answer
-- must be the plain knn_join of both tables' rows against this one's.
SET jit = off;
\i sql/error_of.psql

-- This server's rows (inserted out of id order, with ties: rows whose
-- vectors repeat under other ids) and the other shard's.
CREATE TABLE relay_own AS
SELECT i AS id,
       format('[%s,%s,%s,%s]', i % 5, (i * 37 % 11) * 0.25, sin(i)::real, 1.0 / i)::vector AS v,
       format('[%s,%s,%s,%s]', i % 5, (i * 37 % 11) * 0.25, sin(i)::real, 1.0 / i)::halfvec AS h,
       ((i * 7919) % 1048576)::bit(20) AS b
FROM generate_series(300, 1, -1) i;
INSERT INTO relay_own SELECT id + 5000, v, h, b FROM relay_own WHERE id % 50 = 0;
CREATE TABLE relay_other AS
SELECT 1000 + i AS id,
       format('[%s,%s,%s,%s]', i % 7, (i * 13 % 17) * 0.125, cos(i)::real, 2.0 / i)::vector AS v,
       format('[%s,%s,%s,%s]', i % 7, (i * 13 % 17) * 0.125, cos(i)::real, 2.0 / i)::halfvec AS h,
       ((i * 104729) % 1048576)::bit(20) AS b
FROM generate_series(2600, 1, -1) i;

-- Integers of a block, at a byte offset.
CREATE FUNCTION pg_temp.int4_at(b bytea, o integer) RETURNS integer LANGUAGE sql AS
$$ SELECT ('x' || encode(substr(b, o + 1, 4), 'hex'))::bit(32)::integer $$;
CREATE FUNCTION pg_temp.int8_at(b bytea, o integer) RETURNS bigint LANGUAGE sql AS
$$ SELECT ('x' || encode(substr(b, o + 1, 8), 'hex'))::bit(64)::bigint $$;
-- A held block cut into blocks of `per` rows (the same layout: header, ids, elements).
CREATE FUNCTION pg_temp.split(block bytea, per integer) RETURNS TABLE (n integer, part bytea) LANGUAGE sql AS $$
  WITH h AS (SELECT pg_temp.int4_at(block, 8) AS rows,
                    (length(block) - 12) / pg_temp.int4_at(block, 8) - 8 AS row_bytes)
  SELECT k, substr(block, 1, 8) || int4send(least(per, rows - k * per))
            || substr(block, 13 + k * per * 8, least(per, rows - k * per) * 8)
            || substr(block, 13 + rows * 8 + k * per * row_bytes, least(per, rows - k * per) * row_bytes)
  FROM h, generate_series(0, (rows - 1) / per) k $$;
-- The blocks another shard would send of `tab`'s column `col` read as `t`
-- (its held rows, set 2), cut into blocks of `per` rows.
CREATE FUNCTION pg_temp.blocks_of(tab text, col text, t regtype, metric text, per integer)
RETURNS bytea[] LANGUAGE plpgsql AS $$
DECLARE
  blocks bytea[];
BEGIN
  PERFORM knn_shard_prefetch_self_join(2, t, format('SELECT id, %s FROM %s', col, tab), metric);
  SELECT array_agg(s.part ORDER BY x.n, s.n) INTO blocks
  FROM knn_shard_held_target_blocks(2) WITH ORDINALITY x(b, n), pg_temp.split(x.b, per) s;
  RETURN blocks;
END $$;
-- Packed pairs as rows: (query id, target id, rank, distance's float8 send form).
CREATE FUNCTION pg_temp.unpacked(packed bytea[]) RETURNS TABLE (query_id bigint, target_id bigint, rank bigint, distance bytea)
LANGUAGE sql AS $$
  SELECT q, t, row_number() OVER (PARTITION BY q ORDER BY n, i), d
  FROM (SELECT pg_temp.int8_at(p, i * 24) AS q, pg_temp.int8_at(p, i * 24 + 8) AS t,
               substr(p, i * 24 + 17, 8) AS d, n, i
        FROM unnest(packed) WITH ORDINALITY x(p, n), generate_series(0, length(p) / 24 - 1) i) r $$;
-- The relayed self-join: this server's rows of `col` as held targets (set
-- 1), the other shard's blocks received after them, then the join; its
-- pairs next to knn_join of both tables' rows against this one's.
CREATE FUNCTION pg_temp.relayed(col text, t regtype, metric text, exclude boolean, per integer,
                                OUT relayed bigint, OUT pairs bigint, OUT missing bigint, OUT extra bigint)
LANGUAGE plpgsql AS $$
DECLARE
  blocks bytea[] := pg_temp.blocks_of('relay_other', col, t, metric, per);
  own text := format('SELECT id, %s FROM relay_own', col);
  block bytea;
  packed bytea[];
BEGIN
  PERFORM knn_shard_prefetch_self_join(1, t, own, metric);
  FOREACH block IN ARRAY blocks LOOP
    relayed := knn_shard_receive_held_rows(1, t, block);
  END LOOP;
  SELECT array_agg(p ORDER BY n) INTO packed
  FROM knn_join_received_held_packed(1, own, 5, metric, exclude, 'auto') WITH ORDINALITY x(p, n);
  CREATE TEMP TABLE got AS SELECT * FROM pg_temp.unpacked(packed);
  CREATE TEMP TABLE want AS
  SELECT query_id, target_id, rank::bigint, float8send(distance) AS distance
  FROM knn_join(format('SELECT id, %s FROM relay_own UNION ALL SELECT id, %s FROM relay_other', col, col),
                own, 5, metric => metric, exclude_self => exclude);
  SELECT count(*) INTO pairs FROM got;
  SELECT count(*) INTO missing FROM (SELECT * FROM want EXCEPT ALL SELECT * FROM got) d;
  SELECT count(*) INTO extra FROM (SELECT * FROM got EXCEPT ALL SELECT * FROM want) d;
  DROP TABLE got, want;
END $$;

-- The same rows and pairs as one server's join, row for row: every kind,
-- both metrics, with and without exclude_self; blocks of 1000 rows (three),
-- 700 and one block of all 2600 (slices of 1024 rows checked in it).
SELECT t, m, e, per, (pg_temp.relayed(col, t, m, e, per)).*
FROM (VALUES ('v', 'vector'::regtype, 1000), ('h', 'halfvec', 700), ('v', 'vector', 2600)) c(col, t, per),
     unnest('{l2,cosine}'::text[]) m, unnest('{false,true}'::boolean[]) e
ORDER BY t, per, m, e;
SELECT t, m, e, (pg_temp.relayed('b', t, m, e, 900)).*
FROM unnest('{bit,varbit}'::regtype[]) t, unnest('{hamming,jaccard}'::text[]) m, unnest('{false,true}'::boolean[]) e
ORDER BY 1, 2, 3;

-- Rows by both ways into one set (a coordinator that mixed them): the
-- other shard's rows half relayed, half shipped by knn_shard_receive_queries;
-- the targets are still this server's rows only.
CREATE FUNCTION pg_temp.mixed(metric text, exclude boolean,
                              OUT relayed bigint, OUT received bigint, OUT missing bigint, OUT extra bigint)
LANGUAGE plpgsql AS $$
DECLARE
  blocks bytea[] := pg_temp.blocks_of('(SELECT * FROM relay_other WHERE id <= 2300) o', 'v', 'vector', metric, 1000);
  own text := 'SELECT id, v FROM relay_own';
  block bytea;
  packed bytea[];
BEGIN
  PERFORM knn_shard_prefetch_self_join(1, 'vector', own, metric);
  FOREACH block IN ARRAY blocks LOOP
    relayed := knn_shard_receive_held_rows(1, 'vector', block);
  END LOOP;
  received := knn_shard_receive_queries(1, 'vector',
    (SELECT string_agg(int4send(8) || int8send(id) || int4send(length(knn_vector_send(v))) || knn_vector_send(v), ''::bytea)
     FROM relay_other WHERE id > 2300));
  SELECT array_agg(p ORDER BY n) INTO packed
  FROM knn_join_received_held_packed(1, own, 5, metric, exclude, 'auto') WITH ORDINALITY x(p, n);
  CREATE TEMP TABLE got AS SELECT * FROM pg_temp.unpacked(packed);
  CREATE TEMP TABLE want AS
  SELECT query_id, target_id, rank::bigint, float8send(distance) AS distance
  FROM knn_join('SELECT id, v FROM relay_own UNION ALL SELECT id, v FROM relay_other', own, 5,
                metric => metric, exclude_self => exclude);
  SELECT count(*) INTO missing FROM (SELECT * FROM want EXCEPT ALL SELECT * FROM got) d;
  SELECT count(*) INTO extra FROM (SELECT * FROM got EXCEPT ALL SELECT * FROM want) d;
  DROP TABLE got, want;
END $$;
SELECT m, e, (pg_temp.mixed(m, e)).*
FROM unnest('{l2,cosine}'::text[]) m, unnest('{false,true}'::boolean[]) e ORDER BY 1, 2;

-- Hostile blocks: each check, with its SQLSTATE and message; a failed
-- block adds no row (the next good block's count goes on from the last).
CREATE TEMP TABLE good AS
SELECT (pg_temp.blocks_of('relay_other', 'v', 'vector', 'l2', 3))[1] AS g,
       (pg_temp.blocks_of('relay_other', 'h', 'halfvec', 'l2', 3))[1] AS gh,
       (pg_temp.blocks_of('relay_other', 'b', 'bit', 'hamming', 3))[1] AS gb,
       (pg_temp.blocks_of('(SELECT 1 AS id, ''[1,2,3,4,5]''::vector AS v) o', 'v', 'vector', 'l2', 3))[1] AS g5;
SELECT length(g) AS vector_block, length(gh) AS halfvec_block, length(gb) AS bit_block FROM good;
CREATE FUNCTION pg_temp.receive(set bigint, t regtype, block bytea) RETURNS text LANGUAGE sql AS
$$ SELECT pg_temp.error_of(format('SELECT knn_shard_receive_held_rows(%s, %L::regtype, %L::bytea)', set, t, block)) $$;
CREATE FUNCTION pg_temp.receive_count(set bigint, t regtype, block bytea) RETURNS bigint LANGUAGE sql AS
$$ SELECT knn_shard_receive_held_rows(set, t, block) $$;
BEGIN;
SELECT targets_read FROM knn_shard_prefetch_self_join(1, 'vector', 'SELECT id, v FROM relay_own', 'l2');
SELECT what, pg_temp.receive(1, t, block) AS outcome FROM good, LATERAL (VALUES
  (2, 'empty', 'vector'::regtype, ''::bytea),
  (3, 'short header', 'vector', substr(g, 1, 11)),
  (4, 'header only', 'vector', substr(g, 1, 12)),
  (5, 'element float16', 'vector', overlay(g placing int4send(1) from 1 for 4)),
  (6, 'element 7', 'vector', overlay(g placing int4send(7) from 1 for 4)),
  (7, 'dim 5', 'vector', overlay(g placing int4send(5) from 5 for 4)),
  (8, 'dim 0', 'vector', overlay(g placing int4send(0) from 5 for 4)),
  (9, 'rows 0', 'vector', overlay(g placing int4send(0) from 9 for 4)),
  (10, 'rows -1', 'vector', overlay(g placing int4send(-1) from 9 for 4)),
  (11, 'rows 4 of 3', 'vector', overlay(g placing int4send(4) from 9 for 4)),
  (12, 'a byte too many', 'vector', g || '\x00'::bytea),
  (13, 'a byte too few', 'vector', substr(g, 1, length(g) - 1)),
  (14, 'NaN', 'vector', overlay(g placing float4send('NaN') from 12 + 24 + 16 + 5 for 4)),
  (15, 'infinity', 'vector', overlay(g placing float4send('Infinity') from 12 + 24 + 1 for 4)),
  (16, '-infinity in the last row', 'vector', overlay(g placing float4send('-Infinity') from length(g) - 3 for 4)),
  (17, 'as halfvec', 'halfvec', g),
  (18, 'as integer', 'integer', g),
  (19, 'a type that does not exist', 1::oid::regtype, g),
  (20, 'a halfvec block', 'vector', gh),
  (21, 'a bit block', 'vector', gb),
  (22, 'well formed', 'vector', g)
) c(n, what, t, block) ORDER BY n;
SELECT pg_temp.receive(99, 'vector', g) AS no_held_set FROM good;
SELECT pg_temp.receive_count(1, 'vector', g) AS after_the_errors FROM good;
-- another role: the rows were read by this one
SELECT g AS good_block FROM good \gset
CREATE ROLE relay_other_role;
SAVEPOINT r;
SET LOCAL ROLE relay_other_role;
SELECT knn_shard_receive_held_rows(1, 'vector', :'good_block') AS another_role;
ROLLBACK TO SAVEPOINT r;
-- a subtransaction whose block failed keeps the set; one that added rows and aborts takes it
SAVEPOINT s1;
SELECT knn_shard_receive_held_rows(1, 'vector', substr(:'good_block'::bytea, 1, 20));
ROLLBACK TO SAVEPOINT s1;
SELECT knn_shard_receive_held_rows(1, 'vector', :'good_block') AS after_a_failed_subtransaction;
SAVEPOINT s2;
SELECT knn_shard_receive_held_rows(1, 'vector', :'good_block') AS in_a_subtransaction;
ROLLBACK TO SAVEPOINT s2;
SELECT knn_shard_receive_held_rows(1, 'vector', :'good_block') AS after_its_rollback;
ROLLBACK;
BEGIN;
SELECT targets_read FROM knn_shard_prefetch_self_join(1, 'vector', 'SELECT id, v FROM relay_own', 'l2');
SAVEPOINT s3;
SELECT knn_shard_receive_held_rows(1, 'vector', :'good_block') AS released_subtransaction;
RELEASE SAVEPOINT s3;
SAVEPOINT s4;
SELECT 1/0;
ROLLBACK TO SAVEPOINT s4;
SELECT knn_shard_receive_held_rows(1, 'vector', :'good_block') AS kept_by_its_parent;
SELECT knn_shard_held_targets() AS held_own_rows;
ROLLBACK;

-- halfvec's and bit's own checks
BEGIN;
SELECT targets_read FROM knn_shard_prefetch_self_join(1, 'halfvec', 'SELECT id, h FROM relay_own', 'l2');
SELECT what, pg_temp.receive(1, t, block) AS outcome FROM good, LATERAL (VALUES
  (1, 'NaN', 'halfvec'::regtype, overlay(gh placing int2send(32767::int2) from 12 + 24 + 8 + 3 for 2)),
  (2, 'infinity', 'halfvec', overlay(gh placing int2send(31744::int2) from 12 + 24 + 1 for 2)),
  (3, 'a vector block', 'halfvec', g),
  (4, 'as vector', 'vector', gh),
  (5, 'well formed', 'halfvec', gh)
) c(n, what, t, block) ORDER BY n;
ROLLBACK;
BEGIN;
SELECT targets_read FROM knn_shard_prefetch_self_join(1, 'bit', 'SELECT id, b FROM relay_own', 'hamming');
-- bit(20): 3 bytes a row, the last 4 bits of the third byte padding
SELECT what, pg_temp.receive(1, t, block) AS outcome FROM good, LATERAL (VALUES
  (1, 'a padding bit set', 'bit'::regtype, overlay(gb placing set_byte('\x00'::bytea, 0, get_byte(gb, 12 + 24 + 2) | 1) from 12 + 24 + 3 for 1)),
  (2, 'the last bit (not padding) set', 'bit', overlay(gb placing set_byte('\x00'::bytea, 0, get_byte(gb, 12 + 24 + 2) | 16) from 12 + 24 + 3 for 1)),
  (3, 'bits 21', 'bit', overlay(gb placing int4send(21) from 5 for 4)),
  (4, 'as vector', 'vector', gb),
  (5, 'as varbit', 'varbit', gb)
) c(n, what, t, block) ORDER BY n;
ROLLBACK;

-- A set that holds no rows of its own: the first good block fixes the
-- dimension (one that fails fixes nothing), its type's limits before that.
BEGIN;
SELECT targets_read FROM knn_shard_prefetch_self_join(1, 'vector', 'SELECT id, v FROM relay_own WHERE false', 'l2');
SELECT what, pg_temp.receive(1, 'vector', block) AS outcome FROM good, LATERAL (VALUES
  (1, 'dim 0', overlay(g placing int4send(0) from 5 for 4)),
  (2, 'dim 16001', overlay(g placing int4send(16001) from 5 for 4)),
  (3, 'dim 5 with a NaN', overlay(g5 placing float4send('NaN') from 12 + 8 + 1 for 4)),
  (4, 'dim 4', g),
  (5, 'then dim 5', g5),
  (6, 'dim 4 again', g)
) c(n, what, block) ORDER BY n;
SELECT count(*) AS pairs_of_relayed_rows_only FROM knn_join_received_held_packed(1, 'SELECT id, v FROM relay_own WHERE false', 5, 'l2', false, 'auto');
ROLLBACK;

-- knn_shard_held_target_blocks of a set with relayed rows sends its own rows only.
BEGIN;
SELECT targets_read FROM knn_shard_prefetch_self_join(1, 'vector', 'SELECT id, v FROM relay_own', 'l2');
SELECT pg_temp.receive_count(1, 'vector', g) AS relayed FROM good;
SELECT knn_shard_held_targets() AS held,
       (SELECT sum(pg_temp.int4_at(b, 8)) FROM knn_shard_held_target_blocks(1) b) AS rows_sent_back;
ROLLBACK;

-- The GPU service's shared row buffer (the CPU stand-in: no GPU in CI):
-- the held rows are read into it, the relayed rows grow it (768-dimension
-- rows: past its first 2 MB), and the job is that buffer. A buffer that
-- cannot grow moves the rows to the backend's own memory: the same pairs.
CREATE FUNCTION pg_temp.rows_live() RETURNS bigint
  AS 'knn_gpu', 'knn_gpu_service_test_rows_live' LANGUAGE C STRICT;
CREATE FUNCTION pg_temp.rows_jobs() RETURNS bigint
  AS 'knn_gpu', 'knn_gpu_service_test_rows_jobs' LANGUAGE C STRICT;
CREATE FUNCTION pg_temp.rows_fail_growth(boolean) RETURNS void
  AS 'knn_gpu', 'knn_gpu_service_test_rows_fail_growth' LANGUAGE C STRICT;
ALTER TABLE relay_own ADD COLUMN w vector;
ALTER TABLE relay_other ADD COLUMN w vector;
UPDATE relay_own SET w = (SELECT array_agg(((id * 7919 + j * 104729) % 1000)::real / 1000 ORDER BY j) FROM generate_series(1, 768) j)::vector;
UPDATE relay_other SET w = (SELECT array_agg(((id * 7907 + j * 104723) % 1000)::real / 1000 ORDER BY j) FROM generate_series(1, 768) j)::vector
  WHERE id <= 2000;
DELETE FROM relay_other WHERE w IS NULL;
CREATE TEMP TABLE jobs_before AS SELECT pg_temp.rows_jobs() AS jobs;
SET knn_gpu.fault_injection = service_cpu;
SET knn_gpu.device = gpu;
SELECT (pg_temp.relayed('w', 'vector', 'l2', true, 300)).*;
SELECT pg_temp.rows_jobs() > jobs AS the_job_was_the_buffer, pg_temp.rows_live() AS segments_left FROM jobs_before;
SELECT pg_temp.rows_fail_growth(true);
SELECT (pg_temp.relayed('w', 'vector', 'cosine', false, 300)).*;
SELECT pg_temp.rows_fail_growth(false);
SELECT pg_temp.rows_live() AS segments_left;
RESET knn_gpu.fault_injection;
RESET knn_gpu.device;

DROP TABLE relay_own, relay_other;
