-- Bad input gets a clear error with a proper SQLSTATE; the session stays usable.
\set VERBOSITY sqlstate_or_terse
\set VERBOSITY default
CREATE TABLE e (id bigint, v vector);
INSERT INTO e VALUES (1, '[1,2]'), (2, '[3,4]');

\set ON_ERROR_STOP 0
-- k < 1
SELECT * FROM knn_join('SELECT id, v FROM e', 'SELECT id, v FROM e', 0);
-- unknown metric, unknown method
SELECT * FROM knn_join('SELECT id, v FROM e', 'SELECT id, v FROM e', 1, 'hamming');
SELECT * FROM knn_join('SELECT id, v FROM e', 'SELECT id, v FROM e', 1, method => 'fast');
-- NULL id
SELECT * FROM knn_join('SELECT NULL::int, v FROM e', 'SELECT id, v FROM e', 1);
-- dimension mismatch between rows (names the id) and between the sets
INSERT INTO e VALUES (3, '[1,2,3]');
SELECT * FROM knn_join('SELECT id, v FROM e', 'SELECT id, v FROM e', 1);
DELETE FROM e WHERE id = 3;
SELECT * FROM knn_join('SELECT id, v FROM e', 'SELECT 7, ''[1,2,3]''::vector', 1);
-- NaN and Infinity in arrays
SELECT * FROM knn_join('SELECT 1, ARRAY[1, ''NaN'']::real[]', 'SELECT id, v FROM e', 1);
SELECT * FROM knn_join('SELECT id, v FROM e', 'SELECT 5, ARRAY[''Infinity'', 1]::float8[]', 1);
SELECT * FROM knn_join('SELECT id, v FROM e', 'SELECT 5, ARRAY[1e300, 1]::float8[]', 1);
-- NULL elements, two-dimensional and empty arrays
SELECT * FROM knn_join('SELECT 1, ARRAY[1, NULL]::real[]', 'SELECT id, v FROM e', 1);
SELECT * FROM knn_join('SELECT 1, ARRAY[[1, 2]]::real[]', 'SELECT id, v FROM e', 1);
SELECT * FROM knn_join('SELECT 1, ARRAY[]::real[]', 'SELECT id, v FROM e', 1);
-- wrong query shape
SELECT * FROM knn_join('SELECT id, v, 1 FROM e', 'SELECT id, v FROM e', 1);
SELECT * FROM knn_join('SELECT v, id FROM e', 'SELECT id, v FROM e', 1);
SELECT * FROM knn_join('SELECT id::numeric, v FROM e', 'SELECT id, v FROM e', 1);
SELECT * FROM knn_join('SELECT id, v::text FROM e', 'SELECT id, v FROM e', 1);
SELECT * FROM knn_join('INSERT INTO e VALUES (9, ''[0,0]'') RETURNING id, v', 'SELECT id, v FROM e', 1);
SELECT * FROM knn_join('SELECT id, v FROM no_such_table', 'SELECT id, v FROM e', 1);
SELECT * FROM knn_join('SELEKT 1', 'SELECT id, v FROM e', 1);
\set ON_ERROR_STOP 1

-- Nothing was inserted by the rejected INSERT, and the session still works.
SELECT count(*) FROM e;
SELECT query_id, target_id, rank FROM knn_join('SELECT id, v FROM e', 'SELECT id, v FROM e', 1);
-- NULL arguments (STRICT) give no rows.
SELECT count(*) FROM knn_join(NULL, 'SELECT id, v FROM e', 1);
