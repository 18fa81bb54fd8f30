--
-- pgvector's functions, operators and aggregates of the halfvec type that
-- knn_gpu provides when it has its own type (extension/sql/18_halfvec_functions.sql):
-- + - * ||, the comparison operators, halfvec_cmp and the btree class,
-- l2_norm, l2_normalize, subvector, avg, sum and their support functions,
-- the index support distances and the cast functions under pgvector's
-- names. Results are checked against the same computation done by
-- PostgreSQL on real[] / float8, rounded to binary16 by the real[] ->
-- halfvec cast (sql/halfvec.sql checks that rounding); errors by SQLSTATE
-- and message (those of pgvector). test/pgvector_compat/run_compat.sh runs
-- pgvector's own halfvec.sql against these functions, and
-- test/pgvector/sql/knn_pgvector_halfvec.sql compares them with pgvector.
--

\i sql/error_of.psql

-- Pairs of halfvecs of 1..20 dimensions, their elements as real[] (the
-- widened binary16 values, so exact).
SELECT setseed(0.75);
CREATE TEMP TABLE pairs AS
SELECT i, a::halfvec::real[] AS a, b::halfvec::real[] AS b
FROM (SELECT i, array_agg(x ORDER BY j) AS a, array_agg(y ORDER BY j) AS b
      FROM (SELECT i, j, round((random() * 200 - 100)::numeric, 3)::real AS x,
                   round((random() * 200 - 100)::numeric, 3)::real AS y
            FROM generate_series(1, 200) i, generate_series(1, 1 + i % 20) j) s
      GROUP BY i) p;
SELECT count(*) AS pairs, min(cardinality(a)) AS min_dims, max(cardinality(a)) AS max_dims FROM pairs;

-- Element i of a + b, a - b, a * b is the float4 result rounded to binary16.
SELECT count(*) FILTER (WHERE a::halfvec + b::halfvec <> ARRAY(SELECT x + y FROM unnest(a, b) WITH ORDINALITY u(x, y, o) ORDER BY o)::halfvec) AS add_wrong,
       count(*) FILTER (WHERE a::halfvec - b::halfvec <> ARRAY(SELECT x - y FROM unnest(a, b) WITH ORDINALITY u(x, y, o) ORDER BY o)::halfvec) AS sub_wrong,
       count(*) FILTER (WHERE a::halfvec * b::halfvec <> ARRAY(SELECT x * y FROM unnest(a, b) WITH ORDINALITY u(x, y, o) ORDER BY o)::halfvec) AS mul_wrong,
       count(*) AS pairs
FROM pairs;
-- + and * commute (declared COMMUTATOR), - does not
SELECT count(*) FILTER (WHERE a::halfvec + b::halfvec <> b::halfvec + a::halfvec) AS add_not_commuting,
       count(*) FILTER (WHERE a::halfvec * b::halfvec <> b::halfvec * a::halfvec) AS mul_not_commuting,
       count(*) FILTER (WHERE a::halfvec - b::halfvec = b::halfvec - a::halfvec) AS sub_commuting
FROM pairs;
-- results at the edges of binary16: the largest finite, the subnormals
SELECT '[65504,-65504]'::halfvec + '[-0.5,0.5]' AS near_max, '[0.00006,1]'::halfvec * '[0.001,0.001]' AS subnormal,
       '[6e-8]'::halfvec - '[6e-8]' AS zero, '[32768]'::halfvec + '[16]' AS half_even_tie;

-- || is halfvec concatenation (not text's), with pgvector's literal forms
SELECT '[1,2]'::halfvec || '[3,4]' AS concat, pg_typeof('[1,2]'::halfvec || '[3,4]');
SELECT count(*) FILTER (WHERE (a::halfvec || b::halfvec)::real[] <> a || b) AS concat_wrong,
       count(*) FILTER (WHERE vector_dims(a::halfvec || b::halfvec) <> cardinality(a) + cardinality(b)) AS dims_wrong
FROM pairs;
SELECT vector_dims(array_fill(0, ARRAY[15999])::halfvec || '[1]') AS dims_16000;

-- halfvec_cmp and the comparison operators: the order of real[] (element
-- by element, then the shorter first)
SELECT count(*) FILTER (WHERE halfvec_cmp(p.a::halfvec, q.a::halfvec) <> CASE WHEN p.a < q.a THEN -1 WHEN p.a > q.a THEN 1 ELSE 0 END) AS cmp_wrong,
       count(*) FILTER (WHERE (p.a::halfvec < q.a::halfvec) <> (p.a < q.a) OR (p.a::halfvec <= q.a::halfvec) <> (p.a <= q.a)
                           OR (p.a::halfvec = q.a::halfvec) <> (p.a = q.a) OR (p.a::halfvec <> q.a::halfvec) <> (p.a <> q.a)
                           OR (p.a::halfvec >= q.a::halfvec) <> (p.a >= q.a) OR (p.a::halfvec > q.a::halfvec) <> (p.a > q.a)) AS operators_wrong,
       count(*) AS pairs
FROM pairs p, pairs q WHERE p.i % 7 = 0;
SELECT halfvec_cmp('[1,2]', '[1,2,3]') AS prefix_first, halfvec_cmp('[2]', '[1,2,3]') AS element_first,
       halfvec_cmp('[-0]', '[0]') AS minus_zero_equal, halfvec_cmp('[1,2.0004]', '[1,2]') AS rounded_equal;

-- the btree class: ORDER BY, DISTINCT and an index scan give real[]'s order
CREATE TEMP TABLE ordered (i int, v halfvec);
INSERT INTO ordered SELECT i, a::halfvec FROM pairs;
INSERT INTO ordered SELECT 1000 + i, a::halfvec FROM pairs WHERE i % 3 = 0;
SELECT (SELECT array_agg(i ORDER BY v, i) FROM ordered)
     = (SELECT array_agg(o.i ORDER BY p.a, o.i) FROM ordered o JOIN pairs p ON p.i = o.i % 1000) AS order_right,
       (SELECT count(DISTINCT v) FROM ordered) AS distinct_values, (SELECT count(*) FROM pairs) AS pairs;
CREATE INDEX ordered_v ON ordered (v);
SET enable_seqscan = off;
EXPLAIN (COSTS OFF) SELECT i FROM ordered WHERE v = (SELECT a::halfvec FROM pairs WHERE i = 3);
SELECT array_agg(i ORDER BY i) AS equal_rows FROM ordered WHERE v = (SELECT a::halfvec FROM pairs WHERE i = 3);
SELECT (SELECT array_agg(i) FROM (SELECT i FROM ordered ORDER BY v, i) s)
     = (SELECT array_agg(i ORDER BY v, i) FROM ordered) AS index_order_right;
RESET enable_seqscan;
DROP TABLE ordered;

-- l2_norm: squares of the widened elements summed in float8 in element
-- order (pgvector's loop), then sqrt
SELECT count(*) FILTER (WHERE l2_norm(a::halfvec) <> (SELECT sqrt(sum(x::float8 * x::float8 ORDER BY o)) FROM unnest(a) WITH ORDINALITY u(x, o))) AS norm_wrong,
       count(*) AS halfvecs
FROM pairs;
SELECT l2_norm('[3,4]'::halfvec) AS three_four, l2_norm('[65504,65504,65504]'::halfvec) AS no_overflow;

-- l2_normalize: each element over that norm in float8, to float4, to binary16
SELECT count(*) FILTER (WHERE l2_normalize(a::halfvec) <> ARRAY(SELECT (x / l2_norm(a::halfvec))::real FROM unnest(a) WITH ORDINALITY u(x, o) ORDER BY o)::halfvec) AS normalize_wrong,
       count(*) AS halfvecs
FROM pairs;
SELECT l2_normalize('[3,4]'::halfvec) AS unit, l2_normalize('[0,0]'::halfvec) AS zero_stays_zero,
       l2_normalize('[65504]'::halfvec) AS largest;

-- subvector: substring's rules, against real[] slices
SELECT count(*) FILTER (WHERE coalesce(got, error) IS DISTINCT FROM coalesce(expected::text, 'no elements')) AS subvector_wrong,
       count(*) FILTER (WHERE expected IS NULL) AS empty_cases, count(*) AS cases
FROM (SELECT CASE WHEN greatest(s, 1) <= least(s::bigint + c - 1, 5) AND c >= 1
                  THEN (ARRAY[1,2,3,4,5]::real[])[greatest(s, 1):least(s::bigint + c - 1, 5)] END AS expected,
             CASE WHEN e = 'no error' THEN subvector('[1,2,3,4,5]'::halfvec, s, c)::real[]::text END AS got,
             CASE WHEN e = '22000: halfvec must have at least 1 dimension' THEN 'no elements' ELSE e END AS error
      FROM generate_series(-3, 8) s, generate_series(-2, 8) c,
           LATERAL (SELECT pg_temp.error_of(format('SELECT subvector(%L::halfvec, %s, %s)', '[1,2,3,4,5]', s, c)) AS e) t) cases;
SELECT pg_temp.error_of($$SELECT subvector('[1,2,3,4,5]'::halfvec, 2147483647, 10)$$) AS start_int_max;
SELECT subvector('[1,2,3,4,5]'::halfvec, -2147483644, 2147483647) AS wide, subvector('[1,2,3,4,5]'::halfvec, 3, 2147483647) AS tail;

-- Errors, as pgvector's (SQLSTATE: message)
SELECT pg_temp.error_of($$SELECT '[1,2]'::halfvec + '[3]'$$) AS add_dims,
       pg_temp.error_of($$SELECT '[1,2]'::halfvec - '[3]'$$) AS sub_dims,
       pg_temp.error_of($$SELECT '[1,2]'::halfvec * '[3]'$$) AS mul_dims;
SELECT pg_temp.error_of($$SELECT '[65504]'::halfvec + '[16]'$$) AS add_overflow,
       pg_temp.error_of($$SELECT '[-65504]'::halfvec - '[16]'$$) AS sub_overflow,
       pg_temp.error_of($$SELECT '[256]'::halfvec * '[256]'$$) AS mul_overflow,
       pg_temp.error_of($$SELECT '[1e-4]'::halfvec * '[1e-4]'$$) AS mul_underflow;
SELECT '[65504]'::halfvec + '[15]' AS rounds_down_to_max, '[0,1e-4]'::halfvec * '[5,0]' AS zero_factor_is_no_underflow;
SELECT pg_temp.error_of($$SELECT array_fill(0, ARRAY[16000])::halfvec || '[1]'$$) AS concat_too_long,
       pg_temp.error_of($$SELECT subvector('[1,2,3]'::halfvec, 1, 0)$$) AS subvector_count,
       pg_temp.error_of($$SELECT subvector('[1,2,3]'::halfvec, 4, 1)$$) AS subvector_start;

-- avg and sum: avg is the float8 mean per element rounded to float4, then
-- to binary16; sum adds in binary16, rounding after every value. Integer
-- elements small enough that every partial sum is exact in binary16, so the
-- order of summation, serial or parallel, cannot change them.
CREATE TEMP TABLE halfvecs AS
SELECT g, i, ARRAY[(i * 7) % 11 - 5, (i * 13) % 3, g - i % 5]::real[] AS r
FROM generate_series(1, 3) g, generate_series(1, 300) i;
CREATE TEMP VIEW reference AS
SELECT g, array_agg(mean ORDER BY o)::halfvec AS mean, array_agg(total ORDER BY o)::halfvec AS total
FROM (SELECT g, o, (sum(x::float8) / count(*))::real AS mean, sum(x) AS total
      FROM halfvecs, unnest(r) WITH ORDINALITY u(x, o) GROUP BY g, o) e
GROUP BY g;
SELECT count(*) FILTER (WHERE a.mean = r.mean) AS avg_right,
       count(*) FILTER (WHERE a.total = r.total) AS sum_right
FROM (SELECT g, avg(r::halfvec) AS mean, sum(r::halfvec) AS total FROM halfvecs GROUP BY g) a
JOIN reference r USING (g);
-- sum rounds after every value, in input order: 2048 + 1 + 1 stays 2048
SELECT sum(v ORDER BY o) AS rounded_each_step, avg(v ORDER BY o) AS mean
FROM unnest(ARRAY['[2048]'::halfvec, '[1]', '[1]']) WITH ORDINALITY u(v, o);
SELECT avg(v), sum(v) FROM unnest(ARRAY['[1,2,3]'::halfvec, '[3,5,7]', NULL]) v;
SELECT avg(v) IS NULL AS avg_null, sum(v) IS NULL AS sum_null FROM unnest(ARRAY[]::halfvec[]) v;
SELECT pg_temp.error_of($$SELECT avg(v) FROM unnest(ARRAY['[1,2]'::halfvec, '[3]']) v$$) AS avg_dims,
       pg_temp.error_of($$SELECT sum(v) FROM unnest(ARRAY['[1,2]'::halfvec, '[3]']) v$$) AS sum_dims,
       pg_temp.error_of($$SELECT sum(v) FROM unnest(ARRAY['[65504]'::halfvec, '[65504]']) v$$) AS sum_overflow;
SELECT avg(v) AS large_mean FROM unnest(ARRAY['[65504]'::halfvec, '[65504]', '[65504]']) v;

-- In parallel: partial aggregates in the workers, combined in the leader.
CREATE TABLE parallel_halfvecs (r real[], v halfvec(3)) WITH (parallel_workers = 2);
INSERT INTO parallel_halfvecs SELECT r, r::halfvec FROM halfvecs;
ANALYZE parallel_halfvecs;
SET parallel_setup_cost = 0;
SET parallel_tuple_cost = 0;
SET min_parallel_table_scan_size = 0;
SET max_parallel_workers_per_gather = 2;
EXPLAIN (COSTS OFF) SELECT avg(v), sum(v) FROM parallel_halfvecs;
CREATE TEMP TABLE parallel_result AS SELECT avg(v) AS mean, sum(v) AS total FROM parallel_halfvecs;
RESET max_parallel_workers_per_gather;
RESET min_parallel_table_scan_size;
RESET parallel_tuple_cost;
RESET parallel_setup_cost;
SET max_parallel_workers_per_gather = 0;
SELECT p.mean = s.mean AS avg_same, p.total = s.total AS sum_same
FROM parallel_result p, (SELECT avg(v) AS mean, sum(v) AS total FROM parallel_halfvecs) s;
RESET max_parallel_workers_per_gather;
SELECT a.proname, a.proparallel, g.aggcombinefn::regproc AS combine
FROM pg_aggregate g JOIN pg_proc a ON a.oid = g.aggfnoid
WHERE a.proargtypes[0] = 'halfvec'::regtype
ORDER BY 1;
DROP TABLE parallel_halfvecs;

-- The support functions, called directly: the state is {count, sums...}
SELECT halfvec_accum('{0}', '[1,2,3]') AS first, halfvec_accum('{1,1,2,3}', '[1,2,0.1]') AS second,
       halfvec_combine('{1,1,2}', '{2,3,4}') AS combined, halfvec_combine('{0}', '{2,3,4}') AS empty_left,
       halfvec_avg('{4,2,4,6}') AS mean, halfvec_avg('{3,1,1,1}') AS third, halfvec_avg('{0}') IS NULL AS no_values;
SELECT pg_temp.error_of($$SELECT halfvec_accum('{{0}}', '[1,2,3]')$$) AS accum_2d,
       pg_temp.error_of($$SELECT halfvec_accum('{NULL}', '[1,2,3]')$$) AS accum_null,
       pg_temp.error_of($$SELECT halfvec_accum('{}', '[1,2,3]')$$) AS accum_empty,
       pg_temp.error_of($$SELECT halfvec_accum('{0,0}', '[1,2,3]')$$) AS accum_dims;
SELECT pg_temp.error_of($$SELECT halfvec_avg('{1}')$$) AS avg_no_dims,
       pg_temp.error_of($$SELECT halfvec_avg('{1,65520}')$$) AS avg_out_of_range,
       pg_temp.error_of($$SELECT halfvec_avg('{1,Infinity}')$$) AS avg_infinite,
       pg_temp.error_of($$SELECT halfvec_avg('{1,NaN}')$$) AS avg_nan,
       pg_temp.error_of($$SELECT halfvec_avg('{{2,2,4,6}}')$$) AS avg_2d,
       pg_temp.error_of($$SELECT halfvec_avg(array_fill(1::float8, ARRAY[16002]))$$) AS avg_too_long;

-- pgvector's index support distances (knn_gpu builds no index; callable)
SELECT halfvec_l2_squared_distance('[0,0]', '[3,4]') AS l2_squared,
       halfvec_negative_inner_product('[1,2]', '[3,4]') AS negative_ip,
       halfvec_spherical_distance('[1,0]', '[0,1]') AS right_angle,
       halfvec_spherical_distance('[1,0]', '[-1,0]') AS opposite,
       halfvec_spherical_distance('[1,1]', '[1,1]') AS beyond_one_clamped;
-- the same sums as the operators: <-> is the square root of the float sum
SELECT count(*) FILTER (WHERE sqrt(halfvec_l2_squared_distance(a::halfvec, b::halfvec)) <> (a::halfvec <-> b::halfvec)
                           OR halfvec_l2_squared_distance(a::halfvec, b::halfvec)::real::float8 <> halfvec_l2_squared_distance(a::halfvec, b::halfvec)) AS l2_squared_wrong,
       count(*) FILTER (WHERE halfvec_negative_inner_product(a::halfvec, b::halfvec) <> (a::halfvec <#> b::halfvec)) AS negative_ip_wrong,
       count(*) AS pairs
FROM pairs;
SELECT pg_temp.error_of($$SELECT halfvec_spherical_distance('[1,0]', '[1]')$$) AS spherical_dims;

-- pgvector's names for the cast functions, the same as the casts
SELECT array_to_halfvec(ARRAY[1,2,3], -1, true) AS from_int, array_to_halfvec('{1.5,2}'::real[], 2, true) AS from_real,
       array_to_halfvec('{0.1}'::float8[], -1, true) AS from_float8, array_to_halfvec('{2.5}'::numeric[], -1, true) AS from_numeric,
       halfvec_to_float4('[1,2]', -1, true) AS to_real, halfvec('[1,2]', 2, true) AS typmod,
       halfvec_to_vector('[0.1]', -1, true) AS to_vector, vector_to_halfvec('[0.1]', -1, true) AS from_vector;
SELECT pg_temp.error_of($$SELECT array_to_halfvec(array_agg(n), 16001, false) FROM generate_series(1, 16001) n$$) AS too_long,
       pg_temp.error_of($$SELECT halfvec('[1,2]', 3, true)$$) AS typmod_mismatch,
       pg_temp.error_of($$SELECT vector_to_halfvec('[65520]', -1, true)$$) AS out_of_range;
-- the casts' contexts, as pgvector has them
SELECT format_type(castsource, NULL) AS source, format_type(casttarget, NULL) AS target, castcontext, castfunc::regproc
FROM pg_cast WHERE 'halfvec'::regtype IN (castsource, casttarget) ORDER BY 1, 2;
SELECT ARRAY[1,2]::halfvec <-> '[1,3]'::vector AS vector_becomes_halfvec, pg_typeof('[1,2]'::vector + '[1,2]'::halfvec);

-- every operator and function of this part exists once and belongs to knn_gpu
SELECT count(*) AS objects,
       count(*) FILTER (WHERE EXISTS (SELECT FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid
                                      WHERE d.objid = o.oid AND d.deptype = 'e' AND e.extname = 'knn_gpu')) AS knn_gpu_members
FROM (SELECT oid FROM pg_operator WHERE oprleft = 'halfvec'::regtype AND oprname IN ('+', '-', '*', '||', '<', '<=', '=', '<>', '>=', '>')
      UNION ALL
      SELECT oid FROM pg_proc WHERE proname IN ('l2_norm', 'l2_normalize', 'subvector', 'halfvec_add', 'halfvec_sub', 'halfvec_mul',
                                                 'halfvec_concat', 'halfvec_lt', 'halfvec_le', 'halfvec_eq', 'halfvec_ne',
                                                 'halfvec_ge', 'halfvec_gt', 'halfvec_cmp', 'halfvec_accum', 'halfvec_avg',
                                                 'halfvec_combine', 'avg', 'sum', 'halfvec_l2_squared_distance',
                                                 'halfvec_negative_inner_product', 'halfvec_spherical_distance', 'halfvec',
                                                 'halfvec_to_vector', 'vector_to_halfvec', 'array_to_halfvec', 'halfvec_to_float4')
                                AND (proname LIKE 'halfvec%' OR proname LIKE '%halfvec' OR 'halfvec'::regtype = ANY (proargtypes::oid[]))) o;
