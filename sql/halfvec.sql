--
-- knn_gpu's halfvec (pgvector's absent here): text and binary forms, typmod,
-- casts, distance operators, errors with their SQLSTATEs; knn_join and the
-- KNN Join node on halfvec columns, checked against the operators' own
-- ORDER BY ... LIMIT results.
--

\i sql/error_of.psql

-- text form: shortest decimal of the binary16 value, rounded to nearest even
SELECT '[1,2.5,-3]'::halfvec, ' [ 0.1 , -0 , 65504 ] '::halfvec, '[1e-8,6e-8,65519]'::halfvec;
SELECT '[1,2,3]'::halfvec(3), vector_dims('[1,2,3,4]'::halfvec);
SELECT pg_temp.error_of($$SELECT '[65520]'::halfvec$$);
SELECT pg_temp.error_of($$SELECT '[1e39]'::halfvec$$);
SELECT pg_temp.error_of($$SELECT '[NaN]'::halfvec$$);
SELECT pg_temp.error_of($$SELECT '[Infinity]'::halfvec$$);
SELECT pg_temp.error_of($$SELECT '[]'::halfvec$$);
SELECT pg_temp.error_of($$SELECT '[1,2'::halfvec$$);
SELECT pg_temp.error_of($$SELECT '1,2]'::halfvec$$);
SELECT pg_temp.error_of($$SELECT '[1,2] x'::halfvec$$);
SELECT pg_temp.error_of($$SELECT '[1,2]'::halfvec(3)$$);
SELECT pg_temp.error_of($$SELECT '[1]'::halfvec(0)$$);
SELECT pg_temp.error_of($$SELECT '[1]'::halfvec(16001)$$);
SELECT pg_temp.error_of(format('SELECT %L::halfvec', '[' || repeat('1,', 16000) || '1]'));
SELECT vector_dims(('[' || repeat('1,', 15999) || '1]')::halfvec);

-- binary form: int16 dim, int16 unused, binary16 values (network order)
SELECT knn_halfvec_send('[1,-2,0.5,65504]'::halfvec);
CREATE TABLE hv_copy (id int, v halfvec);
INSERT INTO hv_copy VALUES (1, '[1,2,3]'), (2, '[-0,6e-8,65504]'), (3, NULL), (4, '[0.1]');
\copy hv_copy TO 'results/halfvec_copy_binary.bin' WITH (FORMAT binary)
CREATE TABLE hv_copy_back (id int, v halfvec);
\copy hv_copy_back FROM 'results/halfvec_copy_binary.bin' WITH (FORMAT binary)
SELECT count(*) AS rows,
	count(*) FILTER (WHERE knn_halfvec_send(s.v) IS DISTINCT FROM knn_halfvec_send(b.v)) AS different
FROM hv_copy s FULL JOIN hv_copy_back b ON s.id = b.id;
-- crafted binary values: an infinity and dim 0 are refused
CREATE TABLE hv_raw (v bytea);
CREATE TABLE hv_crafted (v halfvec);
INSERT INTO hv_raw VALUES ('\x000100007c00');
\copy hv_raw TO 'results/halfvec_copy_raw.bin' WITH (FORMAT binary)
\copy hv_crafted FROM 'results/halfvec_copy_raw.bin' WITH (FORMAT binary)
SELECT count(*) FROM hv_crafted;

-- casts, in pgvector's contexts
SELECT '[1,2,3]'::vector::halfvec, '[1.5,2,3]'::halfvec::vector, '[1,2,3]'::halfvec::real[];
SELECT '{1,2,3}'::int[]::halfvec, '{1.5,2,3}'::real[]::halfvec,
	'{1,2,3}'::float8[]::halfvec, '{1,2,3}'::numeric[]::halfvec(3);
SELECT pg_temp.error_of($$SELECT '[70000]'::vector::halfvec$$);
SELECT pg_temp.error_of($$SELECT '{1,NULL}'::real[]::halfvec$$);
SELECT pg_temp.error_of($$SELECT '{{1},{2}}'::real[]::halfvec$$);
SELECT pg_temp.error_of($$SELECT '{1e6}'::float8[]::halfvec$$);
SELECT pg_temp.error_of($$SELECT '[1,2]'::vector::halfvec(3)$$);
-- vector -> halfvec is implicit, halfvec -> vector is not: h <-> v is a halfvec distance
SELECT pg_typeof('[1,2]'::halfvec <-> '[1,2]'::vector);
CREATE TABLE hv_assign (h halfvec(2), v vector(2));
INSERT INTO hv_assign VALUES ('[1,2]'::vector, '[3,4]'::halfvec);
SELECT * FROM hv_assign;

-- operators: integer elements, exact sums
--   a = [1,2,3], b = [4,5,6]: <-> sqrt(27), <#> -32, <=> 1 - 32/sqrt(14*77), <+> 9
SELECT '[1,2,3]'::halfvec <-> '[4,5,6]'::halfvec AS l2,
	'[1,2,3]'::halfvec <#> '[4,5,6]'::halfvec AS negative_ip,
	'[1,2,3]'::halfvec <=> '[4,5,6]'::halfvec AS cosine,
	'[1,2,3]'::halfvec <+> '[4,5,6]'::halfvec AS l1;
SELECT l2_distance('[1,2,3]'::halfvec, '[4,5,6]'), inner_product('[1,2,3]'::halfvec, '[4,5,6]'),
	negative_inner_product('[1,2,3]'::halfvec, '[4,5,6]'),
	cosine_distance('[1,2,3]'::halfvec, '[4,5,6]'), l1_distance('[1,2,3]'::halfvec, '[4,5,6]');
-- a halfvec distance is the vector distance of the widened values, bit for bit
SELECT count(*) AS pairs,
	count(*) FILTER (WHERE (a.h <-> b.h) IS DISTINCT FROM (a.h::vector <-> b.h::vector)
		OR (a.h <=> b.h) IS DISTINCT FROM (a.h::vector <=> b.h::vector)
		OR (a.h <#> b.h) IS DISTINCT FROM (a.h::vector <#> b.h::vector)
		OR (a.h <+> b.h) IS DISTINCT FROM (a.h::vector <+> b.h::vector)) AS different
FROM (SELECT i, (SELECT array_agg(sin(i * 7 + j) * 3 ORDER BY j) FROM generate_series(1, 19) j)::halfvec AS h
	  FROM generate_series(1, 30) i) a,
	 (SELECT i, (SELECT array_agg(cos(i * 5 + j) * 2 ORDER BY j) FROM generate_series(1, 19) j)::halfvec AS h
	  FROM generate_series(1, 30) i) b;
SELECT pg_temp.error_of($$SELECT '[1,2]'::halfvec <-> '[1,2,3]'::halfvec$$);
SELECT '[0,0]'::halfvec <=> '[1,2]'::halfvec AS zero_cosine;

-- knn_join on halfvec: the operators' ORDER BY ... LIMIT results, exactly
CREATE TABLE hv_items (id int, h halfvec(24));
INSERT INTO hv_items
SELECT i, (SELECT array_agg(round((sin(i * 0.37 + j * 1.3) * 4)::numeric, 1) ORDER BY j)
		   FROM generate_series(1, 24) j)::halfvec
FROM generate_series(1, 300) i;
INSERT INTO hv_items SELECT id + 1000, h FROM hv_items WHERE id % 10 = 0;	-- duplicates: ties
INSERT INTO hv_items VALUES (5000, NULL);
ANALYZE hv_items;
CREATE FUNCTION pg_temp.hv_differing(metric text, op text, k int, excl boolean) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
	n bigint;
BEGIN
	EXECUTE format($q$
		WITH j AS (SELECT query_id, target_id, rank, distance FROM knn_join(
			 'SELECT id, h FROM hv_items WHERE id %% 7 = 0', 'SELECT id, h FROM hv_items', %s, %L, %L)),
		r AS (SELECT q.id, n.id, n.rank::int, n.d FROM hv_items q CROSS JOIN LATERAL (
			 SELECT t.id, t.h %s q.h AS d, row_number() OVER (ORDER BY t.h %s q.h, t.id) AS rank
			 FROM hv_items t WHERE t.h IS NOT NULL AND (NOT %L OR t.id <> q.id)
			 ORDER BY t.h %s q.h, t.id LIMIT %s) n WHERE q.id %% 7 = 0 AND q.h IS NOT NULL)
		SELECT count(*) FROM ((TABLE j EXCEPT ALL TABLE r) UNION ALL (TABLE r EXCEPT ALL TABLE j)) x$q$,
		k, metric, excl, op, op, excl, op, k) INTO n;
	RETURN n;
END $$;
SET knn_gpu.enable_knn_join = off;	-- the reference is the nested loop
SELECT m.metric, pg_temp.hv_differing(m.metric, m.op, 5, false) AS differing,
	pg_temp.hv_differing(m.metric, m.op, 3, true) AS differing_excluding_self
FROM (VALUES ('l2', '<->'), ('cosine', '<=>'), ('ip', '<#>'), ('l1', '<+>')) m(metric, op);
RESET knn_gpu.enable_knn_join;
SELECT count(*) AS rows FROM knn_join('SELECT id, h FROM hv_items WHERE id % 7 = 0', 'SELECT id, h FROM hv_items', 5);
SELECT knn_gpu_last_stats()->>'element' AS element, (knn_gpu_last_stats()->>'dim')::int AS dim;
-- k past the target count: every target
SELECT count(*) FROM knn_join('SELECT id, h FROM hv_items WHERE id = 7', 'SELECT id, h FROM hv_items', 1000);
-- halfvec queries with vector targets (values halfvec cannot hold): the
-- vector is rounded to halfvec, as pgvector's implicit cast vector ->
-- halfvec does in "h <-> v"
WITH j AS (SELECT query_id, target_id, distance FROM knn_join('SELECT id, h FROM hv_items WHERE id < 20',
	 'SELECT id, (SELECT array_agg(x + 0.0123 ORDER BY o) FROM unnest(h::real[]) WITH ORDINALITY u(x, o))::vector
	  FROM hv_items WHERE h IS NOT NULL', 4)),
r AS (SELECT q.id, n.id, n.d FROM hv_items q CROSS JOIN LATERAL (
	 SELECT t.id, q.h <-> (SELECT array_agg(x + 0.0123 ORDER BY o) FROM unnest(t.h::real[]) WITH ORDINALITY u(x, o))::vector AS d
	 FROM hv_items t
	 WHERE t.h IS NOT NULL ORDER BY 2, 1 LIMIT 4) n WHERE q.id < 20)
SELECT (SELECT count(*) FROM j) AS rows,
	(SELECT count(*) FROM ((TABLE j EXCEPT ALL TABLE r) UNION ALL (TABLE r EXCEPT ALL TABLE j)) x) AS differing;
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT id, h FROM hv_items', 'SELECT id, h::real[] FROM hv_items', 1)$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT id, h FROM hv_items', 'SELECT id, h FROM hv_items', 1, 'hamming')$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT 1, ''[1,2]''::halfvec', 'SELECT id, h FROM hv_items', 1)$q$);
-- a vector beyond halfvec's range cannot join a halfvec (the cast fails too)
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT 1, ''[1,2]''::halfvec', 'SELECT 2, ''[70000,1]''::vector', 1)$q$);

-- the KNN Join node: each operator on halfvec columns, the nested loop's rows
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM hv_items q CROSS JOIN LATERAL (SELECT t.id FROM hv_items t ORDER BY t.h <=> q.h LIMIT 3) n;
CREATE FUNCTION pg_temp.hv_node_differing(op text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
	query text := format($q$SELECT q.id AS qid, n.id AS nid, n.d FROM hv_items q
		LEFT JOIN LATERAL (SELECT t.id, t.h %s q.h AS d FROM hv_items t WHERE t.id <> q.id
						   ORDER BY t.h %s q.h, t.id LIMIT 4) n ON true$q$, op, op);
	used boolean := false;
	line text;
	n bigint;
	total bigint;
BEGIN
	FOR line IN EXECUTE 'EXPLAIN (COSTS OFF) ' || query LOOP
		used := used OR line LIKE '%KNN Join%';
	END LOOP;
	EXECUTE 'CREATE TEMP TABLE with_node AS ' || query;
	PERFORM set_config('knn_gpu.enable_knn_join', 'off', true);
	EXECUTE 'CREATE TEMP TABLE without_node AS ' || query;
	PERFORM set_config('knn_gpu.enable_knn_join', 'on', true);
	SELECT count(*) INTO total FROM with_node;
	SELECT count(*) INTO n FROM ((TABLE with_node EXCEPT ALL TABLE without_node)
		UNION ALL (TABLE without_node EXCEPT ALL TABLE with_node)) x;
	DROP TABLE with_node;
	DROP TABLE without_node;
	RETURN format('node used: %s, rows: %s, differing: %s', used, total, n);
END $$;
SELECT op, pg_temp.hv_node_differing(op) FROM (VALUES ('<->'), ('<=>'), ('<#>'), ('<+>')) o(op);
-- a dimension mismatch is the operator's error
CREATE TABLE hv_odd (id int, h halfvec);
INSERT INTO hv_odd VALUES (1, '[1,2]'), (2, '[1,2,3]');
SELECT pg_temp.error_of($q$SELECT q.id, n.id FROM hv_odd q CROSS JOIN LATERAL (SELECT t.id FROM hv_odd t ORDER BY t.h <-> q.h LIMIT 1) n$q$);

-- identity by catalog, not by name: a user's type called halfvec is not read,
-- and a user's <-> on it keeps PostgreSQL's plan
CREATE SCHEMA mallory;
CREATE DOMAIN mallory.halfvec AS bytea;
CREATE FUNCTION mallory.dist(mallory.halfvec, mallory.halfvec) RETURNS float8
	LANGUAGE plpgsql IMMUTABLE AS 'BEGIN RETURN length($1)::float8 - length($2); END';
CREATE OPERATOR mallory.<-> (LEFTARG = mallory.halfvec, RIGHTARG = mallory.halfvec, FUNCTION = mallory.dist);
CREATE TABLE hv_fake (id int, h mallory.halfvec);
INSERT INTO hv_fake VALUES (1, '\x000300003c00'), (2, '\x0001');
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT id, h FROM hv_fake', 'SELECT id, h FROM hv_fake', 1)$q$);
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM hv_fake q CROSS JOIN LATERAL (
	SELECT t.id FROM hv_fake t ORDER BY t.h OPERATOR(mallory.<->) q.h LIMIT 1) n;
DROP TABLE hv_fake;
DROP SCHEMA mallory CASCADE;

DROP TABLE hv_copy, hv_copy_back, hv_raw, hv_crafted, hv_assign, hv_items, hv_odd;
