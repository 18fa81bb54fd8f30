--
-- A query vector that is an expression of the outer row: a cast
-- (q.v::vector(3)), a sum, a function, a field of a jsonb payload, a CASE.
-- The node computes it from each outer row, once, and only for the outer
-- rows PostgreSQL's plan computes it for: those that reach the subquery
-- (past the outer side's filters) and meet an inner row its WHERE keeps
-- (of their group, with another key; not under LIMIT 0 or for an empty
-- relation). Each shape runs as Custom Scan (KNN Join) and returns, or
-- fails with, what PostgreSQL's own plan returns or fails with.
--
SET extra_float_digits = 0;

-- Items: 3-d points (ties; every 97th vector NULL), groups g 0 to 4, keys
-- k 0 to 2.
CREATE TABLE knn_expr_items (id int, v vector(3), h halfvec(3), g int, k int);
INSERT INTO knn_expr_items
SELECT i, CASE WHEN i % 97 = 0 THEN NULL
               ELSE format('[%s,%s,%s]', (i * 7) % 23, (i * 3) % 19, (i * 5) % 17)::vector(3) END,
       NULL, i % 5, i % 3
FROM generate_series(1, 2000) i;
UPDATE knn_expr_items SET h = v::halfvec(3);
-- Queries: qn 13, 26, 39 and 52 are not ok: their v has 2 dimensions (so
-- q.v::vector(3) fails for them), their group is 5 (no item's) and their
-- key 0 (qn 26: NULL). Every 11th v is NULL, every 7th payload has no
-- "v", every 17th other group is NULL. b is a vector's stored form
-- ([qn,1,1]), qn 45's damaged (3 dimensions, 2 elements).
CREATE TABLE knn_expr_queries (qn int, id int, v vector, w vector, s text, payload jsonb,
                               b bytea, ok boolean, g int, k int);
INSERT INTO knn_expr_queries (qn, id, ok)
SELECT i, i * 30, i % 13 <> 0 FROM generate_series(1, 60) i;
UPDATE knn_expr_queries SET
	v = CASE WHEN qn % 11 = 0 THEN NULL WHEN NOT ok THEN '[1,2]'
	         ELSE format('[%s,%s,%s]', qn % 7, (qn * 3) % 11, (qn * 5) % 13)::vector END,
	w = format('[%s,%s,%s]', (qn * 2) % 9, qn % 5, (qn * 7) % 10)::vector,
	b = CASE WHEN qn = 45 THEN '\x030000000000803f0000803f'::bytea
	         ELSE '\x03000000'::bytea || (SELECT string_agg(substr(float4send(qn::real), i, 1), ''::bytea
	                                                        ORDER BY i DESC)
	                                       FROM generate_series(1, 4) i)
	              || '\x0000803f0000803f'::bytea END,
	g = CASE WHEN NOT ok THEN 5 WHEN qn % 17 = 0 THEN NULL ELSE qn % 5 END,
	k = CASE WHEN qn = 26 THEN NULL WHEN NOT ok THEN 0 ELSE 1 END;
UPDATE knn_expr_queries SET s = v::text,
	payload = CASE WHEN qn % 7 = 0 THEN '{}' ELSE jsonb_build_object('v', v::text) END;
-- (emptied after ANALYZE, so that the planner expects rows and picks the node;
-- no autovacuum, whose VACUUM and ANALYZE would tell the planner it is empty)
CREATE TABLE knn_expr_empty (id int, v vector(3)) WITH (autovacuum_enabled = false);
INSERT INTO knn_expr_empty SELECT id, v FROM knn_expr_items;
ANALYZE knn_expr_items, knn_expr_queries, knn_expr_empty;
DELETE FROM knn_expr_empty;

\i sql/knn_scan_helpers.psql
\i sql/error_of.psql

-- The statement's error (or 'no error') with the node on, whether the node
-- ran it, and PostgreSQL's plan's error ('same' when it is the same).
CREATE FUNCTION pg_temp.knn_errors(query text)
RETURNS TABLE (node_on boolean, error_on text, error_off text) LANGUAGE plpgsql AS $$
DECLARE
	saved text := current_setting('knn_gpu.enable_knn_join');
BEGIN
	PERFORM set_config('knn_gpu.enable_knn_join', 'on', true);
	node_on := pg_temp.knn_uses_join(query);
	error_on := pg_temp.error_of(query);
	PERFORM set_config('knn_gpu.enable_knn_join', 'off', true);
	error_off := pg_temp.error_of(query);
	IF error_off = error_on THEN
		error_off := 'same';
	END IF;
	PERFORM set_config('knn_gpu.enable_knn_join', saved, true);
	RETURN NEXT;
END $$;

-- Functions of the outer row: one with default and named arguments, one
-- that fails from qn 30 on, and a volatile one.
CREATE FUNCTION pg_temp.scaled(v vector, by_how_much real DEFAULT 2, plus real DEFAULT 0)
RETURNS vector LANGUAGE plpgsql STABLE AS
$$ BEGIN RETURN (SELECT array_agg(x * by_how_much + plus) FROM unnest(v::real[]) x)::vector; END $$;
CREATE FUNCTION pg_temp.fails_from_30(v vector, qn int) RETURNS vector LANGUAGE plpgsql IMMUTABLE AS
$$ BEGIN IF qn >= 30 THEN RAISE EXCEPTION 'computed for query %', qn; END IF; RETURN v; END $$;
CREATE FUNCTION pg_temp.shaken(v vector) RETURNS vector LANGUAGE plpgsql VOLATILE AS
$$ BEGIN RETURN v; END $$;

--
-- 1. EXPLAIN shows the node and the expression it computes.
--
EXPLAIN (COSTS OFF)
SELECT q.qn, n.id, n.dist
FROM knn_expr_queries q
CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v::vector(3) AS dist FROM knn_expr_items t
                    ORDER BY t.v <-> q.v::vector(3), t.id LIMIT 3) n
WHERE q.ok;
EXPLAIN (COSTS OFF, VERBOSE)
SELECT q.qn, n.id, n.dist
FROM knn_expr_queries q
CROSS JOIN LATERAL (SELECT t.id, (q.payload->>'v')::vector(3) <=> t.v AS dist FROM knn_expr_items t
                    WHERE t.id <> q.id
                    ORDER BY (q.payload->>'v')::vector(3) <=> t.v, t.id LIMIT 3) n
WHERE q.ok;
-- (named and default arguments as PostgreSQL's planning expands them)
EXPLAIN (COSTS OFF)
SELECT q.qn, n.id
FROM knn_expr_queries q
CROSS JOIN LATERAL (SELECT t.id FROM knn_expr_items t
                    ORDER BY t.v <-> pg_temp.scaled(plus => 1, v => q.w), t.id LIMIT 3) n;

--
-- 2. Shapes: the node's rows are PostgreSQL's.
--
-- a cast to the column's dimension
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_expr_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v::vector(3) AS dist FROM knn_expr_items t
	                    ORDER BY t.v <-> q.v::vector(3), t.id LIMIT 3) n
	WHERE q.ok $$);
-- a sum of two columns, cosine
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_expr_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <=> (q.v + q.w) AS dist FROM knn_expr_items t
	                    ORDER BY t.v <=> (q.v + q.w), t.id LIMIT 3) n
	WHERE q.ok $$);
-- a function, the operands swapped, inner product
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_expr_queries q
	CROSS JOIN LATERAL (SELECT t.id, l2_normalize(q.w) <#> t.v AS dist FROM knn_expr_items t
	                    ORDER BY l2_normalize(q.w) <#> t.v, t.id LIMIT 3) n $$);
-- a PL/pgSQL function with named and default arguments, L1
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_expr_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <+> pg_temp.scaled(plus => 1, v => q.w) AS dist
	                    FROM knn_expr_items t
	                    ORDER BY t.v <+> pg_temp.scaled(plus => 1, v => q.w), t.id LIMIT 3) n $$);
-- a field of a jsonb payload (NULL where it is missing)
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_expr_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> (q.payload->>'v')::vector(3) AS dist FROM knn_expr_items t
	                    ORDER BY t.v <-> (q.payload->>'v')::vector(3), t.id LIMIT 3) n
	WHERE q.ok $$);
-- text parsed, and a CASE that is NULL for odd qn
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_expr_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.s::vector AS dist FROM knn_expr_items t
	                    ORDER BY t.v <-> q.s::vector, t.id LIMIT 3) n
	WHERE q.ok $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_expr_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> CASE WHEN q.qn % 2 = 0 THEN q.w END AS dist
	                    FROM knn_expr_items t
	                    ORDER BY t.v <-> CASE WHEN q.qn % 2 = 0 THEN q.w END, t.id LIMIT 3) n $$);
-- coalesce of two columns
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_expr_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> coalesce(q.v, q.w) AS dist FROM knn_expr_items t
	                    ORDER BY t.v <-> coalesce(q.v, q.w), t.id LIMIT 3) n
	WHERE q.ok $$);
-- halfvec
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_expr_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.h <-> q.w::halfvec(3) AS dist FROM knn_expr_items t
	                    ORDER BY t.h <-> q.w::halfvec(3), t.id LIMIT 3) n $$);
-- an outer side that is a join: a sum of both sides' columns
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_expr_queries q JOIN knn_expr_queries r ON r.qn = q.qn + 1
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> (q.w + r.w) AS dist FROM knn_expr_items t
	                    ORDER BY t.v <-> (q.w + r.w), t.id LIMIT 3) n $$);
-- LEFT JOIN with an ON clause, OFFSET, WITH TIES
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_expr_queries q
	LEFT JOIN LATERAL (SELECT t.id, t.v <-> CASE WHEN q.qn % 3 = 0 THEN q.w END AS dist
	                   FROM knn_expr_items t
	                   ORDER BY t.v <-> CASE WHEN q.qn % 3 = 0 THEN q.w END, t.id LIMIT 3) n
	ON n.dist < 2 $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_expr_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> (q.w + q.w) AS dist FROM knn_expr_items t
	                    ORDER BY t.v <-> (q.w + q.w), t.id LIMIT 3 OFFSET 2) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_expr_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> (q.w + q.w) AS dist FROM knn_expr_items t
	                    ORDER BY t.v <-> (q.w + q.w) FETCH FIRST 2 ROWS WITH TIES) n $$, false);
-- self-exclusion, and groups
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_expr_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> (q.v + q.w) AS dist FROM knn_expr_items t
	                    WHERE t.id <> q.id ORDER BY t.v <-> (q.v + q.w), t.id LIMIT 3) n
	WHERE q.ok $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_expr_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> (q.w + q.w) AS dist FROM knn_expr_items t
	                    WHERE t.g = q.g AND t.id <> q.id
	                    ORDER BY t.v <-> (q.w + q.w), t.id LIMIT 3) n $$);
-- a radius (the radius comes after the cheaper conditions in PostgreSQL's
-- scan too), with and without LIMIT, with a self-exclusion
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_expr_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> (q.w + q.w) AS dist FROM knn_expr_items t
	                    WHERE t.v <-> (q.w + q.w) < 4 ORDER BY t.v <-> (q.w + q.w), t.id) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_expr_queries q
	LEFT JOIN LATERAL (SELECT t.id, t.v <-> q.v::vector(3) AS dist FROM knn_expr_items t
	                   WHERE t.id <> q.id AND t.id > 10 AND t.v <-> q.v::vector(3) <= 5
	                   ORDER BY t.v <-> q.v::vector(3), t.id LIMIT 4) n ON true
	WHERE q.ok $$);
-- as the inner side of a nested loop: rescanned with another outer filter
SELECT * FROM pg_temp.knn_check($$
	SELECT s.m * 100 + x.qn AS qid, x.nid, x.dist
	FROM generate_series(0, 2) s(m)
	CROSS JOIN LATERAL (SELECT q.qn, n.id AS nid, n.dist FROM knn_expr_queries q
	                    CROSS JOIN LATERAL (SELECT t.id, t.v <-> (q.w + q.w) AS dist
	                                        FROM knn_expr_items t
	                                        ORDER BY t.v <-> (q.w + q.w), t.id LIMIT 2) n
	                    WHERE q.qn > s.m * 20 OFFSET 0) x $$);
-- a parameter in the expression (a generic plan)
PREPARE knn_expr_p(vector) AS
SELECT q.qn AS qid, n.id AS nid, n.dist
FROM knn_expr_queries q
CROSS JOIN LATERAL (SELECT t.id, t.v <-> (q.w + $1) AS dist FROM knn_expr_items t
                    ORDER BY t.v <-> (q.w + $1), t.id LIMIT 3) n;
SET plan_cache_mode = force_generic_plan;
EXPLAIN (COSTS OFF) EXECUTE knn_expr_p('[1,0,-1]');
CREATE TEMP TABLE knn_expr_param_on AS EXECUTE knn_expr_p('[1,0,-1]');
DEALLOCATE knn_expr_p;
SET knn_gpu.enable_knn_join = off;
PREPARE knn_expr_p(vector) AS
SELECT q.qn AS qid, n.id AS nid, n.dist
FROM knn_expr_queries q
CROSS JOIN LATERAL (SELECT t.id, t.v <-> (q.w + $1) AS dist FROM knn_expr_items t
                    ORDER BY t.v <-> (q.w + $1), t.id LIMIT 3) n;
SELECT pg_temp.knn_uses_join($$EXECUTE knn_expr_p('[1,0,-1]')$$) AS node_off;
CREATE TEMP TABLE knn_expr_param_off AS EXECUTE knn_expr_p('[1,0,-1]');
RESET knn_gpu.enable_knn_join;
RESET plan_cache_mode;
DEALLOCATE knn_expr_p;
SELECT (SELECT count(*) FROM knn_expr_param_on) AS rows_on,
       (SELECT count(*) FROM knn_expr_param_off) AS rows_off,
       (SELECT count(*) FROM ((TABLE knn_expr_param_on EXCEPT ALL TABLE knn_expr_param_off)
                              UNION ALL
                              (TABLE knn_expr_param_off EXCEPT ALL TABLE knn_expr_param_on)) d) AS differing;

--
-- 3. Errors: the expression's own, where PostgreSQL's plan raises them,
-- and none for the outer rows it never computes the expression for.
--
-- the dimension of a cast (qn 13), a function's error (qn 30); a damaged
-- value (qn 45) is refused before any element is read, with the SQLSTATE of
-- PostgreSQL's operator and the message naming the row (as a damaged
-- column's is)
SELECT * FROM pg_temp.knn_errors($$
	SELECT q.qn, n.id FROM knn_expr_queries q
	CROSS JOIN LATERAL (SELECT t.id FROM knn_expr_items t
	                    ORDER BY t.v <-> q.v::vector(3), t.id LIMIT 3) n $$);
SELECT * FROM pg_temp.knn_errors($$
	SELECT q.qn, n.id FROM knn_expr_queries q
	CROSS JOIN LATERAL (SELECT t.id FROM knn_expr_items t
	                    ORDER BY t.v <-> pg_temp.fails_from_30(q.w, q.qn), t.id LIMIT 3) n $$);
CREATE CAST (bytea AS vector) WITHOUT FUNCTION;
SELECT * FROM pg_temp.knn_errors($$
	SELECT q.qn, n.id FROM knn_expr_queries q
	CROSS JOIN LATERAL (SELECT t.id FROM knn_expr_items t
	                    ORDER BY t.v <-> q.b::vector, t.id LIMIT 3) n $$);
DROP CAST (bytea AS vector);
-- none where the outer side's filter removes those rows (also the filter
-- of a join with another relation)
SELECT * FROM pg_temp.knn_errors($$
	SELECT q.qn, n.id FROM knn_expr_queries q
	CROSS JOIN LATERAL (SELECT t.id FROM knn_expr_items t
	                    ORDER BY t.v <-> q.v::vector(3), t.id LIMIT 3) n
	WHERE q.ok $$);
SELECT * FROM pg_temp.knn_errors($$
	SELECT q.qn, n.id FROM knn_expr_queries q
	CROSS JOIN LATERAL (SELECT t.id FROM knn_expr_items t
	                    ORDER BY t.v <-> pg_temp.fails_from_30(q.w, q.qn), t.id LIMIT 3) n
	WHERE q.qn < 30 $$);
SELECT * FROM pg_temp.knn_errors($$
	SELECT q.qn, n.id FROM knn_expr_queries q
	JOIN (SELECT generate_series(1, 29) AS qn) r ON r.qn = q.qn
	CROSS JOIN LATERAL (SELECT t.id FROM knn_expr_items t
	                    ORDER BY t.v <-> pg_temp.fails_from_30(q.w, q.qn), t.id LIMIT 3) n $$);
-- none where the subquery keeps no row for them: their group has no items,
-- every item has their key (or theirs is NULL), LIMIT 0, no items
SELECT * FROM pg_temp.knn_errors($$
	SELECT q.qn, n.id FROM knn_expr_queries q
	CROSS JOIN LATERAL (SELECT t.id FROM knn_expr_items t WHERE t.g = q.g
	                    ORDER BY t.v <-> q.v::vector(3), t.id LIMIT 3) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_expr_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v::vector(3) AS dist FROM knn_expr_items t
	                    WHERE t.g = q.g ORDER BY t.v <-> q.v::vector(3), t.id LIMIT 3) n $$);
SELECT * FROM pg_temp.knn_errors($$
	SELECT q.qn, n.id FROM knn_expr_queries q
	CROSS JOIN LATERAL (SELECT t.id FROM knn_expr_items t WHERE t.k = 0 AND t.k <> q.k
	                    ORDER BY t.v <-> q.v::vector(3), t.id LIMIT 3) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_expr_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v::vector(3) AS dist FROM knn_expr_items t
	                    WHERE t.k = 0 AND t.k <> q.k
	                    ORDER BY t.v <-> q.v::vector(3), t.id LIMIT 3) n $$);
SELECT * FROM pg_temp.knn_errors($$
	SELECT q.qn, n.id FROM knn_expr_queries q
	CROSS JOIN LATERAL (SELECT t.id FROM knn_expr_items t
	                    ORDER BY t.v <-> q.v::vector(3), t.id LIMIT 0) n $$);
SELECT * FROM pg_temp.knn_errors($$
	SELECT q.qn, n.id FROM knn_expr_queries q
	CROSS JOIN LATERAL (SELECT t.id FROM knn_expr_empty t
	                    ORDER BY t.v <-> q.v::vector(3), t.id LIMIT 3) n $$);
-- ... but an OFFSET past every row still computes it, as PostgreSQL's sort does
SELECT * FROM pg_temp.knn_errors($$
	SELECT q.qn, n.id FROM knn_expr_queries q
	CROSS JOIN LATERAL (SELECT t.id FROM knn_expr_items t
	                    ORDER BY t.v <-> q.v::vector(3), t.id LIMIT 3 OFFSET 5000) n $$);

--
-- 4. What keeps PostgreSQL's plan: a volatile function, a sub-select or a
-- set-returning function in the query vector, and with a radius a
-- condition PostgreSQL may evaluate after it (not cheaper).
--
SELECT pg_temp.knn_uses_join($$
	SELECT q.qn, n.id FROM knn_expr_queries q
	CROSS JOIN LATERAL (SELECT t.id FROM knn_expr_items t
	                    ORDER BY t.v <-> pg_temp.shaken(q.w) LIMIT 3) n $$) AS volatile;
SELECT pg_temp.knn_uses_join($$
	SELECT q.qn, n.id FROM knn_expr_queries q
	CROSS JOIN LATERAL (SELECT t.id FROM knn_expr_items t
	                    ORDER BY t.v <-> (SELECT q.w) LIMIT 3) n $$) AS sub_select;
SELECT pg_temp.knn_uses_join($$
	SELECT q.qn, n.id FROM knn_expr_queries q
	CROSS JOIN LATERAL (SELECT t.id FROM knn_expr_items t
	                    ORDER BY t.v <-> unnest(ARRAY[q.w]) LIMIT 3) n $$) AS set_returning;
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_expr_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v::vector(3) AS dist FROM knn_expr_items t
	                    WHERE t.v <-> q.v::vector(3) < 5 AND pg_temp.fails_from_30(t.v, 0) IS NOT NULL
	                    ORDER BY t.v <-> q.v::vector(3), t.id) n
	WHERE q.ok $$);

--
-- 5. Other expressions of the outer row: each the node's, returning or
-- failing as PostgreSQL's plan does.
--
-- a domain with a check (the check fails for qn 13's 2 dimensions)
CREATE DOMAIN pg_temp.knn_expr_3d AS vector CHECK (vector_dims(VALUE) = 3);
SELECT * FROM pg_temp.knn_errors($$
	SELECT q.qn, n.id FROM knn_expr_queries q
	CROSS JOIN LATERAL (SELECT t.id FROM knn_expr_items t
	                    ORDER BY t.v <-> q.v::pg_temp.knn_expr_3d, t.id LIMIT 3) n $$);
-- the whole row passed to a function, a system column, a field of a
-- composite, a polymorphic function
CREATE FUNCTION pg_temp.doubled(r knn_expr_queries) RETURNS vector LANGUAGE plpgsql IMMUTABLE AS
$$ BEGIN RETURN r.w + r.w; END $$;
CREATE FUNCTION pg_temp.same(x anyelement) RETURNS anyelement LANGUAGE plpgsql IMMUTABLE AS
$$ BEGIN RETURN x; END $$;
CREATE TYPE pg_temp.knn_expr_pair AS (a vector, b vector);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_expr_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> pg_temp.doubled(q) AS dist FROM knn_expr_items t
	                    ORDER BY t.v <-> pg_temp.doubled(q), t.id LIMIT 3) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_expr_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> CASE WHEN q.ctid > '(0,20)' THEN q.w END AS dist
	                    FROM knn_expr_items t
	                    ORDER BY t.v <-> CASE WHEN q.ctid > '(0,20)' THEN q.w END, t.id LIMIT 3) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_expr_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> (ROW(q.w, q.v)::pg_temp.knn_expr_pair).a AS dist
	                    FROM knn_expr_items t
	                    ORDER BY t.v <-> (ROW(q.w, q.v)::pg_temp.knn_expr_pair).a, t.id LIMIT 3) n $$);
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_expr_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> pg_temp.same(q.w) AS dist FROM knn_expr_items t
	                    ORDER BY t.v <-> pg_temp.same(q.w), t.id LIMIT 3) n $$);
-- computed from another KNN Join's rows
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn * 10000 + m.id AS qid, n.id AS nid, n.dist
	FROM knn_expr_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.v FROM knn_expr_items t
	                    ORDER BY t.v <-> q.w, t.id LIMIT 2) m
	CROSS JOIN LATERAL (SELECT t.id, t.v <-> (q.w + m.v) AS dist FROM knn_expr_items t
	                    ORDER BY t.v <-> (q.w + m.v), t.id LIMIT 2) n $$);
-- a halfvec column against a vector query vector: PostgreSQL casts the
-- query vector (an expression); a vector column against a halfvec one:
-- PostgreSQL casts the column (PostgreSQL's plan)
SELECT * FROM pg_temp.knn_check($$
	SELECT q.qn AS qid, n.id AS nid, n.dist
	FROM knn_expr_queries q
	CROSS JOIN LATERAL (SELECT t.id, t.h <-> q.w AS dist FROM knn_expr_items t
	                    ORDER BY t.h <-> q.w, t.id LIMIT 3) n $$);
SELECT pg_temp.knn_uses_join($$
	SELECT q.qn, n.id FROM knn_expr_queries q
	CROSS JOIN LATERAL (SELECT t.id FROM knn_expr_items t
	                    ORDER BY t.v <-> q.w::halfvec(3), t.id LIMIT 3) n $$) AS vector_column_halfvec_query;
-- rescanned in a correlated subquery: only the outer rows each run reaches
SELECT * FROM pg_temp.knn_errors($$
	SELECT s.m, (SELECT sum(n.id) FROM knn_expr_queries q
	             CROSS JOIN LATERAL (SELECT t.id FROM knn_expr_items t
	                                 ORDER BY t.v <-> pg_temp.fails_from_30(q.w, q.qn), t.id LIMIT 2) n
	             WHERE q.qn <= s.m + 20)
	FROM generate_series(0, 9, 3) s(m) $$);
SELECT * FROM pg_temp.knn_errors($$
	SELECT s.m, (SELECT sum(n.id) FROM knn_expr_queries q
	             CROSS JOIN LATERAL (SELECT t.id FROM knn_expr_items t
	                                 ORDER BY t.v <-> pg_temp.fails_from_30(q.w, q.qn), t.id LIMIT 2) n
	             WHERE q.qn <= s.m + 20)
	FROM generate_series(0, 12, 3) s(m) $$);
-- a generic plan (prepared with the node on, then off): a negative LIMIT
-- is the Limit node's error, before any expression; a NULL radius still
-- computes it, as PostgreSQL's scan does
CREATE FUNCTION pg_temp.knn_errors_generic(statement text, arguments text)
RETURNS TABLE (node_on boolean, error_on text, error_off text) LANGUAGE plpgsql AS $$
DECLARE
	saved text := current_setting('knn_gpu.enable_knn_join');
	saved_mode text := current_setting('plan_cache_mode');
BEGIN
	PERFORM set_config('plan_cache_mode', 'force_generic_plan', true);
	PERFORM set_config('knn_gpu.enable_knn_join', 'on', true);
	EXECUTE 'PREPARE knn_expr_generic AS ' || statement;
	node_on := pg_temp.knn_uses_join('EXECUTE knn_expr_generic' || arguments);
	error_on := pg_temp.error_of('EXECUTE knn_expr_generic' || arguments);
	DEALLOCATE knn_expr_generic;
	PERFORM set_config('knn_gpu.enable_knn_join', 'off', true);
	EXECUTE 'PREPARE knn_expr_generic AS ' || statement;
	error_off := pg_temp.error_of('EXECUTE knn_expr_generic' || arguments);
	DEALLOCATE knn_expr_generic;
	IF error_off = error_on THEN
		error_off := 'same';
	END IF;
	PERFORM set_config('knn_gpu.enable_knn_join', saved, true);
	PERFORM set_config('plan_cache_mode', saved_mode, true);
	RETURN NEXT;
END $$;
SELECT * FROM pg_temp.knn_errors_generic($$
	SELECT q.qn, n.id FROM knn_expr_queries q
	CROSS JOIN LATERAL (SELECT t.id FROM knn_expr_items t
	                    ORDER BY t.v <-> pg_temp.fails_from_30(q.w, q.qn), t.id LIMIT $1::int) n $$, '(-1)');
SELECT * FROM pg_temp.knn_errors_generic($$
	SELECT q.qn, n.id FROM knn_expr_queries q
	CROSS JOIN LATERAL (SELECT t.id FROM knn_expr_items t
	                    ORDER BY t.v <-> pg_temp.fails_from_30(q.w, q.qn), t.id LIMIT $1::int) n $$, '(0)');
SELECT * FROM pg_temp.knn_errors_generic($$
	SELECT q.qn, n.id FROM knn_expr_queries q
	CROSS JOIN LATERAL (SELECT t.id FROM knn_expr_items t
	                    WHERE t.v <-> pg_temp.fails_from_30(q.w, q.qn) < $1::float8
	                    ORDER BY t.v <-> pg_temp.fails_from_30(q.w, q.qn), t.id) n $$, '(NULL)');
DROP FUNCTION pg_temp.doubled(knn_expr_queries);

DROP TABLE knn_expr_items, knn_expr_queries, knn_expr_empty;
