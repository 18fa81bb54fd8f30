--
-- The KNN Join node fails where PostgreSQL's plan fails, also when no row
-- comes back: the subquery's sort (or radius filter) computes every
-- distance before an OFFSET or a NULL radius drops the rows, so vectors
-- of different dimensions are the operator's error there too.
--
CREATE TABLE knn_err_items (id int, v vector);
INSERT INTO knn_err_items
	SELECT i, format('[%s,%s]', i % 50, i % 70)::vector
	FROM generate_series(1, 3000) i;
-- One query of three dimensions among two-dimensional ones.
CREATE TABLE knn_err_queries (id int, v vector);
INSERT INTO knn_err_queries SELECT i, format('[%s,%s]', i, i)::vector FROM generate_series(2, 40) i;
INSERT INTO knn_err_queries VALUES (1, '[1,2,3]');
ANALYZE knn_err_items, knn_err_queries;

-- Runs a query with the node and without: whether the node ran it, and
-- each plan's result (a row count, or the error). A prepared statement is
-- prepared (by the statement prepare) under each setting.
CREATE FUNCTION pg_temp.knn_both(query text, prepare text DEFAULT NULL)
RETURNS TABLE (node boolean, result_on text, result_off text)
LANGUAGE plpgsql AS $$
DECLARE
	setting text;
	line text;
	n bigint;
BEGIN
	node := false;
	FOREACH setting IN ARRAY ARRAY['on', 'off'] LOOP
		PERFORM set_config('knn_gpu.enable_knn_join', setting, true);
		IF prepare IS NOT NULL THEN
			EXECUTE prepare;
		END IF;
		IF setting = 'on' THEN
			FOR line IN EXECUTE 'EXPLAIN (COSTS OFF) ' || query LOOP
				node := node OR line LIKE '%Custom Scan (KNN Join)%';
			END LOOP;
		END IF;
		BEGIN
			EXECUTE query;
			GET DIAGNOSTICS n = ROW_COUNT;
			line := n || ' rows';
		EXCEPTION WHEN OTHERS THEN
			line := SQLSTATE || ': ' || SQLERRM;
		END;
		IF prepare IS NOT NULL THEN
			DEALLOCATE ALL;
		END IF;
		IF setting = 'on' THEN
			result_on := line;
		ELSE
			result_off := line;
		END IF;
	END LOOP;
	PERFORM set_config('knn_gpu.enable_knn_join', 'on', true);
	RETURN NEXT;
END
$$;

-- An OFFSET at or past the number of inner rows: no row, but every
-- distance was computed.
SELECT * FROM pg_temp.knn_both($$
	SELECT q.id, n.id FROM knn_err_queries q
	CROSS JOIN LATERAL (SELECT t.id FROM knn_err_items t
	                    ORDER BY t.v <-> q.v LIMIT 2 OFFSET 3000) n $$);
SELECT * FROM pg_temp.knn_both($$
	SELECT q.id, n.id FROM knn_err_queries q
	CROSS JOIN LATERAL (SELECT t.id FROM knn_err_items t
	                    ORDER BY t.v <-> q.v, t.id LIMIT 2 OFFSET 5000) n $$);
SELECT * FROM pg_temp.knn_both($$
	SELECT q.id, n.id FROM knn_err_queries q
	CROSS JOIN LATERAL (SELECT t.id FROM knn_err_items t
	                    ORDER BY t.v <-> q.v OFFSET 3000 ROWS FETCH FIRST 1 ROW WITH TIES) n $$);
SELECT * FROM pg_temp.knn_both($$
	SELECT q.id, n.id FROM knn_err_queries q
	CROSS JOIN LATERAL (SELECT t.id FROM knn_err_items t WHERE t.id <> q.id
	                    ORDER BY t.v <-> q.v LIMIT 2 OFFSET 3000) n $$);
SELECT * FROM pg_temp.knn_both($$
	SELECT q.id, n.id FROM knn_err_queries q
	CROSS JOIN LATERAL (SELECT t.id FROM knn_err_items t WHERE t.v <-> q.v < 1
	                    ORDER BY t.v <-> q.v OFFSET 3000) n $$);
-- ... with groups: the 3-D query's group holds a 2-D row.
SELECT * FROM pg_temp.knn_both($$
	SELECT q.id, n.id FROM knn_err_queries q
	CROSS JOIN LATERAL (SELECT t.id FROM knn_err_items t WHERE t.id = q.id
	                    ORDER BY t.v <-> q.v LIMIT 2 OFFSET 3000) n $$);
-- One row short of the end: a row comes, as before.
SELECT * FROM pg_temp.knn_both($$
	SELECT q.id, n.id FROM knn_err_queries q
	CROSS JOIN LATERAL (SELECT t.id FROM knn_err_items t
	                    ORDER BY t.v <-> q.v LIMIT 2 OFFSET 2999) n $$);
-- Without the 3-D query, no error and no rows; an empty inner relation
-- computes nothing.
SELECT * FROM pg_temp.knn_both($$
	SELECT q.id, n.id FROM knn_err_queries q
	CROSS JOIN LATERAL (SELECT t.id FROM knn_err_items t
	                    ORDER BY t.v <-> q.v LIMIT 2 OFFSET 3000) n
	WHERE q.id > 1 $$);
SELECT * FROM pg_temp.knn_both($$
	SELECT q.id, n.id FROM knn_err_queries q
	CROSS JOIN LATERAL (SELECT t.id FROM knn_err_items t WHERE t.id < 0
	                    ORDER BY t.v <-> q.v LIMIT 2 OFFSET 3000) n $$);

-- A NULL radius (a parameter of a generic plan): the filter computes
-- every distance before the comparison is NULL.
SET plan_cache_mode = force_generic_plan;
SELECT * FROM pg_temp.knn_both('EXECUTE knn_err_radius(NULL)', $$
	PREPARE knn_err_radius(float8) AS
	SELECT q.id, n.id FROM knn_err_queries q
	CROSS JOIN LATERAL (SELECT t.id FROM knn_err_items t WHERE t.v <-> q.v < $1
	                    ORDER BY t.v <-> q.v LIMIT 2) n $$);
SELECT * FROM pg_temp.knn_both('EXECUTE knn_err_radius(1)', $$
	PREPARE knn_err_radius(float8) AS
	SELECT q.id, n.id FROM knn_err_queries q
	CROSS JOIN LATERAL (SELECT t.id FROM knn_err_items t WHERE t.v <-> q.v < $1
	                    ORDER BY t.v <-> q.v LIMIT 2) n $$);
-- ... LEFT JOIN: each outer row once with NULLs (no 3-D query here).
SELECT * FROM pg_temp.knn_both('EXECUTE knn_err_radius(NULL)', $$
	PREPARE knn_err_radius(float8) AS
	SELECT q.id, n.id FROM knn_err_queries q
	LEFT JOIN LATERAL (SELECT t.id FROM knn_err_items t WHERE t.v <-> q.v <= $1
	                   ORDER BY t.v <-> q.v) n ON true
	WHERE q.id > 1 $$);
-- ... a plain join on a radius.
SELECT * FROM pg_temp.knn_both('EXECUTE knn_err_radius(NULL)', $$
	PREPARE knn_err_radius(float8) AS
	SELECT q.id, t.id FROM knn_err_queries q JOIN knn_err_items t ON t.v <-> q.v < $1 $$);
RESET plan_cache_mode;
