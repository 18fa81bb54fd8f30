-- knn_join with keys of any type (key => NULL::type): uuid, text, a domain,
-- a named composite type, bigint through the keyed form. Each result is
-- compared with PostgreSQL's own plan of the LATERAL query, ties broken by
-- the key's default btree order, rank included (the order per query).
\i sql/error_of.psql
SET knn_gpu.enable_knn_join = off;
CREATE TYPE keys_pair AS (a integer, b text);
CREATE DOMAIN keys_code AS text CHECK (VALUE <> '');
-- Coarse values: many ties and duplicate points. md5 makes the uuid order
-- unrelated to id order; 'k' || id sorts k10 before k2.
CREATE TABLE keyed (id integer, u uuid, t text, c keys_code, p keys_pair, v vector);
INSERT INTO keyed
SELECT i, md5(i::text)::uuid, 'k' || i, 'c' || (i * 7 % 61), ROW(i % 5, 'p' || i)::keys_pair,
       format('[%s,%s]', i % 4, i % 3)::vector
FROM generate_series(1, 60) i;

-- diff(reference, result): rows of either not in the other (EXCEPT ALL both
-- ways), and both counts.
CREATE FUNCTION pg_temp.diff(reference text, result text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  missing bigint;
  extra bigint;
  n_ref bigint;
  n_res bigint;
BEGIN
  EXECUTE format('SELECT count(*) FROM ((%s) EXCEPT ALL (%s)) x', reference, result) INTO missing;
  EXECUTE format('SELECT count(*) FROM ((%s) EXCEPT ALL (%s)) x', result, reference) INTO extra;
  EXECUTE format('SELECT count(*) FROM (%s) x', reference) INTO n_ref;
  EXECUTE format('SELECT count(*) FROM (%s) x', result) INTO n_res;
  RETURN format('reference %s rows, result %s rows, missing %s, extra %s', n_ref, n_res, missing, extra);
END $$;

-- reference(key, k, exclude): PostgreSQL's plan of the same join.
CREATE FUNCTION pg_temp.reference(key text, k integer, exclude boolean) RETURNS text LANGUAGE sql AS $$
SELECT format('SELECT q.%1$s AS query_id, n.target_id, n.rank::integer, n.distance
  FROM keyed q CROSS JOIN LATERAL (
    SELECT t.%1$s AS target_id, t.v <-> q.v AS distance,
           row_number() OVER (ORDER BY t.v <-> q.v, t.%1$s) AS rank
    FROM keyed t %3$s ORDER BY t.v <-> q.v, t.%1$s LIMIT %2$s) n',
  key, k, CASE WHEN exclude THEN format('WHERE t.%1$s <> q.%1$s', key) ELSE '' END)
$$;

-- uuid, text, a domain over text, a composite type; k = 5 cuts through ties.
SELECT pg_temp.diff(pg_temp.reference('u', 5, false),
  $$SELECT * FROM knn_join('SELECT u, v FROM keyed', 'SELECT u, v FROM keyed', 5, key => NULL::uuid)$$) AS uuid_keys;
SELECT pg_temp.diff(pg_temp.reference('t', 5, false),
  $$SELECT * FROM knn_join('SELECT t, v FROM keyed', 'SELECT t, v FROM keyed', 5, key => NULL::text)$$) AS text_keys;
SELECT pg_temp.diff(pg_temp.reference('c', 7, false),
  $$SELECT * FROM knn_join('SELECT c, v FROM keyed', 'SELECT c, v FROM keyed', 7, key => NULL::keys_code)$$) AS domain_keys;
SELECT pg_temp.diff(pg_temp.reference('p', 4, false),
  $$SELECT * FROM knn_join('SELECT p, v FROM keyed', 'SELECT p, v FROM keyed', 4, key => NULL::keys_pair)$$) AS composite_keys;
-- exclude_self compares keys by equality.
SELECT pg_temp.diff(pg_temp.reference('u', 3, true),
  $$SELECT * FROM knn_join('SELECT u, v FROM keyed', 'SELECT u, v FROM keyed', 3, key => NULL::uuid, exclude_self => true)$$) AS uuid_exclude_self;
SELECT pg_temp.diff(pg_temp.reference('t', 3, true),
  $$SELECT * FROM knn_join('SELECT t, v FROM keyed', 'SELECT t, v FROM keyed', 3, key => NULL::text, exclude_self => true)$$) AS text_exclude_self;
-- bigint ids through the keyed form agree with the integer form.
SELECT pg_temp.diff($$SELECT * FROM knn_join('SELECT id::bigint, v FROM keyed', 'SELECT id::bigint, v FROM keyed', 6)$$,
  $$SELECT * FROM knn_join('SELECT id::bigint, v FROM keyed', 'SELECT id::bigint, v FROM keyed', 6, key => NULL::bigint)$$) AS bigint_keys;
-- Different query and target sets, overlapping keys; a volatile text read twice.
SELECT pg_temp.diff(
  $$SELECT q.t AS query_id, n.target_id, n.rank::integer, n.distance FROM keyed q CROSS JOIN LATERAL (
      SELECT t.t AS target_id, t.v <-> q.v AS distance, row_number() OVER (ORDER BY t.v <-> q.v, t.t) AS rank
      FROM keyed t WHERE t.id > 20 AND t.t <> q.t ORDER BY t.v <-> q.v, t.t LIMIT 4) n WHERE q.id <= 40$$,
  $$SELECT * FROM knn_join('SELECT t, v FROM keyed WHERE id <= 40', 'SELECT t, v FROM keyed WHERE id > 20', 4,
                           key => NULL::text, exclude_self => true)$$) AS text_two_sets;
SELECT pg_temp.diff(pg_temp.reference('u', 2, false),
  $$SELECT * FROM knn_join('SELECT u, v FROM keyed WHERE random() >= 0', 'SELECT u, v FROM keyed WHERE random() >= 0', 2, key => NULL::uuid)$$) AS volatile_text;
-- With group key columns after (key, vector).
SELECT pg_temp.diff(
  $$SELECT q.u AS query_id, n.target_id, n.rank::integer, n.distance FROM keyed q CROSS JOIN LATERAL (
      SELECT t.u AS target_id, t.v <-> q.v AS distance, row_number() OVER (ORDER BY t.v <-> q.v, t.u) AS rank
      FROM keyed t WHERE t.id % 3 = q.id % 3 ORDER BY t.v <-> q.v, t.u LIMIT 4) n$$,
  $$SELECT * FROM knn_join('SELECT u, v, id % 3 FROM keyed', 'SELECT u, v, id % 3 FROM keyed', 4, key => NULL::uuid)$$) AS uuid_grouped;

-- The result columns are of the key's type; the forms without key keep bigint.
SELECT pg_typeof(query_id) AS query_type, pg_typeof(target_id) AS target_type
FROM knn_join('SELECT t, v FROM keyed', 'SELECT t, v FROM keyed', 1, key => NULL::text) LIMIT 1;
SELECT pg_typeof(query_id) AS query_type, pg_typeof(target_id) AS target_type
FROM knn_join('SELECT c, v FROM keyed', 'SELECT c, v FROM keyed', 1, key => NULL::keys_code) LIMIT 1;
SELECT pg_typeof(query_id) AS query_type FROM knn_join('SELECT id, v FROM keyed', 'SELECT id, v FROM keyed', 1) LIMIT 1;
SELECT pg_typeof(query_id) AS query_type FROM knn_join('SELECT id, v FROM keyed', 'SELECT id, v FROM keyed', 1, 'l1') LIMIT 1;

-- A few rows as they come: ties broken by text order (k10 before k2).
SELECT * FROM knn_join('SELECT t, v FROM keyed WHERE id IN (1, 2)', 'SELECT t, v FROM keyed', 4, key => NULL::text)
ORDER BY query_id, rank;

-- Errors: a key twice in one set, a column of another type, a type
-- without btree ordering, an anonymous record, a NULL key, collations.
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT t, v FROM keyed UNION ALL SELECT ''k3'', ''[0,0]''', 'SELECT t, v FROM keyed', 1, key => NULL::text)$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT u, v FROM keyed', 'SELECT u, v FROM keyed UNION ALL SELECT u, v FROM keyed WHERE id = 9', 1, key => NULL::uuid)$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT u, v FROM keyed', 'SELECT u, v FROM keyed', 1, key => NULL::text)$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT u, v FROM keyed', 'SELECT u, v FROM keyed', 1)$q$);
-- A domain key takes columns of that domain only; a base type key takes a domain over it.
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT t, v FROM keyed', 'SELECT t, v FROM keyed', 1, key => NULL::keys_code)$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT c, v FROM keyed', 'SELECT c, v FROM keyed', 1, key => NULL::text)$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT point(id, id), v FROM keyed', 'SELECT point(id, id), v FROM keyed', 1, key => NULL::point)$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT ROW(id, t), v FROM keyed', 'SELECT ROW(id, t), v FROM keyed', 1, key => NULL::record)$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT NULL::text, v FROM keyed', 'SELECT t, v FROM keyed', 1, key => NULL::text)$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT t COLLATE "C", v FROM keyed', 'SELECT t COLLATE "POSIX", v FROM keyed', 1, key => NULL::text)$q$);
-- A bad row's error names it by its key (the context line).
SELECT * FROM knn_join('SELECT t, v FROM keyed UNION ALL SELECT ''zz'', ''[1,2,3]''', 'SELECT t, v FROM keyed', 1, key => NULL::text);
-- One explicit collation on both sides is used for the order.
SELECT pg_temp.diff(pg_temp.reference('t COLLATE "C"', 5, false),
  $$SELECT * FROM knn_join('SELECT t COLLATE "C", v FROM keyed', 'SELECT t COLLATE "C", v FROM keyed', 5, key => NULL::text)$$) AS text_collate_c;
-- Rows without a vector take no part, and neither do their keys.
SELECT count(*) AS rows FROM knn_join('SELECT t, v FROM keyed UNION ALL SELECT ''k3'', NULL', 'SELECT t, v FROM keyed', 1, key => NULL::text);

-- knn_range_join takes keys the same way (key => NULL::type): every pair
-- within the radius, ranked per query by (distance, key in its btree
-- order), against PostgreSQL's plan of the filtered cross join.
CREATE FUNCTION pg_temp.range_reference(key text, radius float8, inclusive boolean,
                                        exclude boolean, k integer) RETURNS text
LANGUAGE sql AS $$
SELECT format('SELECT * FROM (
    SELECT q.%1$s AS query_id, t.%1$s AS target_id,
           (row_number() OVER (PARTITION BY q.%1$s ORDER BY q.v <-> t.v, t.%1$s))::integer AS rank,
           q.v <-> t.v AS distance
    FROM keyed q, keyed t WHERE q.v <-> t.v %3$s %2$s %4$s) s WHERE %5$s',
  key, radius, CASE WHEN inclusive THEN '<=' ELSE '<' END,
  CASE WHEN exclude THEN format('AND t.%1$s <> q.%1$s', key) ELSE '' END,
  CASE WHEN k IS NULL THEN 'true' ELSE format('rank <= %s', k) END)
$$;
SELECT pg_temp.diff(pg_temp.range_reference('u', 1, true, false, NULL),
  $$SELECT * FROM knn_range_join('SELECT u, v FROM keyed', 'SELECT u, v FROM keyed', 1, key => NULL::uuid)$$) AS uuid_range;
SELECT pg_temp.diff(pg_temp.range_reference('t', 1.5, false, true, NULL),
  $$SELECT * FROM knn_range_join('SELECT t, v FROM keyed', 'SELECT t, v FROM keyed', 1.5, key => NULL::text,
                                 inclusive => false, exclude_self => true)$$) AS text_range_exclude_self;
SELECT pg_temp.diff(pg_temp.range_reference('c', 2, true, false, 3),
  $$SELECT * FROM knn_range_join('SELECT c, v FROM keyed', 'SELECT c, v FROM keyed', 2, key => NULL::keys_code,
                                 k => 3)$$) AS domain_range_capped;
SELECT pg_temp.diff(pg_temp.range_reference('p', 1, true, true, 5),
  $$SELECT * FROM knn_range_join('SELECT p, v FROM keyed', 'SELECT p, v FROM keyed', 1, key => NULL::keys_pair,
                                 exclude_self => true, k => 5)$$) AS composite_range;
-- With bind parameters and another metric; the result's types.
SELECT pg_temp.diff(
  $$SELECT q.t AS query_id, t.t AS target_id,
           (row_number() OVER (PARTITION BY q.t ORDER BY q.v <+> t.v, t.t))::integer AS rank,
           q.v <+> t.v AS distance
    FROM keyed q, keyed t WHERE q.id <= 30 AND q.v <+> t.v < 2$$,
  $$SELECT * FROM knn_range_join('SELECT t, v FROM keyed WHERE id <= $1', 'SELECT t, v FROM keyed', 2,
                                 key => NULL::text, metric => 'l1', inclusive => false,
                                 params => ARRAY['30'])$$) AS text_range_params;
SELECT pg_typeof(query_id) AS query_type, pg_typeof(target_id) AS target_type
FROM knn_range_join('SELECT u, v FROM keyed', 'SELECT u, v FROM keyed', 0, key => NULL::uuid) LIMIT 1;
-- A positional call without key is still the first form (bigint ids).
SELECT pg_typeof(query_id) AS query_type, count(*) AS pairs
FROM knn_range_join('SELECT id, v FROM keyed', 'SELECT id, v FROM keyed', 1, 'l1', 'f') GROUP BY 1;
-- Errors as knn_join's: a key twice, a column of another type, an
-- anonymous record, a NULL radius.
SELECT pg_temp.error_of($q$SELECT * FROM knn_range_join('SELECT t, v FROM keyed UNION ALL SELECT ''k3'', ''[0,0]''', 'SELECT t, v FROM keyed', 1, key => NULL::text)$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_range_join('SELECT u, v FROM keyed', 'SELECT u, v FROM keyed', 1, key => NULL::text)$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_range_join('SELECT ROW(id, t), v FROM keyed', 'SELECT ROW(id, t), v FROM keyed', 1, key => NULL::record)$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_range_join('SELECT t, v FROM keyed', 'SELECT t, v FROM keyed', NULL, key => NULL::text)$q$);
DROP TABLE keyed;
DROP DOMAIN keys_code;
DROP TYPE keys_pair;
