-- knn_shard_receive_queries (a shard's end of a sharded knn_join) reads the
-- send forms of knn_gpu's vector and halfvec itself while their receive
-- functions are knn_gpu's own (knn_vector_known_receive_kind), and through
-- the type's receive function otherwise. Both ways must hold the same rows
-- bit for bit and refuse every hostile block with the same SQLSTATE and
-- message. The other way is forced by giving the types a receive function
-- of the same C code that is not the extension's (ALTER TYPE ... RECEIVE),
-- inside a transaction that puts the extension's back.

-- A row of a block: int32 8, int64 id, int32 n, n bytes of the send form.
CREATE FUNCTION pg_temp.brow(id bigint, form bytea) RETURNS bytea LANGUAGE sql AS
$$ SELECT int4send(8) || int8send(id) || int4send(length(form)) || form $$;
-- A send form by its parts: dim, unused, then elements (float4 or binary16 bits).
CREATE FUNCTION pg_temp.vform(dim integer, unused integer, elements float4[]) RETURNS bytea LANGUAGE sql AS
$$ SELECT int2send(dim::int2) || int2send(unused::int2)
          || coalesce((SELECT string_agg(float4send(e), ''::bytea ORDER BY i)
                       FROM unnest(elements) WITH ORDINALITY u(e, i)), ''::bytea) $$;
CREATE FUNCTION pg_temp.hform(dim integer, unused integer, bits integer[]) RETURNS bytea LANGUAGE sql AS
$$ SELECT int2send(dim::int2) || int2send(unused::int2)
          || coalesce((SELECT string_agg(int2send(b::int2), ''::bytea ORDER BY i)
                       FROM unnest(bits) WITH ORDINALITY u(b, i)), ''::bytea) $$;

-- What receiving a block as set `set` gives: the rows held, or the error.
CREATE FUNCTION pg_temp.outcome(set bigint, t regtype, block bytea) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  RETURN 'rows ' || knn_shard_receive_queries(set, t, block);
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

CREATE TEMP TABLE hostile (n integer, t regtype, what text, block bytea);
INSERT INTO hostile VALUES
  (1, 'vector', 'well formed', pg_temp.brow(1, pg_temp.vform(3, 0, '{1,-0,1e-40}')) || pg_temp.brow(2, pg_temp.vform(3, 0, '{3.4e38,-2,0.1}'))),
  (2, 'vector', 'no bytes', pg_temp.brow(1, ''::bytea)),
  (3, 'vector', 'dim only', pg_temp.brow(1, int2send(1::int2))),
  (4, 'vector', 'dim 0', pg_temp.brow(1, pg_temp.vform(0, 0, '{}'))),
  (5, 'vector', 'dim 16001', pg_temp.brow(1, pg_temp.vform(16001, 0, '{1}'))),
  (6, 'vector', 'dim 65535 (-1)', pg_temp.brow(1, pg_temp.vform(-1, 0, '{1}'))),
  (7, 'vector', 'unused 7', pg_temp.brow(1, pg_temp.vform(1, 7, '{1}'))),
  (8, 'vector', 'unused 65535', pg_temp.brow(1, pg_temp.vform(1, -1, '{1}'))),
  (9, 'vector', 'NaN', pg_temp.brow(1, pg_temp.vform(2, 0, '{1,NaN}'))),
  (10, 'vector', 'infinity', pg_temp.brow(1, pg_temp.vform(2, 0, '{Infinity,1}'))),
  (11, 'vector', '-infinity then NaN', pg_temp.brow(1, pg_temp.vform(2, 0, '{-Infinity,NaN}'))),
  (12, 'vector', 'NaN, then cut short', pg_temp.brow(1, pg_temp.vform(4, 0, '{1,NaN}'))),
  (13, 'vector', 'cut short in an element', pg_temp.brow(1, substr(pg_temp.vform(2, 0, '{1,2}'), 1, 10))),
  (14, 'vector', 'one element short', pg_temp.brow(1, pg_temp.vform(3, 0, '{1,2}'))),
  (15, 'vector', 'a trailing byte', pg_temp.brow(1, pg_temp.vform(2, 0, '{1,2}') || '\x00'::bytea)),
  (16, 'vector', 'an element too many', pg_temp.brow(1, pg_temp.vform(1, 0, '{1,2}'))),
  (17, 'vector', 'rows of two dimensions', pg_temp.brow(1, pg_temp.vform(2, 0, '{1,2}')) || pg_temp.brow(2, pg_temp.vform(3, 0, '{1,2,3}'))),
  (18, 'vector', 'second row NaN', pg_temp.brow(1, pg_temp.vform(2, 0, '{1,2}')) || pg_temp.brow(2, pg_temp.vform(2, 0, '{NaN,2}'))),
  (19, 'vector', 'a row cut short', pg_temp.brow(1, pg_temp.vform(2, 0, '{1,2}')) || int4send(8)),
  (20, 'halfvec', 'well formed', pg_temp.brow(1, pg_temp.hform(3, 0, '{15360,-32768,1}')) || pg_temp.brow(2, pg_temp.hform(3, 0, '{31743,-1025,13}'))),
  (21, 'halfvec', 'no bytes', pg_temp.brow(1, ''::bytea)),
  (22, 'halfvec', 'dim 0', pg_temp.brow(1, pg_temp.hform(0, 0, '{}'))),
  (23, 'halfvec', 'dim 16001', pg_temp.brow(1, pg_temp.hform(16001, 0, '{1}'))),
  (24, 'halfvec', 'unused 1', pg_temp.brow(1, pg_temp.hform(1, 1, '{1}'))),
  (25, 'halfvec', 'NaN', pg_temp.brow(1, pg_temp.hform(2, 0, '{1,32767}'))),
  (26, 'halfvec', 'infinity', pg_temp.brow(1, pg_temp.hform(2, 0, '{31744,1}'))),
  (27, 'halfvec', '-infinity', pg_temp.brow(1, pg_temp.hform(1, 0, '{-1024}'))),
  (28, 'halfvec', 'cut short in an element', pg_temp.brow(1, substr(pg_temp.hform(2, 0, '{1,2}'), 1, 7))),
  (29, 'halfvec', 'a trailing byte', pg_temp.brow(1, pg_temp.hform(1, 0, '{1}') || '\x00'::bytea)),
  (30, 'halfvec', 'rows of two dimensions', pg_temp.brow(1, pg_temp.hform(1, 0, '{1}')) || pg_temp.brow(7, pg_temp.hform(2, 0, '{1,2}'))),
  (31, 'vector', 'dim 0 and unused 5 (dim checked first)', pg_temp.brow(1, pg_temp.vform(0, 5, '{}'))),
  (32, 'vector', 'dim 65535 and unused 1', pg_temp.brow(1, pg_temp.vform(-1, 1, '{1}'))),
  (33, 'halfvec', 'dim 0 and unused 1', pg_temp.brow(1, pg_temp.hform(0, 1, '{}')));

-- Read here (the types' own receive functions).
SET client_min_messages = debug1;
SELECT pg_temp.outcome(100, 'vector', pg_temp.brow(1, pg_temp.vform(1, 0, '{1}'))) AS vector_read_here;
SELECT pg_temp.outcome(101, 'halfvec', pg_temp.brow(1, pg_temp.hform(1, 0, '{1}'))) AS halfvec_read_here;
RESET client_min_messages;
CREATE TEMP TABLE here AS SELECT n, t, what, pg_temp.outcome(n, t, block) AS outcome FROM hostile;
SELECT n, t, what, outcome FROM here ORDER BY n;

-- Rows, as a join gives them back (distances of every metric against fixed
-- targets; the same received rows give the same packed values).
CREATE TEMP TABLE targets AS
  SELECT i AS id, format('[%s,%s,%s]', (i % 7) - 3.25, i * 0.37, 1.0 / i)::vector AS v,
         format('[%s,%s,%s]', (i % 7) - 3.25, i * 0.37, 1.0 / i)::halfvec AS h
  FROM generate_series(1, 40) i;
CREATE TEMP TABLE queries AS
  SELECT i AS id, format('[%s,%s,%s]', sin(i) * 1e3, cos(i) * 1e-3, (-1) ^ i * i)::vector AS v
  FROM generate_series(1, 300) i;
INSERT INTO queries VALUES (301, '[-0,0,1e-42]'), (302, '[3.4e38,-3.4e38,1.17549435e-38]');
CREATE FUNCTION pg_temp.joined(t regtype, metric text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  result text;
BEGIN
  -- in two blocks
  FOR half IN 0 .. 1 LOOP
    PERFORM knn_shard_receive_queries(200, t,
      (SELECT string_agg(pg_temp.brow(id, CASE WHEN t = 'vector'::regtype THEN knn_vector_send(v) ELSE knn_halfvec_send(v::halfvec) END),
                         ''::bytea ORDER BY id)
       FROM queries WHERE (id > 150) = (half = 1) AND (t = 'vector'::regtype OR id < 302)));
  END LOOP;
  SELECT md5(string_agg(p, ''::bytea ORDER BY n)) INTO result
    FROM knn_join_received_packed(200, CASE WHEN t = 'vector'::regtype THEN 'SELECT id, v FROM targets' ELSE 'SELECT id, h FROM targets' END,
                                  5, metric, false, 'auto') WITH ORDINALITY x(p, n);
  RETURN result;
END $$;
CREATE TEMP TABLE here_rows AS
  SELECT t, m, pg_temp.joined(t, m) AS packed
  FROM unnest('{vector,halfvec}'::regtype[]) t, unnest('{l2,ip,cosine,l1}'::text[]) m;
-- the same rows as the join of the table: the rows read here are the rows
SELECT r.t, r.m, r.packed = (SELECT md5(string_agg(p, ''::bytea ORDER BY n))
                               FROM knn_join_packed(CASE WHEN r.t = 'vector'::regtype THEN 'SELECT id, v FROM queries ORDER BY id' ELSE 'SELECT id, v::halfvec FROM queries WHERE id < 302 ORDER BY id' END,
                                                    CASE WHEN r.t = 'vector'::regtype THEN 'SELECT id, v FROM targets' ELSE 'SELECT id, h FROM targets' END,
                                                    5, r.m, false, 'auto') WITH ORDINALITY x(p, n)) AS same_as_table
FROM here_rows r ORDER BY 1, 2;

-- Through the receive function: the same C code, not the extension's function.
CREATE FUNCTION pg_temp.other_vector_recv(internal, oid, integer) RETURNS vector
  AS 'knn_gpu', 'knn_vector_recv' LANGUAGE C IMMUTABLE STRICT;
CREATE FUNCTION pg_temp.other_halfvec_recv(internal, oid, integer) RETURNS halfvec
  AS 'knn_gpu', 'knn_halfvec_recv' LANGUAGE C IMMUTABLE STRICT;
BEGIN;
ALTER TYPE vector SET (RECEIVE = pg_temp.other_vector_recv);
ALTER TYPE halfvec SET (RECEIVE = pg_temp.other_halfvec_recv);
SET LOCAL client_min_messages = debug1;
SELECT pg_temp.outcome(100, 'vector', pg_temp.brow(1, pg_temp.vform(1, 0, '{1}'))) AS vector_through_receive;
SELECT pg_temp.outcome(101, 'halfvec', pg_temp.brow(1, pg_temp.hform(1, 0, '{1}'))) AS halfvec_through_receive;
SET LOCAL client_min_messages = notice;
CREATE TEMP TABLE through AS SELECT n, pg_temp.outcome(n, t, block) AS outcome FROM hostile;
CREATE TEMP TABLE through_rows AS
  SELECT t, m, pg_temp.joined(t, m) AS packed
  FROM unnest('{vector,halfvec}'::regtype[]) t, unnest('{l2,ip,cosine,l1}'::text[]) m;
ALTER TYPE vector SET (RECEIVE = knn_vector_recv);
ALTER TYPE halfvec SET (RECEIVE = knn_halfvec_recv);
COMMIT;
-- every outcome, error or rows, the same both ways
SELECT h.n, h.what, h.outcome, t.outcome AS through_receive
FROM here h JOIN through t USING (n) WHERE h.outcome IS DISTINCT FROM t.outcome ORDER BY n;
SELECT count(*) AS hostile_blocks, count(*) FILTER (WHERE outcome LIKE 'rows%') AS accepted FROM through;
SELECT h.t, h.m, h.packed = t.packed AS same_rows FROM here_rows h JOIN through_rows t USING (t, m) ORDER BY 1, 2;
-- and the extension's receive functions are back: read here again
SET client_min_messages = debug1;
SELECT pg_temp.outcome(102, 'vector', pg_temp.brow(1, pg_temp.vform(1, 0, '{1}'))) AS vector_read_here_again;
RESET client_min_messages;

-- A received set belongs to the role that received it, as held targets
-- do: another role (after SET ROLE, or the caller of a SECURITY DEFINER
-- function that received them) neither joins it (its distances to vectors
-- of that role's choosing give the rows away) nor adds rows to it. Its
-- knn_shard_receive_queries begins a set of its own beside it.
SET client_min_messages = warning;
DROP ROLE IF EXISTS receive_other_role;
RESET client_min_messages;
CREATE ROLE receive_other_role;
\i sql/error_of.psql
-- the secret row [3,4], id 1
SELECT pg_temp.brow(1, pg_temp.vform(2, 0, '{3,4}')) AS secret_block,
       pg_temp.brow(2, pg_temp.vform(2, 0, '{0,0}')) AS own_block \gset
BEGIN;
SELECT knn_shard_receive_queries(300, 'vector', :'secret_block') AS received;
SET LOCAL ROLE receive_other_role;
SELECT pg_temp.error_of($$SELECT * FROM knn_range_join_received(300, 'SELECT 9::bigint, ''[0,0]''::vector', 1e9, 'l2', false, NULL, true, 'auto')$$) AS range_join_of_another_role;
SELECT pg_temp.error_of($$SELECT * FROM knn_join_received_packed(300, 'SELECT 9::bigint, ''[0,0]''::vector', 1, 'l2', false, 'auto')$$) AS join_of_another_role;
-- its own rows begin a set of their own: one row, not appended to the secret one
SELECT knn_shard_receive_queries(300, 'vector', :'own_block') AS own_rows;
SELECT query_id, target_id, distance
  FROM knn_range_join_received(300, 'SELECT 9::bigint, ''[0,0]''::vector', 1e9, 'l2', false, NULL, true, 'auto');
RESET ROLE;
-- the receiver's set is still its own, untouched (knn_shard_roles: by any call of another role)
SELECT query_id, target_id, distance
  FROM knn_range_join_received(300, 'SELECT 9::bigint, ''[0,0]''::vector', 1e9, 'l2', false, NULL, true, 'auto');
ROLLBACK;
-- a held self-join of the other role takes its own rows only as its queries
CREATE TEMP TABLE other_rows (id bigint, v vector(2));
INSERT INTO other_rows VALUES (5, '[0,0]');
GRANT SELECT ON other_rows TO receive_other_role;
BEGIN;
SELECT knn_shard_receive_queries(301, 'vector', :'secret_block') AS received;
SET LOCAL ROLE receive_other_role;
SELECT targets_read FROM knn_shard_prefetch_self_join(301, 'vector', 'SELECT id, v FROM other_rows', 'l2');
SELECT count(*) AS pairs, count(*) FILTER (WHERE substr(p, o, 8) = int8send(1)) AS pairs_of_the_secret_row
  FROM knn_join_received_held_packed(301, 'SELECT id, v FROM other_rows', 1, 'l2', false, 'auto') p,
       generate_series(1, length(p), 24) o;
ROLLBACK;
DROP TABLE other_rows;
DROP ROLE receive_other_role;
