--
-- knn_gpu's sparsevec (pgvector's absent here): text, binary and stored
-- forms against references built in SQL from the layout README documents,
-- casts, distances and norms against float8 sums of the dense values, the
-- btree order against real[]'s, damaged stored values refused without
-- reading past them, and knn_join's clear refusal of the type.
-- (sql/sparsevec_fuzz.sql: hostile binary and text input;
-- test/pgvector/sql/knn_pgvector_sparsevec.sql: bit-for-bit against the
-- real pgvector.)
--

\i sql/error_of.psql

-- ---- the text form: 1-based indices in any order, zeros dropped, printed
-- sorted with each value's shortest decimal
SELECT '{3:3.5,1:1.5}/5'::sparsevec AS unsorted, ' { 2 : -0 , 1 : 2. } / 3 '::sparsevec AS blanks_and_zero,
       '{}/1000000000'::sparsevec AS empty, '{1:1.23456789}/1'::sparsevec AS rounded_to_float;
SELECT '{1:1}/3'::sparsevec(3) AS typmod, pg_temp.error_of($$SELECT '{1:1}/3'::sparsevec(2)$$) AS typmod_mismatch;
SELECT pg_temp.error_of($$SELECT '{1:1,1:2}/2'::sparsevec$$) AS duplicate,
       pg_temp.error_of($$SELECT '{0:1}/2'::sparsevec$$) AS index_zero,
       pg_temp.error_of($$SELECT '{3:1}/2'::sparsevec$$) AS index_beyond,
       pg_temp.error_of($$SELECT '{1:NaN}/2'::sparsevec$$) AS nan,
       pg_temp.error_of($$SELECT '{1:1e39}/2'::sparsevec$$) AS out_of_range,
       pg_temp.error_of($$SELECT '{}/0'::sparsevec$$) AS no_dimension,
       pg_temp.error_of($$SELECT '{1:1}/2 x'::sparsevec$$) AS junk;
SELECT pg_temp.error_of(format('SELECT %L::sparsevec', '{' || repeat('1:1,', 16000) || '1:1}/16001')) AS too_many_commas,
       ('{' || (SELECT string_agg(i || ':1', ',') FROM generate_series(1, 16000) i) || '}/16000')::sparsevec = 
       array_fill(1, ARRAY[16000])::sparsevec AS most_elements;

-- ---- random values with their dense form as the reference: 1..70
-- dimensions, values of all magnitudes, zeros and -0 among them
SELECT setseed(0.125);
CREATE TABLE dense AS
SELECT i, (SELECT array_agg(CASE WHEN random() < 0.4 THEN (ARRAY['0', '-0'])[1 + (random() < 0.5)::int]::real
                                 ELSE ((random() - 0.5) * 10 ^ (random() * 10 - 5))::real END)
           FROM generate_series(1, 1 + i % 70) WHERE i > 0) AS arr
FROM generate_series(1, 400) i;
-- the same values as text, the stored elements listed in random order
CREATE TABLE sparse AS
SELECT i, arr, ('{' || coalesce((SELECT string_agg(j || ':' || arr[j], ',' ORDER BY random())
                                 FROM generate_series(1, cardinality(arr)) j WHERE arr[j] <> 0), '')
               || '}/' || cardinality(arr))::sparsevec AS v
FROM dense;
SELECT count(*) AS rows, count(*) FILTER (WHERE v::text LIKE '{}%') AS empty,
       count(*) FILTER (WHERE v::text ~ '^\{(\d+:[^,]+,)*\d+:[^,]+\}/\d+$') AS non_empty
FROM sparse;

-- the little-endian bytes of an int32, a float4
CREATE FUNCTION pg_temp.le(b bytea) RETURNS bytea LANGUAGE sql IMMUTABLE AS
  $$ SELECT substring(b from 4 for 1) || substring(b from 3 for 1) || substring(b from 2 for 1) || substring(b from 1 for 1) $$;
-- what README says a value is, from its dense form: the text form, the
-- binary form (int32 dim, nnz, unused = 0, the 0-based indices, the
-- values, big-endian) and the stored bytes after the varlena header (the
-- same fields in the machine's order: little-endian here)
CREATE FUNCTION pg_temp.expected_text(arr real[]) RETURNS text LANGUAGE sql IMMUTABLE AS $$
  SELECT '{' || coalesce(string_agg(j || ':' || arr[j], ',' ORDER BY j) FILTER (WHERE arr[j] <> 0), '') || '}/' || cardinality(arr)
  FROM generate_series(1, cardinality(arr)) j $$;
CREATE FUNCTION pg_temp.expected_binary(arr real[]) RETURNS bytea LANGUAGE sql IMMUTABLE AS $$
  SELECT int4send(cardinality(arr)) || int4send(count(*) FILTER (WHERE arr[j] <> 0)::int) || int4send(0)
         || coalesce(string_agg(int4send(j - 1), '' ORDER BY j) FILTER (WHERE arr[j] <> 0), '')
         || coalesce(string_agg(float4send(arr[j]), '' ORDER BY j) FILTER (WHERE arr[j] <> 0), '')
  FROM generate_series(1, cardinality(arr)) j $$;
CREATE FUNCTION pg_temp.expected_stored(arr real[]) RETURNS bytea LANGUAGE sql IMMUTABLE AS $$
  SELECT pg_temp.le(int4send(cardinality(arr))) || pg_temp.le(int4send(count(*) FILTER (WHERE arr[j] <> 0)::int))
         || pg_temp.le(int4send(0))
         || coalesce(string_agg(pg_temp.le(int4send(j - 1)), '' ORDER BY j) FILTER (WHERE arr[j] <> 0), '')
         || coalesce(string_agg(pg_temp.le(float4send(arr[j])), '' ORDER BY j) FILTER (WHERE arr[j] <> 0), '')
  FROM generate_series(1, cardinality(arr)) j $$;
-- a binary-coercible cast shows a datum's bytes as they are stored
CREATE CAST (sparsevec AS bytea) WITHOUT FUNCTION;
SELECT count(*) AS rows,
       count(*) FILTER (WHERE v::text <> pg_temp.expected_text(arr)) AS text_wrong,
       count(*) FILTER (WHERE knn_sparsevec_send(v) <> pg_temp.expected_binary(arr)) AS binary_wrong,
       count(*) FILTER (WHERE v::bytea <> pg_temp.expected_stored(arr)) AS stored_wrong,
       count(*) FILTER (WHERE v::text::sparsevec::bytea <> v::bytea) AS text_round_trip_wrong
FROM sparse;
SELECT v::bytea AS stored FROM (VALUES ('{1:1.5,3:-2}/5'::sparsevec)) s(v);
DROP CAST (sparsevec AS bytea);

-- binary COPY round trip (sparsevec(n) checks the typmod on receive)
CREATE TABLE sv_copy (i int, v sparsevec);
INSERT INTO sv_copy SELECT i, v FROM sparse UNION ALL VALUES (0, NULL::sparsevec);
\copy sv_copy TO 'results/sparsevec_copy_binary.bin' WITH (FORMAT binary)
CREATE TABLE sv_copy_back (i int, v sparsevec);
\copy sv_copy_back FROM 'results/sparsevec_copy_binary.bin' WITH (FORMAT binary)
SELECT count(*) AS rows,
       count(*) FILTER (WHERE knn_sparsevec_send(s.v) IS DISTINCT FROM knn_sparsevec_send(b.v)) AS different
FROM sv_copy s FULL JOIN sv_copy_back b ON s.i = b.i;
CREATE TABLE sv_copy_typmod (i int, v sparsevec(3));
\copy sv_copy_typmod FROM 'results/sparsevec_copy_binary.bin' WITH (FORMAT binary)
DROP TABLE sv_copy, sv_copy_back, sv_copy_typmod;

-- ---- casts, in pgvector's contexts
SELECT castsource::regtype AS source, casttarget::regtype AS target, castcontext AS context, castmethod AS method
FROM pg_cast WHERE castsource = 'sparsevec'::regtype OR casttarget = 'sparsevec'::regtype
ORDER BY 1::text, 2::text;
SELECT count(*) AS rows,
       count(*) FILTER (WHERE v::vector::real[] <> arr) AS to_vector_wrong,
       count(*) FILTER (WHERE arr::vector::sparsevec <> v OR arr::sparsevec <> v
                           OR arr::float8[]::sparsevec <> v OR arr::float8[]::numeric[]::sparsevec <> v) AS from_dense_wrong,
       count(*) FILTER (WHERE pg_temp.error_of(format('SELECT %L::sparsevec::halfvec', v))
                              <> pg_temp.error_of(format('SELECT %L::real[]::halfvec', arr))
                           OR (pg_temp.error_of(format('SELECT %L::real[]::halfvec', arr)) = 'no error'
                               AND (v::halfvec::real[] <> arr::halfvec::real[]
                                    OR v::halfvec::sparsevec <> arr::halfvec::real[]::sparsevec))) AS halfvec_wrong,
       count(*) FILTER (WHERE pg_temp.error_of(format('SELECT %L::real[]::halfvec', arr)) <> 'no error') AS beyond_halfvec
FROM sparse;
SELECT '{2:1.5,4:-3.5}/5'::sparsevec::vector AS to_vector, '{2:1.5,4:-3.5}/5'::sparsevec::halfvec(5) AS to_halfvec,
       '[0,1.5,-0,3.5]'::vector::sparsevec(4) AS from_vector, '[0,1.5,0,65504]'::halfvec::sparsevec AS from_halfvec,
       ARRAY[0,7,0]::sparsevec AS from_int, '{0.5,1e-46,0}'::float8[]::sparsevec AS float8_underflows_to_zero;
SELECT pg_temp.error_of($$SELECT '{}/16001'::sparsevec::vector$$) AS vector_too_long,
       pg_temp.error_of($$SELECT '{}/16001'::sparsevec::halfvec$$) AS halfvec_too_long,
       pg_temp.error_of($$SELECT '{1:70000}/1'::sparsevec::halfvec$$) AS halfvec_range,
       pg_temp.error_of($$SELECT '{NaN}'::real[]::sparsevec$$) AS nan,
       pg_temp.error_of($$SELECT '{4e38}'::float8[]::sparsevec$$) AS infinite,
       pg_temp.error_of($$SELECT '{}'::real[]::sparsevec$$) AS empty_array,
       pg_temp.error_of($$SELECT array_fill(1, ARRAY[16001])::sparsevec$$) AS too_many_elements,
       pg_temp.error_of($$SELECT '[1,2]'::vector::sparsevec(3)$$) AS typmod;

-- ---- distances and norms against float8 sums of the dense values. The
-- float sums' rounding is bounded by n * 2^-24 * (sum of |terms|); small
-- integers sum exactly. (L2 and L1 follow pgvector's summation order,
-- which depends on the operands' order: only the inner product is
-- symmetric to the last bit.)
CREATE TABLE pairs AS
SELECT a.i AS ai, b.i AS bi, a.v AS a, b.v AS b, a.arr AS x, b.arr AS y
FROM sparse a JOIN sparse b ON cardinality(a.arr) = cardinality(b.arr) AND a.i <= b.i;
CREATE FUNCTION pg_temp.sums(x real[], y real[], OUT l2sq float8, OUT l2sq_mass float8, OUT ip float8, OUT ip_mass float8,
                             OUT l1 float8, OUT xx float8, OUT yy float8)
LANGUAGE sql IMMUTABLE AS $$
  SELECT sum((x[j]::float8 - y[j]) ^ 2), sum(x[j]::float8 ^ 2 + y[j]::float8 ^ 2), sum(x[j]::float8 * y[j]),
         sum(abs(x[j]::float8 * y[j])), sum(abs(x[j]::float8 - y[j])), sum(x[j]::float8 ^ 2), sum(y[j]::float8 ^ 2)
  FROM generate_series(1, cardinality(x)) j $$;
SELECT count(*) AS pairs,
       count(*) FILTER (WHERE abs(sparsevec_l2_squared_distance(a, b) - s.l2sq) > (4 * cardinality(x) + 4) * 2 ^ -24 * s.l2sq_mass
                           OR abs(l2_distance(a, b) - sqrt(s.l2sq)) > sqrt((4 * cardinality(x) + 4) * 2 ^ -24 * s.l2sq_mass)
                           OR (a <-> b) <> l2_distance(a, b)) AS l2_wrong,
       count(*) FILTER (WHERE abs(inner_product(a, b) - s.ip) > (cardinality(x) + 1) * 2 ^ -24 * s.ip_mass
                           OR (a <#> b) <> -inner_product(a, b)
                           OR sparsevec_negative_inner_product(a, b) <> -inner_product(a, b)) AS ip_wrong,
       count(*) FILTER (WHERE abs(l1_distance(a, b) - s.l1) > (cardinality(x) + 1) * 2 ^ -24 * s.l1
                           OR (a <+> b) <> l1_distance(a, b)) AS l1_wrong,
       count(*) FILTER (WHERE s.xx > 0 AND s.yy > 0
                          AND abs(cosine_distance(a, b) - (1 - greatest(-1, least(1, s.ip / sqrt(s.xx * s.yy)))))
                              > 4 * (cardinality(x) + 1) * 2 ^ -24 * (1 + s.ip_mass / sqrt(s.xx * s.yy))) AS cosine_wrong,
       count(*) FILTER (WHERE (s.xx = 0 OR s.yy = 0) AND cosine_distance(a, b) <> 'NaN') AS cosine_zero_not_nan,
       count(*) FILTER (WHERE (a <=> b) IS DISTINCT FROM cosine_distance(a, b)) AS cosine_operator_wrong,
       count(*) FILTER (WHERE inner_product(a, b) <> inner_product(b, a)) AS ip_not_symmetric
FROM pairs, LATERAL pg_temp.sums(x, y) s;
-- small integers: exact
SELECT count(*) AS pairs,
       count(*) FILTER (WHERE sparsevec_l2_squared_distance(a.v, b.v) <> s.l2sq OR inner_product(a.v, b.v) <> s.ip
                           OR l1_distance(a.v, b.v) <> s.l1 OR l2_distance(a.v, b.v) <> sqrt(s.l2sq)) AS wrong
FROM (SELECT i, x, x::sparsevec AS v FROM (SELECT i, (SELECT array_agg((random() * 6)::int % 4 - 1)::real[]
                                                      FROM generate_series(1, 9) WHERE i > 0) AS x
                                           FROM generate_series(1, 60) i) r) a
JOIN (SELECT i, x, x::sparsevec AS v FROM (SELECT i, (SELECT array_agg((random() * 6)::int % 4 - 1)::real[]
                                                      FROM generate_series(1, 9) WHERE i > 0) AS x
                                           FROM generate_series(1, 60) i) r) b ON true,
     LATERAL pg_temp.sums(a.x, b.x) s;
SELECT count(*) AS rows,
       count(*) FILTER (WHERE abs(l2_norm(v) - sqrt(s.xx)) > 1e-12 * sqrt(s.xx)) AS norm_wrong,
       count(*) FILTER (WHERE s.xx > 0 AND EXISTS (SELECT FROM generate_series(1, cardinality(arr)) j
                                                   WHERE abs((l2_normalize(v)::vector::real[])[j] - arr[j] / sqrt(s.xx)) > 1e-6)) AS normalize_wrong,
       count(*) FILTER (WHERE s.xx = 0 AND l2_normalize(v) <> v) AS zero_normalize_wrong
FROM sparse, LATERAL pg_temp.sums(arr, arr) s;
SELECT l2_norm('{1:3,2:4}/2'::sparsevec) AS norm, l2_normalize('{1:3,3:4}/5'::sparsevec) AS normalized,
       l2_normalize('{1:3e38,2:1e-37}/2'::sparsevec) AS underflow_dropped,
       '{1:1,3:3}/4'::sparsevec <-> '{2:2,4:4}/4' AS l2, '{1:1,3:3}/4'::sparsevec <#> '{3:2}/4' AS neg_ip,
       '{1:1}/2'::sparsevec <=> '{2:1}/2' AS cosine, '{1:1,3:3}/4'::sparsevec <+> '{2:-2}/4' AS l1;
SELECT pg_temp.error_of($$SELECT '{1:1}/2'::sparsevec <-> '{1:1}/3'$$) AS different_dims;

-- ---- the btree order: the dense values' order (elements, then the number
-- of dimensions), as real[] compares
SELECT (SELECT array_agg(i ORDER BY v, i) FROM sparse) = (SELECT array_agg(i ORDER BY arr, i) FROM sparse) AS same_order,
       (SELECT count(*) FROM pairs WHERE (sparsevec_cmp(a, b) = 0) <> (x = y)
                                      OR sign(sparsevec_cmp(a, b)) <> sign(btarraycmp(x, y))) AS cmp_wrong;
SELECT count(*) AS pairs,
       count(*) FILTER (WHERE (a.v < b.v) <> (a.arr < b.arr) OR (a.v <= b.v) <> (a.arr <= b.arr)
                           OR (a.v = b.v) <> (a.arr = b.arr) OR (a.v <> b.v) <> (a.arr <> b.arr)
                           OR (a.v >= b.v) <> (a.arr >= b.arr) OR (a.v > b.v) <> (a.arr > b.arr)) AS operators_wrong
FROM sparse a JOIN sparse b ON (a.i * 7 + b.i) % 5 = 0;
CREATE INDEX ON sparse (v);
SET enable_seqscan = off;
EXPLAIN (COSTS OFF) SELECT i FROM sparse WHERE v = '{1:1}/3';
SELECT count(*) AS rows, count(*) FILTER (WHERE (SELECT count(*) FROM sparse s2 WHERE s2.v = s1.v)
                                                <> (SELECT count(*) FROM dense d WHERE d.arr = s1.arr)) AS lookup_wrong
FROM sparse s1;
RESET enable_seqscan;

-- ---- damaged stored values (forged here through a binary-coercible cast
-- from bytea): one whose size disagrees with its header is refused by every
-- function before anything beyond it is read; an index out of bounds is
-- refused where it would address memory (the casts to dense types), and
-- elsewhere only read as a number
CREATE CAST (bytea AS sparsevec) WITHOUT FUNCTION;
CREATE FUNCTION pg_temp.forged(dim int, nnz int, body bytea) RETURNS sparsevec LANGUAGE sql IMMUTABLE AS
  $$ SELECT (pg_temp.le(int4send(dim)) || pg_temp.le(int4send(nnz)) || pg_temp.le(int4send(0)) || body)::sparsevec $$;
CREATE TABLE forged (what text, v sparsevec);
INSERT INTO forged VALUES
  ('short header', '\x0100'::bytea::sparsevec),
  ('nnz beyond the bytes', pg_temp.forged(5, 1000, '')),
  ('nnz negative', pg_temp.forged(5, -1, '')),
  ('nnz above dim', pg_temp.forged(1, 2, pg_temp.le(int4send(0)) || pg_temp.le(int4send(1)) || '\x0000803f0000803f')),
  ('dim zero', pg_temp.forged(0, 0, '')),
  ('bytes left over', pg_temp.forged(5, 0, '\x00000000')),
  ('index out of bounds', pg_temp.forged(2, 1, pg_temp.le(int4send(7)) || '\x0000803f'));
SELECT what, f, pg_temp.error_of(format('SELECT %s', replace(f, 'V', format('(SELECT v FROM forged WHERE what = %L)', what)))) AS error
FROM forged, unnest(ARRAY['V::text', 'knn_sparsevec_send(V)', 'V <-> V', 'V <#> V', 'V <=> V', 'V <+> V', 'l2_norm(V)',
                          'l2_normalize(V)', 'V = V', 'sparsevec_cmp(V, V)', 'V::vector', 'V::halfvec', 'V::sparsevec(5)']) f
WHERE pg_temp.error_of(format('SELECT %s', replace(f, 'V', format('(SELECT v FROM forged WHERE what = %L)', what)))) NOT LIKE 'XX001: invalid sparsevec value: %'
ORDER BY what COLLATE "C", f COLLATE "C";
SELECT what, pg_temp.error_of(format('SELECT (SELECT v FROM forged WHERE what = %L)::text', what)) AS error
FROM forged ORDER BY 1;
DROP TABLE forged;
DROP CAST (bytea AS sparsevec);

-- ---- knn_join and the KNN Join node do not read sparsevec: a clear error,
-- and PostgreSQL's own plan for a LATERAL top-k
SELECT pg_temp.error_of($$SELECT * FROM knn_join('SELECT i, v FROM sparse', 'SELECT i, v FROM sparse', 2)$$) AS knn_join,
       pg_temp.error_of($$SELECT * FROM knn_range_join('SELECT i, v FROM sparse', 'SELECT i, v FROM sparse', 1.0)$$) AS knn_range_join;
EXPLAIN (COSTS OFF)
SELECT q.i, n.i FROM sparse q CROSS JOIN LATERAL (SELECT t.i FROM sparse t ORDER BY t.v <-> q.v LIMIT 2) n;

DROP TABLE pairs, sparse, dense;
