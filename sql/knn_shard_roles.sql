-- What a shard holds in a backend for a coordinator's calls -- a received
-- query set (knn_shard_receive_queries), targets read ahead
-- (knn_shard_prefetch_targets, knn_shard_prefetch_self_join,
-- knn_shard_read_held_blocks) -- is its role's own: another role in the
-- same backend (after SET ROLE, inside a SECURITY DEFINER function) neither
-- reads, joins, adds to, replaces nor drops it, and holds its own beside it.
-- Role A runs each of a coordinator's four protocols on a shard; role B
-- makes one call of every shard function before each of A's steps; A's
-- join must return exactly the rows it returns without B (the same pairs,
-- distances bit for bit), and B's call must answer the same whatever A holds.

SET client_min_messages = warning;
DROP ROLE IF EXISTS shard_role_a;
DROP ROLE IF EXISTS shard_role_b;
RESET client_min_messages;
CREATE ROLE shard_role_a;
CREATE ROLE shard_role_b;
-- A's targets, the queries a coordinator ships A (the other shards' rows), B's rows
CREATE TABLE shard_roles_a_rows (id bigint, v vector(2));
INSERT INTO shard_roles_a_rows SELECT i, format('[%s,%s]', i % 3, i / 3)::vector FROM generate_series(1, 6) i;
CREATE TABLE shard_roles_queries (id bigint, v vector(2));
INSERT INTO shard_roles_queries VALUES (101, '[0,0]'), (102, '[2,1.5]'), (103, '[1,3]'), (104, '[-1,0.5]');
CREATE TABLE shard_roles_b_rows (id bigint, v vector(2));
INSERT INTO shard_roles_b_rows VALUES (201, '[9,9]'), (202, '[8,8]');
GRANT SELECT ON shard_roles_a_rows TO shard_role_a;
GRANT SELECT ON shard_roles_b_rows TO shard_role_b;

-- A block of knn_shard_receive_queries: rows (int32 8, int64 id, int32 n, the send form).
CREATE FUNCTION pg_temp.query_block(ids bigint[]) RETURNS bytea LANGUAGE sql AS
$$ SELECT string_agg(int4send(8) || int8send(id) || int4send(length(knn_vector_send(v))) || knn_vector_send(v), ''::bytea ORDER BY id)
   FROM (SELECT id, v FROM shard_roles_queries WHERE id = ANY (ids)
         UNION ALL SELECT id, v FROM shard_roles_b_rows WHERE id = ANY (ids)) r $$;
-- The blocks: the shipped queries in two, B's rows, and the same queries as
-- another shard's held rows relayed (knn_shard_held_target_blocks' layout)
CREATE TEMP TABLE blocks AS SELECT pg_temp.query_block('{101,102}') AS q1, pg_temp.query_block('{103,104}') AS q2,
  pg_temp.query_block('{201,202}') AS b, NULL::bytea AS h1, NULL::bytea AS h2;
BEGIN;
UPDATE blocks SET h1 = (SELECT knn_shard_read_held_blocks(900, 'vector', 'SELECT id, v FROM shard_roles_queries WHERE id < 103', 'l2', 'pg_catalog 20', 'knn_gpu vector', 2, 2));
UPDATE blocks SET h2 = (SELECT knn_shard_read_held_blocks(901, 'vector', 'SELECT id, v FROM shard_roles_queries WHERE id > 102', 'l2', 'pg_catalog 20', 'knn_gpu vector', 2, 2));
COMMIT;

-- A packed join's pairs (int64 query, int64 target, float8 distance) as
-- text, by query, distance and target, the distance's bits in hex.
CREATE FUNCTION pg_temp.pairs(packed bytea[]) RETURNS text LANGUAGE sql AS
$$ SELECT string_agg(format('%s>%s@%s', q, t, d), ' ' ORDER BY q, d, t)
   FROM unnest(packed) p, generate_series(1, length(p), 24) o,
        LATERAL (SELECT ('x' || encode(substr(p, o, 8), 'hex'))::bit(64)::bigint AS q,
                        ('x' || encode(substr(p, o + 8, 8), 'hex'))::bit(64)::bigint AS t,
                        encode(substr(p, o + 16, 8), 'hex') AS d) u $$;
-- a join's rows the same way
CREATE FUNCTION pg_temp.rows_text(q bigint[], t bigint[], d float8[]) RETURNS text LANGUAGE sql AS
$$ SELECT string_agg(format('%s>%s@%s', u.q, u.t, encode(float8send(u.d), 'hex')), ' ' ORDER BY u.q, encode(float8send(u.d), 'hex'), u.t)
   FROM unnest(q, t, d) u(q, t, d) $$;

-- A coordinator's protocols on a shard, as role A: $1, $2 the query
-- blocks, $3, $4 the relayed blocks; the last step is the join.
CREATE TEMP TABLE protocols (name text, steps text[]);
INSERT INTO protocols VALUES
  ('knn_join, targets read ahead', ARRAY[
     $$SELECT targets_read::text FROM knn_shard_prefetch_targets(500, 'vector', 'SELECT id, v FROM shard_roles_a_rows', 'l2')$$,
     $$SELECT knn_shard_receive_queries(500, 'vector', $1)::text$$,
     $$SELECT knn_shard_receive_queries(500, 'vector', $2)::text$$,
     $$SELECT pg_temp.pairs(array_agg(p)) FROM knn_join_received_packed(500, 'SELECT id, v FROM shard_roles_a_rows', 2, 'l2', false, 'auto') p$$]),
  ('knn_range_join', ARRAY[
     $$SELECT knn_shard_receive_queries(500, 'vector', $1)::text$$,
     $$SELECT knn_shard_receive_queries(500, 'vector', $2)::text$$,
     $$SELECT pg_temp.rows_text(array_agg(query_id), array_agg(target_id), array_agg(distance))
         FROM knn_range_join_received(500, 'SELECT id, v FROM shard_roles_a_rows', 2.5, 'l2', false, NULL, true, 'auto')$$]),
  ('self-join, the other shards'' rows received', ARRAY[
     $$SELECT targets_read::text FROM knn_shard_prefetch_self_join(500, 'vector', 'SELECT id, v FROM shard_roles_a_rows', 'l2')$$,
     $$SELECT count(*)::text FROM knn_shard_held_target_blocks(500)$$,
     $$SELECT knn_shard_receive_queries(500, 'vector', $1)::text$$,
     $$SELECT knn_shard_receive_queries(500, 'vector', $2)::text$$,
     $$SELECT pg_temp.pairs(array_agg(p)) FROM knn_join_received_held_packed(500, 'SELECT id, v FROM shard_roles_a_rows', 2, 'l2', false, 'auto') p$$]),
  ('self-join, the other shards'' rows relayed', ARRAY[
     $$SELECT count(*)::text FROM knn_shard_read_held_blocks(500, 'vector', 'SELECT id, v FROM shard_roles_a_rows', 'l2', 'pg_catalog 20', 'knn_gpu vector', 2, 2)$$,
     $$SELECT knn_shard_receive_held_rows(500, 'vector', $3)::text$$,
     $$SELECT knn_shard_receive_held_rows(500, 'vector', $4)::text$$,
     $$SELECT pg_temp.pairs(array_agg(p)) FROM knn_join_received_held_packed(500, 'SELECT id, v FROM shard_roles_a_rows', 2, 'l2', false, 'auto') p$$]);

-- Every call role B can make, with its own rows ($5: a block of them).
CREATE TEMP TABLE b_calls (name text, call text);
INSERT INTO b_calls VALUES
  ('receive_queries, the same set', $$SELECT knn_shard_receive_queries(500, 'vector', $5)::text$$),
  ('receive_queries, another set', $$SELECT knn_shard_receive_queries(501, 'vector', $5)::text$$),
  ('prefetch_targets, the same set', $$SELECT targets_read::text FROM knn_shard_prefetch_targets(500, 'vector', 'SELECT id, v FROM shard_roles_b_rows', 'l2')$$),
  ('prefetch_targets, another set', $$SELECT targets_read::text FROM knn_shard_prefetch_targets(501, 'vector', 'SELECT id, v FROM shard_roles_b_rows', 'l2')$$),
  ('prefetch_self_join', $$SELECT targets_read::text FROM knn_shard_prefetch_self_join(500, 'vector', 'SELECT id, v FROM shard_roles_b_rows', 'l2')$$),
  ('read_held_blocks', $$SELECT count(*)::text FROM knn_shard_read_held_blocks(500, 'vector', 'SELECT id, v FROM shard_roles_b_rows', 'l2', 'pg_catalog 20', 'knn_gpu vector', 2, 2)$$),
  ('drop_targets', $$SELECT 'dropped' FROM knn_shard_drop_targets(500)$$),
  ('held_targets', $$SELECT knn_shard_held_targets()::text$$),
  ('held_target_blocks', $$SELECT count(*)::text FROM knn_shard_held_target_blocks(500)$$),
  ('receive_held_rows', $$SELECT knn_shard_receive_held_rows(500, 'vector', $3)::text$$),
  ('join_received_packed', $$SELECT count(*)::text FROM knn_join_received_packed(500, 'SELECT id, v FROM shard_roles_b_rows', 2, 'l2', false, 'auto')$$),
  ('range_join_received', $$SELECT count(*)::text FROM knn_range_join_received(500, 'SELECT id, v FROM shard_roles_b_rows', 1e9, 'l2', false, NULL, true, 'auto')$$),
  ('join_received_held_packed', $$SELECT count(*)::text FROM knn_join_received_held_packed(500, 'SELECT id, v FROM shard_roles_b_rows', 2, 'l2', false, 'auto')$$);

-- One statement as a role: its value, or its SQLSTATE and message.
CREATE FUNCTION pg_temp.as_role(role name, statement text, b blocks) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  result text;
BEGIN
  PERFORM set_config('role', role, true);
  EXECUTE statement INTO result USING b.q1, b.q2, b.h1, b.h2, b.b;
  PERFORM set_config('role', 'none', true);
  RETURN coalesce(result, 'NULL');
EXCEPTION WHEN OTHERS THEN
  RETURN 'ERROR ' || SQLSTATE || ': ' || SQLERRM;
END $$;

-- A's protocol, B's call before A's step b_before (none: 0); what A's join
-- (or the step that failed) and B's call returned. All in a subtransaction
-- rolled back after, which drops what either role still holds.
CREATE FUNCTION pg_temp.a_with_b(protocol text, b_before int, b_call text,
                                 OUT a_result text, OUT b_result text) LANGUAGE plpgsql AS $$
DECLARE
  steps text[] := (SELECT steps FROM protocols WHERE name = protocol);
  b blocks := (SELECT blocks FROM blocks);
BEGIN
  BEGIN
    FOR i IN 1 .. array_length(steps, 1) LOOP
      IF i = b_before THEN
        b_result := pg_temp.as_role('shard_role_b', b_call, b);
      END IF;
      a_result := pg_temp.as_role('shard_role_a', steps[i], b);
      IF a_result LIKE 'ERROR %' THEN
        a_result := format('step %s: %s', i, a_result);
        EXIT;
      END IF;
    END LOOP;
    RAISE SQLSTATE 'KNNRB';
  EXCEPTION WHEN SQLSTATE 'KNNRB' THEN
    NULL;
  END;
END $$;

-- Without B, A's joins are those of the same rows through a table.
CREATE TEMP TABLE alone AS
  SELECT name, (pg_temp.a_with_b(name, 0, NULL)).a_result AS a_result FROM protocols;
SELECT name,
       array_length(string_to_array(a_result, ' '), 1) AS pairs,
       a_result = CASE name
         WHEN 'knn_range_join' THEN
           (SELECT pg_temp.rows_text(array_agg(query_id), array_agg(target_id), array_agg(distance))
              FROM knn_range_join('SELECT id, v FROM shard_roles_queries', 'SELECT id, v FROM shard_roles_a_rows', 2.5))
         WHEN 'knn_join, targets read ahead' THEN
           (SELECT pg_temp.rows_text(array_agg(query_id), array_agg(target_id), array_agg(distance))
              FROM knn_join('SELECT id, v FROM shard_roles_queries', 'SELECT id, v FROM shard_roles_a_rows', 2))
         ELSE
           (SELECT pg_temp.rows_text(array_agg(query_id), array_agg(target_id), array_agg(distance))
              FROM knn_join('SELECT id, v FROM shard_roles_queries UNION ALL SELECT id, v FROM shard_roles_a_rows',
                            'SELECT id, v FROM shard_roles_a_rows', 2))
       END AS as_through_a_table
  FROM alone ORDER BY name;

-- B's call before each of A's steps: A's joins are as without B (or else
-- each that is not, by protocol and step), and B's call answers the same
-- before every step of every protocol.
SELECT c.name AS b_call,
       coalesce(string_agg(format('%s, B before step %s: %s', p.name, s,
                                  CASE WHEN r.a_result LIKE 'step %' THEN substring(r.a_result FROM 'ERROR [0-9A-Z]{5}')
                                  ELSE array_length(string_to_array(r.a_result, ' '), 1) || ' other pairs' END), '; '
                             ORDER BY p.name, s) FILTER (WHERE r.a_result IS DISTINCT FROM a.a_result),
                'as without B') AS a_joins,
       string_agg(DISTINCT r.b_result, ' | ') AS b_got
  FROM b_calls c CROSS JOIN protocols p JOIN alone a ON a.name = p.name
       CROSS JOIN LATERAL generate_series(1, array_length(p.steps, 1)) s
       CROSS JOIN LATERAL pg_temp.a_with_b(p.name, s, c.call) r
 GROUP BY c.name ORDER BY c.name;

-- Both roles' sets and targets of the same set number, held side by side,
-- each role's join of its own, interleaved: each exact.
SELECT q1, q2, b FROM blocks \gset
SELECT a_result AS a_alone FROM alone WHERE name = 'knn_join, targets read ahead' \gset
BEGIN;
SET LOCAL ROLE shard_role_a;
SELECT targets_read AS a_targets FROM knn_shard_prefetch_targets(500, 'vector', 'SELECT id, v FROM shard_roles_a_rows', 'l2');
SELECT knn_shard_receive_queries(500, 'vector', :'q1') AS a_rows;
SET LOCAL ROLE shard_role_b;
SELECT targets_read AS b_targets FROM knn_shard_prefetch_targets(500, 'vector', 'SELECT id, v FROM shard_roles_b_rows', 'l2');
SELECT knn_shard_receive_queries(500, 'vector', :'b') AS b_rows;
SELECT knn_shard_held_targets() AS b_held;
SET LOCAL ROLE shard_role_a;
SELECT knn_shard_receive_queries(500, 'vector', :'q2') AS a_rows;
SELECT knn_shard_held_targets() AS a_held;
SELECT pg_temp.pairs(array_agg(p)) = :'a_alone' AS a_join_exact
  FROM knn_join_received_packed(500, 'SELECT id, v FROM shard_roles_a_rows', 2, 'l2', false, 'auto') p;
SELECT knn_shard_held_targets() AS a_held_after_its_join;
SET LOCAL ROLE shard_role_b;
SELECT knn_shard_held_targets() AS b_held_still;
SELECT pg_temp.pairs(array_agg(p)) AS b_join
  FROM knn_join_received_packed(500, 'SELECT id, v FROM shard_roles_b_rows', 1, 'l2', false, 'auto') p;
ROLLBACK;

-- A savepoint rolled back takes every role's rows added in it, and only those.
\i sql/error_of.psql
BEGIN;
SET LOCAL ROLE shard_role_a;
SELECT knn_shard_receive_queries(502, 'vector', :'q1') AS a_rows;
SAVEPOINT s;
SET LOCAL ROLE shard_role_b;
SELECT knn_shard_receive_queries(502, 'vector', :'b') AS b_rows;
ROLLBACK TO SAVEPOINT s;
SET LOCAL ROLE shard_role_b;
SELECT pg_temp.error_of($$SELECT * FROM knn_join_received_packed(502, 'SELECT id, v FROM shard_roles_b_rows', 1, 'l2', false, 'auto')$$) AS b_join;
SET LOCAL ROLE shard_role_a;
SELECT count(*) AS a_packed_values, sum(length(p)) / 24 AS a_pairs
  FROM knn_join_received_packed(502, 'SELECT id, v FROM shard_roles_a_rows', 1, 'l2', false, 'auto') p;
ROLLBACK;

DROP TABLE shard_roles_a_rows, shard_roles_queries, shard_roles_b_rows;
DROP ROLE shard_role_a;
DROP ROLE shard_role_b;
