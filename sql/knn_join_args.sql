-- knn_join's call forms: the first form's calls (positional, named, with
-- unknown literals) still resolve to it and return bigint ids; params =>
-- and key => pick the new forms. A NULL argument is an ERROR in every form
-- (params => NULL alone means no parameters, key's value is never used).
\i sql/error_of.psql
CREATE TABLE args (id integer, t text, v vector);
INSERT INTO args SELECT i, 'r' || i, format('[%s,%s]', i % 3, i % 4)::vector FROM generate_series(1, 12) i;

-- The type of the ids each call form returns, and its row count.
CREATE FUNCTION pg_temp.id_type(call text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  result text;
BEGIN
  EXECUTE format('SELECT string_agg(DISTINCT pg_typeof(query_id)::text, '','') || '' '' || count(*) FROM %s', call) INTO result;
  RETURN result;
END $$;
SELECT f AS call_form, pg_temp.id_type(f) AS id_type_and_rows FROM (VALUES
  ($$knn_join('SELECT id, v FROM args', 'SELECT id, v FROM args', 2)$$),
  ($$knn_join('SELECT id, v FROM args', 'SELECT id, v FROM args', 2, 'l1')$$),
  ($$knn_join('SELECT id, v FROM args', 'SELECT id, v FROM args', 2, 'l1', 't')$$),
  ($$knn_join('SELECT id, v FROM args', 'SELECT id, v FROM args', 2, 'l1', true, 'brute')$$),
  ($$knn_join('SELECT id, v FROM args', 'SELECT id, v FROM args', '2', 'l1', 'f', 'ti')$$),
  ($$knn_join('SELECT id, v FROM args', 'SELECT id, v FROM args', 2, 'l2'::text, false, 'auto'::text)$$),
  ($$knn_join('SELECT id, v FROM args', 'SELECT id, v FROM args', 2, metric => 'l1', exclude_self => 't')$$),
  ($$knn_join(queries => 'SELECT id, v FROM args', targets => 'SELECT id, v FROM args', k => 2)$$),
  ($$knn_join('SELECT id, v FROM args', 'SELECT id, v FROM args', 2, params => '{}')$$),
  ($$knn_join('SELECT id, v FROM args', 'SELECT id, v FROM args', 2, params => NULL, exclude_self => true)$$),
  ($$knn_join('SELECT id, v FROM args', 'SELECT id, v FROM args', 2, key => NULL::integer)$$),
  ($$knn_join('SELECT t, v FROM args', 'SELECT t, v FROM args', 2, key => NULL::text, metric => 'l1')$$),
  ($$knn_join('SELECT t, v FROM args', 'SELECT t, v FROM args', 2, key => 'any value'::text, exclude_self => true)$$)
) calls(f);

-- NULL arguments: an ERROR naming the argument, in each form.
SELECT a AS argument, pg_temp.error_of(format('SELECT * FROM knn_join(%s)', a)) AS error FROM (VALUES
  ($$NULL, 'SELECT id, v FROM args', 1, params => '{}'$$),
  ($$'SELECT id, v FROM args', NULL, 1, params => '{}'$$),
  ($$'SELECT id, v FROM args', 'SELECT id, v FROM args', NULL, params => '{}'$$),
  ($$'SELECT id, v FROM args', 'SELECT id, v FROM args', 1, params => '{}', metric => NULL$$),
  ($$'SELECT id, v FROM args', 'SELECT id, v FROM args', 1, params => '{}', exclude_self => NULL$$),
  ($$'SELECT id, v FROM args', 'SELECT id, v FROM args', 1, params => '{}', method => NULL$$),
  ($$NULL, 'SELECT t, v FROM args', 1, key => NULL::text$$),
  ($$'SELECT t, v FROM args', NULL, 1, key => NULL::text$$),
  ($$'SELECT t, v FROM args', 'SELECT t, v FROM args', NULL, key => NULL::text$$),
  ($$'SELECT t, v FROM args', 'SELECT t, v FROM args', 1, key => NULL::text, metric => NULL$$),
  ($$'SELECT t, v FROM args', 'SELECT t, v FROM args', 1, key => NULL::text, exclude_self => NULL$$),
  ($$'SELECT t, v FROM args', 'SELECT t, v FROM args', 1, key => NULL::text, method => NULL$$),
  ($$'SELECT t, v FROM args', 'SELECT t, v FROM args', 1, key => NULL$$),
  ($$'SELECT t, v FROM args', 'SELECT t, v FROM args', 0, key => NULL::text$$),
  ($$'SELECT id, v FROM args', 'SELECT id, v FROM args', -1, params => '{}'$$)
) nulls(a);
DROP TABLE args;
