--
-- pgvector's functions, operators and aggregates of the vector type that
-- knn_gpu provides when it has its own type (extension/sql/16_vector_functions.sql):
-- + - * ||, vector_cmp, l2_normalize, subvector, vector_norm, avg, sum and
-- the aggregates' support functions. Results are checked against the same
-- computation done by PostgreSQL on real[] / float8 (float4 arithmetic is
-- IEEE single precision in both), errors by SQLSTATE and message (those of
-- pgvector). test/pgvector_compat/run_compat.sh runs pgvector's own test
-- files against these functions.
--

\i sql/error_of.psql

-- Pairs of vectors of 1..20 dimensions with 3-decimal elements, and the
-- same values as real[].
SELECT setseed(0.25);
CREATE TEMP TABLE pairs AS
SELECT i, array_agg(x ORDER BY j) AS a, array_agg(y ORDER BY j) AS b
FROM (SELECT i, j, round((random() * 200 - 100)::numeric, 3)::real AS x,
             round((random() * 200 - 100)::numeric, 3)::real AS y
      FROM generate_series(1, 200) i, generate_series(1, 1 + i % 20) j) s
GROUP BY i;
SELECT count(*) AS pairs, min(cardinality(a)) AS min_dims, max(cardinality(a)) AS max_dims FROM pairs;

-- Element i of a + b, a - b, a * b is the float4 sum, difference, product.
SELECT count(*) FILTER (WHERE (a::vector + b::vector)::real[] <> ARRAY(SELECT x + y FROM unnest(a, b) WITH ORDINALITY u(x, y, o) ORDER BY o)) AS add_wrong,
       count(*) FILTER (WHERE (a::vector - b::vector)::real[] <> ARRAY(SELECT x - y FROM unnest(a, b) WITH ORDINALITY u(x, y, o) ORDER BY o)) AS sub_wrong,
       count(*) FILTER (WHERE (a::vector * b::vector)::real[] <> ARRAY(SELECT x * y FROM unnest(a, b) WITH ORDINALITY u(x, y, o) ORDER BY o)) AS mul_wrong,
       count(*) AS pairs
FROM pairs;
-- + and * commute (declared COMMUTATOR), - does not
SELECT count(*) FILTER (WHERE a::vector + b::vector <> b::vector + a::vector) AS add_not_commuting,
       count(*) FILTER (WHERE a::vector * b::vector <> b::vector * a::vector) AS mul_not_commuting,
       count(*) FILTER (WHERE a::vector - b::vector = b::vector - a::vector) AS sub_commuting
FROM pairs;

-- || is vector concatenation (not text's), with pgvector's literal forms
SELECT '[1,2]'::vector || '[3,4]' AS concat, pg_typeof('[1,2]'::vector || '[3,4]');
SELECT count(*) FILTER (WHERE (a::vector || b::vector)::real[] <> a || b) AS concat_wrong,
       count(*) FILTER (WHERE vector_dims(a::vector || b::vector) <> cardinality(a) + cardinality(b)) AS dims_wrong
FROM pairs;
SELECT vector_dims(array_fill(0, ARRAY[15999])::vector || '[1]') AS dims_16000;

-- vector_norm: squares summed in double precision, in the order of
-- pgvector's packaged x86-64 build (see knn_vector_norm_of): blocks of four
-- into two lanes (x0^2 + x2^2, x1^2 + x3^2), lane 1 + lane 0, then the rest
-- in order. Written again here in PL/pgSQL as the reference.
CREATE FUNCTION pg_temp.packaged_pgvector_norm(x real[]) RETURNS float8 LANGUAGE plpgsql AS $$
DECLARE
  n int := cardinality(x);
  blocks_end int := CASE WHEN n >= 4 THEN n - n % 4 ELSE 0 END;
  lane0 float8 := 0;
  lane1 float8 := 0;
  total float8;
BEGIN
  FOR b IN 0 .. blocks_end / 4 - 1 LOOP
    lane0 := lane0 + (x[4 * b + 1]::float8 * x[4 * b + 1]::float8 + x[4 * b + 3]::float8 * x[4 * b + 3]::float8);
    lane1 := lane1 + (x[4 * b + 2]::float8 * x[4 * b + 2]::float8 + x[4 * b + 4]::float8 * x[4 * b + 4]::float8);
  END LOOP;
  total := lane1 + lane0;
  FOR i IN blocks_end + 1 .. n LOOP
    total := total + x[i]::float8 * x[i]::float8;
  END LOOP;
  RETURN sqrt(total);
END $$;
SELECT count(*) FILTER (WHERE vector_norm(a::vector) <> pg_temp.packaged_pgvector_norm(a)) AS norm_wrong,
       count(*) FILTER (WHERE vector_norm(a::vector) <> (SELECT sqrt(sum(x::float8 * x::float8 ORDER BY o)) FROM unnest(a) WITH ORDINALITY u(x, o))) AS differs_from_sum_in_order
FROM pairs;
SELECT vector_norm('[3e37,4e37]')::real AS no_float_overflow;

-- l2_normalize: each element over that norm, rounded to float4
SELECT count(*) FILTER (WHERE l2_normalize(a::vector)::real[] <>
         ARRAY(SELECT (x / vector_norm(a::vector))::real FROM unnest(a) WITH ORDINALITY u(x, o) ORDER BY o)) AS normalize_wrong
FROM pairs;
SELECT l2_normalize('[0,0,0]'::vector) AS zero_stays_zero, l2_normalize('[3e38]'::vector) AS large,
       l2_normalize('[1e-45,0]'::vector) AS subnormal;

-- subvector(v, start, count) is substring's rule on positions 1..dim:
-- the same elements as the array slice, an error where it is empty.
SELECT count(*) FILTER (WHERE coalesce(got, error) IS DISTINCT FROM coalesce(expected::text, 'no elements')) AS subvector_wrong,
       count(*) FILTER (WHERE expected IS NULL) AS empty_cases, count(*) AS cases
FROM (SELECT CASE WHEN greatest(s, 1) <= least(s::bigint + c - 1, 5) AND c >= 1
                  THEN (ARRAY[1,2,3,4,5]::real[])[greatest(s, 1):least(s::bigint + c - 1, 5)] END AS expected,
             CASE WHEN e = 'no error' THEN subvector('[1,2,3,4,5]'::vector, s, c)::real[]::text END AS got,
             CASE WHEN e = '22000: vector must have at least 1 dimension' THEN 'no elements' ELSE e END AS error
      FROM generate_series(-3, 8) s, generate_series(-2, 8) c,
           LATERAL (SELECT pg_temp.error_of(format('SELECT subvector(%L::vector, %s, %s)', '[1,2,3,4,5]', s, c)) AS e) t) cases;
SELECT pg_temp.error_of($$SELECT subvector('[1,2,3,4,5]'::vector, 2147483647, 10)$$) AS start_int_max;
SELECT subvector('[1,2,3,4,5]'::vector, -2147483644, 2147483647) AS wide, subvector('[1,2,3,4,5]'::vector, 3, 2147483647) AS tail;

-- vector_cmp and the comparison operators: the order of real[] (element by
-- element, then the shorter first)
SELECT count(*) FILTER (WHERE vector_cmp(p.a::vector, q.a::vector) <> CASE WHEN p.a < q.a THEN -1 WHEN p.a > q.a THEN 1 ELSE 0 END) AS cmp_wrong,
       count(*) FILTER (WHERE (p.a::vector < q.a::vector) <> (p.a < q.a) OR (p.a::vector = q.a::vector) <> (p.a = q.a)) AS operators_wrong,
       count(*) AS pairs
FROM pairs p, pairs q WHERE p.i % 7 = 0;
SELECT vector_cmp('[1,2]', '[1,2,3]') AS prefix_first, vector_cmp('[2]', '[1,2,3]') AS element_first,
       vector_cmp('[-0]', '[0]') AS minus_zero_equal;

-- Errors, as pgvector's (SQLSTATE: message)
SELECT pg_temp.error_of($$SELECT '[1,2]'::vector + '[3]'$$) AS add_dims,
       pg_temp.error_of($$SELECT '[1,2]'::vector - '[3]'$$) AS sub_dims,
       pg_temp.error_of($$SELECT '[1,2]'::vector * '[3]'$$) AS mul_dims;
SELECT pg_temp.error_of($$SELECT '[3e38]'::vector + '[3e38]'$$) AS add_overflow,
       pg_temp.error_of($$SELECT '[-3e38]'::vector - '[3e38]'$$) AS sub_overflow,
       pg_temp.error_of($$SELECT '[1e37]'::vector * '[1e37]'$$) AS mul_overflow,
       pg_temp.error_of($$SELECT '[1e-37]'::vector * '[1e-37]'$$) AS mul_underflow;
SELECT '[0,1e-37]'::vector * '[5,0]' AS zero_factor_is_no_underflow;
SELECT pg_temp.error_of($$SELECT array_fill(0, ARRAY[16000])::vector || '[1]'$$) AS concat_too_long,
       pg_temp.error_of($$SELECT subvector('[1,2,3]'::vector, 1, 0)$$) AS subvector_count,
       pg_temp.error_of($$SELECT subvector('[1,2,3]'::vector, 4, 1)$$) AS subvector_start;

-- avg and sum: per element, the float8 mean rounded to float4 and the
-- float4 sum (integer elements: every partial sum is exact, so the order
-- of summation, serial or parallel, cannot change them)
CREATE TEMP TABLE vectors AS
SELECT g, i, ARRAY[(i * 7) % 101 - 50, (i * 13) % 37, g - i % 5]::real[] AS r
FROM generate_series(1, 3) g, generate_series(1, 3000) i;
CREATE TEMP VIEW reference AS
SELECT g, array_agg(mean ORDER BY o) AS mean, array_agg(total ORDER BY o) AS total
FROM (SELECT g, o, (sum(x::float8) / count(*))::real AS mean, sum(x) AS total
      FROM vectors, unnest(r) WITH ORDINALITY u(x, o) GROUP BY g, o) e
GROUP BY g;
SELECT count(*) FILTER (WHERE a.mean::real[] = r.mean) AS avg_right,
       count(*) FILTER (WHERE a.total::real[] = r.total) AS sum_right
FROM (SELECT g, avg(r::vector) AS mean, sum(r::vector) AS total FROM vectors GROUP BY g) a
JOIN reference r USING (g);
SELECT avg(v), sum(v) FROM unnest(ARRAY['[1,2,3]'::vector, '[3,5,7]', NULL]) v;
SELECT avg(v) IS NULL AS avg_null, sum(v) IS NULL AS sum_null FROM unnest(ARRAY[]::vector[]) v;
SELECT pg_temp.error_of($$SELECT avg(v) FROM unnest(ARRAY['[1,2]'::vector, '[3]']) v$$) AS avg_dims,
       pg_temp.error_of($$SELECT sum(v) FROM unnest(ARRAY['[1,2]'::vector, '[3]']) v$$) AS sum_dims,
       pg_temp.error_of($$SELECT sum(v) FROM unnest(ARRAY['[3e38]'::vector, '[3e38]']) v$$) AS sum_overflow;
SELECT avg(v) AS large_mean FROM unnest(ARRAY['[3e38]'::vector, '[3e38]']) v;

-- In parallel: partial aggregates in the workers, combined in the leader.
CREATE TABLE parallel_vectors (r real[], v vector(3)) WITH (parallel_workers = 2);
INSERT INTO parallel_vectors SELECT r, r::vector FROM vectors;
ANALYZE parallel_vectors;
SET parallel_setup_cost = 0;
SET parallel_tuple_cost = 0;
SET min_parallel_table_scan_size = 0;
SET max_parallel_workers_per_gather = 2;
EXPLAIN (COSTS OFF) SELECT avg(v), sum(v) FROM parallel_vectors;
CREATE TEMP TABLE parallel_result AS SELECT avg(v) AS mean, sum(v) AS total FROM parallel_vectors;
RESET max_parallel_workers_per_gather;
RESET min_parallel_table_scan_size;
RESET parallel_tuple_cost;
RESET parallel_setup_cost;
SET max_parallel_workers_per_gather = 0;
SELECT p.mean = s.mean AS avg_same, p.total = s.total AS sum_same
FROM parallel_result p, (SELECT avg(v) AS mean, sum(v) AS total FROM parallel_vectors) s;
RESET max_parallel_workers_per_gather;
SELECT a.proname, a.proparallel, g.aggcombinefn <> 0 AS has_combine
FROM pg_aggregate g JOIN pg_proc a ON a.oid = g.aggfnoid
WHERE g.aggtranstype IN ('vector'::regtype, 'float8[]'::regtype)
  AND a.proargtypes[0] = 'vector'::regtype
ORDER BY 1;
DROP TABLE parallel_vectors;

-- The support functions, called directly: the state is {count, sums...}
SELECT vector_accum('{0}', '[1,2,3]') AS first, vector_accum('{1,1,2,3}', '[1,2,3]') AS second,
       vector_combine('{1,1,2}', '{2,3,4}') AS combined, vector_combine('{0}', '{2,3,4}') AS empty_left,
       vector_combine('{2,3,4}', '{0}') AS empty_right, vector_combine('{0}', '{0}') AS both_empty,
       vector_avg('{4,2,4,6}') AS mean, vector_avg('{0}') IS NULL AS no_values;
SELECT pg_temp.error_of($$SELECT vector_accum('{{0}}', '[1,2,3]')$$) AS accum_2d,
       pg_temp.error_of($$SELECT vector_accum('{NULL}', '[1,2,3]')$$) AS accum_null,
       pg_temp.error_of($$SELECT vector_accum('{}', '[1,2,3]')$$) AS accum_empty,
       pg_temp.error_of($$SELECT vector_accum('{0,0}', '[1,2,3]')$$) AS accum_dims;
SELECT pg_temp.error_of($$SELECT vector_combine('{1,2}', '{3,4,5}')$$) AS combine_dims,
       pg_temp.error_of($$SELECT vector_combine('{1,2}', '{3,NULL}')$$) AS combine_null,
       pg_temp.error_of($$SELECT vector_combine('{1,1.7e308}', '{1,1.7e308}')$$) AS combine_overflow,
       pg_temp.error_of($$SELECT vector_combine('{0}', array_fill(1::float8, ARRAY[16002]))$$) AS combine_too_long;
SELECT pg_temp.error_of($$SELECT vector_avg('{1}')$$) AS avg_no_dims,
       pg_temp.error_of($$SELECT vector_avg('{1,Infinity}')$$) AS avg_infinite,
       pg_temp.error_of($$SELECT vector_avg('{1,NaN}')$$) AS avg_nan,
       pg_temp.error_of($$SELECT vector_avg('{1e-300,1}')$$) AS avg_overflow,
       pg_temp.error_of($$SELECT vector_avg(array_fill(1::float8, ARRAY[16002]))$$) AS avg_too_long;

-- pgvector's names for the cast functions, the same as the casts
SELECT array_to_vector(ARRAY[1,2,3], -1, true) AS from_int, array_to_vector('{1.5,2}'::real[], 2, true) AS from_real,
       vector_to_float4('[1,2]', -1, true) AS to_real, vector('[1,2]', 2, true) AS typmod;
SELECT pg_temp.error_of($$SELECT array_to_vector(array_agg(n), 16001, false) FROM generate_series(1, 16001) n$$) AS too_long,
       pg_temp.error_of($$SELECT vector('[1,2]', 3, true)$$) AS typmod_mismatch;

-- every function of this part exists once and belongs to knn_gpu (halfvec's
-- and sparsevec's l2_normalize and subvector are their types' own parts)
SELECT count(*) AS functions,
       count(*) FILTER (WHERE EXISTS (SELECT FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid
                                      WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid
                                        AND d.deptype = 'e' AND e.extname = 'knn_gpu')) AS knn_gpu_members
FROM pg_proc p
WHERE p.proname IN ('l2_normalize', 'subvector', 'vector_cmp', 'vector_accum', 'vector_combine', 'vector_avg',
                    'knn_vector_add', 'knn_vector_sub', 'knn_vector_mul', 'knn_vector_concat',
                    'array_to_vector', 'vector_to_float4', 'vector')
  AND NOT p.proargtypes::oid[] && ARRAY['halfvec'::regtype, 'sparsevec'::regtype]::oid[];
