-- Bad input gets a clear error with a proper SQLSTATE; the session stays usable.
\i sql/error_of.psql
CREATE TABLE e (id bigint, v vector);
INSERT INTO e VALUES (1, '[1,2]'), (2, '[3,4]');

-- k < 1
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT id, v FROM e', 'SELECT id, v FROM e', 0)$q$);
-- unknown metric, unknown method
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT id, v FROM e', 'SELECT id, v FROM e', 1, 'hamming')$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT id, v FROM e', 'SELECT id, v FROM e', 1, method => 'fast')$q$);
-- NULL id
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT NULL::int, v FROM e', 'SELECT id, v FROM e', 1)$q$);
-- dimension mismatch between rows (names the id) and between the sets
INSERT INTO e VALUES (3, '[1,2,3]');
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT id, v FROM e', 'SELECT id, v FROM e', 1)$q$);
DELETE FROM e WHERE id = 3;
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT id, v FROM e', 'SELECT 7, ''[1,2,3]''::vector', 1)$q$);
-- NaN and Infinity in arrays
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT 1, ARRAY[1, ''NaN'']::real[]', 'SELECT id, v FROM e', 1)$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT id, v FROM e', 'SELECT 5, ARRAY[''Infinity'', 1]::float8[]', 1)$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT id, v FROM e', 'SELECT 5, ARRAY[1e300, 1]::float8[]', 1)$q$);
-- NULL elements, two-dimensional and empty arrays
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT 1, ARRAY[1, NULL]::real[]', 'SELECT id, v FROM e', 1)$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT 1, ARRAY[[1, 2]]::real[]', 'SELECT id, v FROM e', 1)$q$);
-- the target side names its id as well
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT id, v FROM e', 'SELECT 7, ARRAY[[1, 2], [3, 4]]::real[]', 1)$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT id, v FROM e', 'SELECT 7, ARRAY[NULL, 2]::real[]', 1)$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT 1, ARRAY[]::real[]', 'SELECT id, v FROM e', 1)$q$);
-- wrong query shape
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT id, v, 1 FROM e', 'SELECT id, v FROM e', 1)$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT v, id FROM e', 'SELECT id, v FROM e', 1)$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT id::numeric, v FROM e', 'SELECT id, v FROM e', 1)$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT id, v::text FROM e', 'SELECT id, v FROM e', 1)$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('INSERT INTO e VALUES (9, ''[0,0]'') RETURNING id, v', 'SELECT id, v FROM e', 1)$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT id, v FROM no_such_table', 'SELECT id, v FROM e', 1)$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELEKT 1', 'SELECT id, v FROM e', 1)$q$);

-- Nothing was inserted by the rejected INSERT, and the session still works.
SELECT count(*) FROM e;
SELECT query_id, target_id, rank FROM knn_join('SELECT id, v FROM e', 'SELECT id, v FROM e', 1);
-- A NULL argument is an error, not an empty result (knn_security tests each).
SELECT pg_temp.error_of($q$SELECT count(*) FROM knn_join(NULL, 'SELECT id, v FROM e', 1)$q$);
