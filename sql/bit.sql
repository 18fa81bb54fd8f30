--
-- bit strings: knn_gpu's hamming_distance / jaccard_distance and the
-- operators <~> and <%> (pgvector's absent here), knn_join with the metrics
-- hamming and jaccard and the KNN Join node on bit columns, checked against
-- the operators' own ORDER BY ... LIMIT results; errors with SQLSTATEs; the
-- two-stage binary-quantised search in one statement.
--

\i sql/error_of.psql

-- Hamming: differing bits; Jaccard: 1 - |a&b| / |a|b|, 1 when no bit is shared
SELECT B'1010' <~> B'0110' AS hamming, B'1010' <%> B'0110' AS jaccard,
	B'0000' <%> B'0000' AS jaccard_zero, B'1000' <%> B'0100' AS jaccard_disjoint,
	hamming_distance(B'111000111', B'000000000'), jaccard_distance(B'111000111', B'011000111');
-- varying lengths go through bit's implicit cast
SELECT B'101'::varbit <~> B'100'::varbit;
SELECT pg_temp.error_of($$SELECT B'101' <~> B'1010'$$);
SELECT pg_temp.error_of($$SELECT B'101' <%> B'1'$$);

CREATE TABLE bits (id int, b bit(70), vb varbit);
INSERT INTO bits
SELECT i, (lpad((((i * 2654435761) % 4294967296)::bigint)::bit(32)::text, 70, '0'))::bit(70)
	| (((i * 40503) % 65536)::bit(16)::text || repeat('0', 54))::bit(70),
	NULL
FROM generate_series(1, 400) i;
UPDATE bits SET vb = b::varbit;
INSERT INTO bits SELECT id + 1000, b, vb FROM bits WHERE id % 9 = 0;	-- duplicates: ties
INSERT INTO bits VALUES (5000, NULL, NULL), (5001, repeat('0', 70)::bit(70), repeat('0', 70)::varbit),
	(5002, repeat('0', 70)::bit(70), repeat('0', 70)::varbit);	-- all-zero rows for Jaccard
ANALYZE bits;

CREATE FUNCTION pg_temp.bit_differing(metric text, op text, k int, excl boolean, col text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
	n bigint;
BEGIN
	EXECUTE format($q$
		WITH j AS (SELECT query_id, target_id, rank, distance FROM knn_join(
			 'SELECT id, %s FROM bits WHERE id %% 11 = 0 OR id > 5000', 'SELECT id, %s FROM bits', %s, %L, %L)),
		r AS (SELECT q.id, n.id, n.rank::int, n.d FROM bits q CROSS JOIN LATERAL (
			 SELECT t.id, t.b %s q.b AS d, row_number() OVER (ORDER BY t.b %s q.b, t.id) AS rank
			 FROM bits t WHERE t.b IS NOT NULL AND (NOT %L OR t.id <> q.id)
			 ORDER BY t.b %s q.b, t.id LIMIT %s) n WHERE (q.id %% 11 = 0 OR q.id > 5000) AND q.b IS NOT NULL)
		SELECT count(*) FROM ((TABLE j EXCEPT ALL TABLE r) UNION ALL (TABLE r EXCEPT ALL TABLE j)) x$q$,
		col, col, k, metric, excl, op, op, excl, op, k) INTO n;
	RETURN n;
END $$;
SET knn_gpu.enable_knn_join = off;	-- the reference is the nested loop
SELECT m.metric, pg_temp.bit_differing(m.metric, m.op, 6, false, 'b') AS differing,
	pg_temp.bit_differing(m.metric, m.op, 4, true, 'b') AS differing_excluding_self,
	pg_temp.bit_differing(m.metric, m.op, 5, false, 'vb') AS differing_varbit
FROM (VALUES ('hamming', '<~>'), ('jaccard', '<%>')) m(metric, op);
RESET knn_gpu.enable_knn_join;
SELECT count(*) AS rows FROM knn_join('SELECT id, b FROM bits WHERE id % 11 = 0', 'SELECT id, b FROM bits', 6, 'jaccard');
SELECT knn_gpu_last_stats()->>'element' AS element, knn_gpu_last_stats()->>'variant' AS variant,
	(knn_gpu_last_stats()->>'dim')::int AS bits;
SELECT count(*) FROM knn_join('SELECT id, b FROM bits WHERE id = 11', 'SELECT id, b FROM bits', 10000, 'hamming');
-- no GPU kernel for bit rows: with the GPU asked for, the CPU engine runs and says so
SET knn_gpu.device = gpu;
SET client_min_messages = warning;
SELECT count(*) FROM knn_join('SELECT id, b FROM bits WHERE id = 11', 'SELECT id, b FROM bits', 3, 'hamming');
RESET client_min_messages;
SELECT knn_gpu_last_stats()->>'engine' = 'gpu' OR knn_gpu_last_stats()->>'device' ~ '\[no GPU' AS engine_as_expected;
RESET knn_gpu.device;

-- errors: metrics, types, lengths
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT id, b FROM bits', 'SELECT id, b FROM bits', 1)$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT id, b FROM bits', 'SELECT id, b FROM bits', 1, 'cosine')$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT 1, ''[1,2]''::vector', 'SELECT 1, ''[1,2]''::vector', 1, 'jaccard')$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT id, b FROM bits', 'SELECT 1, ''[1,2]''::vector', 1, 'hamming')$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT 1, B''101''', 'SELECT id, b FROM bits', 1, 'hamming')$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT 1, B''101'' UNION ALL SELECT 2, B''1''', 'SELECT 1, B''101''', 1, 'hamming')$q$);
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT 1, B''''', 'SELECT 1, B''101''', 1, 'hamming')$q$);

-- the KNN Join node with <~> and <%> on bit columns: the nested loop's rows
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM bits q CROSS JOIN LATERAL (SELECT t.id FROM bits t ORDER BY t.b <~> q.b LIMIT 3) n;
CREATE FUNCTION pg_temp.bit_node_differing(op text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
	query text := format($q$SELECT q.id AS qid, n.id AS nid, n.d FROM bits q
		LEFT JOIN LATERAL (SELECT t.id, q.b %s t.b AS d FROM bits t WHERE t.id <> q.id
						   ORDER BY q.b %s t.b, t.id LIMIT 5) n ON true$q$, op, op);
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
SELECT op, pg_temp.bit_node_differing(op) FROM (VALUES ('<~>'), ('<%>')) o(op);
-- different lengths: the operator's error
CREATE TABLE bits_odd (id int, b bit varying);
INSERT INTO bits_odd VALUES (1, B'101'), (2, B'1010');
CREATE TABLE bits_odd_fixed (id int, b bit(3));
INSERT INTO bits_odd_fixed VALUES (1, B'101'), (2, B'011');
SELECT pg_temp.error_of($q$SELECT * FROM knn_join('SELECT id, b FROM bits_odd', 'SELECT id, b FROM bits_odd', 1, 'hamming')$q$);
SELECT q.id, n.id, n.d FROM bits_odd_fixed q CROSS JOIN LATERAL (
	SELECT t.id, t.b <~> q.b AS d FROM bits_odd_fixed t ORDER BY t.b <~> q.b, t.id LIMIT 2) n ORDER BY 1, 3, 2;

-- Two-stage binary-quantised search in one statement: a Hamming join of the
-- sign bits finds 20 candidates per query, the exact re-rank keeps the best 3.
CREATE TABLE emb (id int, v vector(16), q bit(16));
INSERT INTO emb SELECT i, (SELECT array_agg(sin(i * 1.7 + j * 0.9) ORDER BY j) FROM generate_series(1, 16) j)
FROM generate_series(1, 200) i;
UPDATE emb SET q = binary_quantize(v);
-- binary_quantize: bit i is element i > 0 (as pgvector's)
SELECT binary_quantize('[1,-2,0,3,0.1,-0.1,5,6,7]'::vector), binary_quantize('[1,-2,0]'::halfvec);
SELECT count(*) FILTER (WHERE q <> (SELECT string_agg(CASE WHEN x > 0 THEN '1' ELSE '0' END, '' ORDER BY o)
	FROM unnest(v::real[]) WITH ORDINALITY u(x, o))::bit(16)
	OR q <> binary_quantize(v::halfvec)) AS differing
FROM emb;
CREATE TEMP TABLE two_stage AS
SELECT query_id, target_id, distance FROM (
	SELECT c.query_id, c.target_id, t.v <-> qv.v AS distance,
		row_number() OVER (PARTITION BY c.query_id ORDER BY t.v <-> qv.v, c.target_id) AS r
	FROM knn_join('SELECT id, q FROM emb WHERE id <= 20', 'SELECT id, q FROM emb', 20, 'hamming') c
	JOIN emb qv ON qv.id = c.query_id
	JOIN emb t ON t.id = c.target_id) ranked
WHERE r <= 3;
-- every re-ranked distance is the operator's, and each query's best is itself
SELECT count(*) AS rows,
	count(*) FILTER (WHERE s.distance IS DISTINCT FROM (SELECT a.v <-> b.v FROM emb a, emb b WHERE a.id = s.query_id AND b.id = s.target_id)) AS wrong_distance,
	count(DISTINCT query_id) FILTER (WHERE query_id = target_id AND distance = 0) AS found_itself
FROM two_stage s;

DROP TABLE bits, bits_odd, bits_odd_fixed, emb;
