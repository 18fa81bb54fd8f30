-- knn_join's bind parameters (params => ARRAY[...]): each $n of the query
-- texts takes the type its use implies; the values are values, never SQL.
-- Each result is compared with the same join written with the values
-- inline, and with PostgreSQL's own plan of the LATERAL query.
\i sql/error_of.psql
SET knn_gpu.enable_knn_join = off;
CREATE TABLE shelf (id integer, u uuid, cat text, price numeric, added date, v vector);
INSERT INTO shelf
SELECT i, md5(i::text)::uuid, (ARRAY['books', 'music', 'games'])[i % 3 + 1], (i % 17) * 1.25,
       date '2026-01-01' + i, format('[%s,%s,%s]', i % 5, i % 7, i % 3)::vector
FROM generate_series(1, 90) i;
ANALYZE shelf;

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

-- text, numeric and date parameters, $1 in one text and $2, $3 in the
-- other; PostgreSQL's plan as the reference.
SELECT pg_temp.diff(
  $$SELECT q.id::bigint AS query_id, n.id::bigint AS target_id, n.rank::integer, n.distance
    FROM shelf q CROSS JOIN LATERAL (
      SELECT t.id, t.v <-> q.v AS distance, row_number() OVER (ORDER BY t.v <-> q.v, t.id) AS rank
      FROM shelf t WHERE t.price < 10.5 AND t.added >= date '2026-02-01'
      ORDER BY t.v <-> q.v, t.id LIMIT 4) n
    WHERE q.cat = 'books'$$,
  $$SELECT * FROM knn_join('SELECT id, v FROM shelf WHERE cat = $1',
                           'SELECT id, v FROM shelf WHERE price < $2 AND added >= $3', 4,
                           params => ARRAY['books', '10.5', '2026-02-01'])$$) AS typed_params;
-- The same texts with the values inline give the same rows.
SELECT pg_temp.diff(
  $$SELECT * FROM knn_join('SELECT id, v FROM shelf WHERE cat = ''music''', 'SELECT id, v FROM shelf WHERE id % 4 = 1', 3, exclude_self => true, metric => 'l1')$$,
  $$SELECT * FROM knn_join('SELECT id, v FROM shelf WHERE cat = $1', 'SELECT id, v FROM shelf WHERE id % $2 = 1', 3,
                           params => ARRAY['music', '4'], exclude_self => true, metric => 'l1')$$) AS inline_equal;
-- One value used in both texts, and as a LIMIT (bigint).
SELECT count(*) AS rows FROM knn_join('SELECT id, v FROM shelf WHERE cat = $1 ORDER BY id LIMIT $2',
  'SELECT id, v FROM shelf WHERE cat = $1', 2, params => ARRAY['games', '5']);
-- With keys of another type, and from a function: the values come from
-- its argument, as a client's would come as a statement parameter.
CREATE FUNCTION pg_temp.by_category(categories text[])
RETURNS TABLE (query_id uuid, target_id uuid, rank integer) LANGUAGE sql AS $f$
  SELECT query_id, target_id, rank FROM knn_join('SELECT u, v FROM shelf WHERE cat = $1 AND id < 10',
    'SELECT u, v FROM shelf WHERE cat = $1', 2, key => NULL::uuid, params => categories)
$f$;
SELECT pg_temp.diff(
  $$SELECT q.u AS query_id, n.u AS target_id, n.rank::integer
    FROM shelf q CROSS JOIN LATERAL (
      SELECT t.u, row_number() OVER (ORDER BY t.v <-> q.v, t.u) AS rank
      FROM shelf t WHERE t.cat = 'books' ORDER BY t.v <-> q.v, t.u LIMIT 2) n
    WHERE q.cat = 'books' AND q.id < 10$$,
  $$SELECT * FROM pg_temp.by_category(ARRAY['books'])$$) AS keyed_from_function;
-- A value is not SQL: a quote in it is part of the value.
SELECT count(*) AS rows FROM knn_join('SELECT id, v FROM shelf WHERE cat = $1', 'SELECT id, v FROM shelf', 1,
  params => ARRAY['books'' OR ''x'' = ''x']);
-- A NULL element is a NULL value ($1 IS NULL is true); an unused value is fine;
-- a $n whose use implies no type is text.
SELECT count(*) AS rows FROM knn_join('SELECT id, v FROM shelf WHERE $1::text IS NULL AND cat = $2', 'SELECT id, v FROM shelf', 1,
  params => ARRAY[NULL, 'books', 'unused']);
SELECT count(*) AS rows FROM knn_join('SELECT id, v FROM shelf WHERE cat = $2 AND $1 IS NULL', 'SELECT id, v FROM shelf', 1,
  params => ARRAY[NULL, 'books']);
-- params => NULL and an empty array: no parameters.
SELECT count(*) AS rows FROM knn_join('SELECT id, v FROM shelf', 'SELECT id, v FROM shelf', 1, params => NULL);
SELECT count(*) AS rows FROM knn_join('SELECT id, v FROM shelf', 'SELECT id, v FROM shelf', 1, params => '{}');

-- Errors: a $n past the values, no params at all, a value its type rejects,
-- a two-dimensional array.
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT id, v FROM shelf WHERE cat = $1', 'SELECT id, v FROM shelf WHERE id < $3', 1, params => ARRAY['books', '1'])$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT id, v FROM shelf WHERE cat = $1', 'SELECT id, v FROM shelf', 1)$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT id, v FROM shelf WHERE id < $1', 'SELECT id, v FROM shelf', 1, params => ARRAY['ten'])$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT id, v FROM shelf WHERE cat = $1', 'SELECT id, v FROM shelf', 1, params => ARRAY[['a'], ['b']])$q$);
-- element n is $n: an array of other bounds is refused, not renumbered (review r13group)
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT id, v FROM shelf WHERE cat = $1', 'SELECT id, v FROM shelf', 1, params => '[5:5]={a}')$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT id, v FROM shelf WHERE cat = $1; SELECT 1', 'SELECT id, v FROM shelf', 1, params => ARRAY['a'])$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('DELETE FROM shelf WHERE id = $1 RETURNING id, v', 'SELECT id, v FROM shelf', 1, params => ARRAY['1'])$q$);
SELECT count(*) AS still_there FROM shelf;
-- An error in a text points into the text (QUERY), as without params.
SELECT * FROM knn_join('SELECT id, v FROM shelf WHERE cat = $1 AND no_such_column', 'SELECT id, v FROM shelf', 1, params => ARRAY['a']);

CREATE FUNCTION pg_temp.explain_lines(statement text) RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
  line text;
BEGIN
  FOR line IN EXECUTE 'EXPLAIN ' || statement LOOP
    RETURN NEXT line;
  END LOOP;
END $$;
-- The row estimate plans the texts with their parameters unknown: about
-- |Q| x k, not the default 1000.
SELECT (regexp_match(plan, 'rows=(\d+)'))[1]::integer BETWEEN 30 AND 120 AS estimate_near_q_times_k
FROM (SELECT string_agg(l, E'\n') AS plan FROM pg_temp.explain_lines(
  $$SELECT * FROM knn_join('SELECT id, v FROM shelf WHERE cat = $1', 'SELECT id, v FROM shelf', 2, params => ARRAY['books'])$$) l) p;
DROP TABLE shelf;
