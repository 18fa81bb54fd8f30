--
-- pgvector's functions of vector as knn_gpu provides them with its own type
-- (extension/sql/16_vector_functions.sql), against the real pgvector in the
-- same database: the same text results, or the same SQLSTATE and message,
-- for random vectors with ordinary, huge, tiny and zero elements. Then the
-- other install order: with pgvector's type in the schema, knn_gpu creates
-- none of these objects. (vector_norm's bits are those of pgvector built as
-- ../shared/pgvector/build.sh builds it, without -march.)
--
CREATE EXTENSION knn_gpu;
CREATE SCHEMA pgv;
CREATE EXTENSION vector SCHEMA pgv;

-- a statement's result as text, or its error as 'SQLSTATE: message'
CREATE FUNCTION pg_temp.result_of(statement text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE r text;
BEGIN
  EXECUTE statement INTO r;
  RETURN coalesce(r, 'NULL');
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

SELECT setseed(0.5);
CREATE TEMP TABLE samples AS
SELECT i, '[' || string_agg(CASE (random() * 40)::int
                              WHEN 0 THEN (random() * 1e38)::real::text
                              WHEN 1 THEN (-random() * 3e38)::real::text
                              WHEN 2 THEN (random() * 1e-37)::real::text
                              WHEN 3 THEN (random() * 1e-40)::real::text
                              WHEN 4 THEN '0'
                              ELSE round((random() * 20 - 10)::numeric, 2)::text END, ',') || ']' AS t
FROM generate_series(1, 240) i, LATERAL generate_series(1, 1 + i % 9 + (i % 5) * (i % 5) * 3) j
GROUP BY i;
SELECT count(*) AS samples, min(vector_dims(t::vector)) AS min_dims, max(vector_dims(t::vector)) AS max_dims FROM samples;

-- binary operators on pairs of samples (some of the same, some of different dimensions)
SELECT op, count(*) AS pairs,
       count(*) FILTER (WHERE pg_temp.result_of(format('SELECT (%L::vector %s %L::vector)::text', a.t, op, b.t))
                          <> pg_temp.result_of(format('SELECT (%L::pgv.vector OPERATOR(pgv.%s) %L::pgv.vector)::text', a.t, op, b.t))) AS differing,
       count(*) FILTER (WHERE pg_temp.result_of(format('SELECT (%L::vector %s %L::vector)::text', a.t, op, b.t)) LIKE '2%') AS errors
FROM samples a JOIN samples b ON vector_dims(a.t::vector) = vector_dims(b.t::vector) OR b.i = a.i + 1,
     unnest(ARRAY['+', '-', '*', '||']) op
GROUP BY op ORDER BY op;
SELECT count(*) AS pairs,
       count(*) FILTER (WHERE vector_cmp(a.t::vector, b.t::vector) <> pgv.vector_cmp(a.t::pgv.vector, b.t::pgv.vector)) AS cmp_differing
FROM samples a JOIN samples b ON b.i % 23 = a.i % 23;

-- functions of one vector
SELECT count(*) AS samples,
       count(*) FILTER (WHERE vector_norm(t::vector) <> pgv.vector_norm(t::pgv.vector)) AS norm_differing,
       count(*) FILTER (WHERE pg_temp.result_of(format('SELECT l2_normalize(%L::vector)::text', t))
                          <> pg_temp.result_of(format('SELECT pgv.l2_normalize(%L::pgv.vector)::text', t))) AS normalize_differing
FROM samples;
SELECT count(*) AS cases,
       count(*) FILTER (WHERE pg_temp.result_of(format('SELECT subvector(%L::vector, %s, %s)::text', t, s, c))
                          <> pg_temp.result_of(format('SELECT pgv.subvector(%L::pgv.vector, %s, %s)::text', t, s, c))) AS subvector_differing
FROM samples, unnest(ARRAY[-2147483644, -1, 0, 1, 2, 5, 9, 2147483647]) s, unnest(ARRAY[-1, 0, 1, 3, 8, 2147483647]) c
WHERE i % 4 = 0;
-- longer random vectors (every summation block and tail length)
SELECT count(*) AS vectors,
       count(*) FILTER (WHERE vector_norm(v::text::vector) <> pgv.vector_norm(v)) AS norm_differing,
       count(*) FILTER (WHERE l2_normalize(v::text::vector)::text <> pgv.l2_normalize(v)::text) AS normalize_differing
FROM (SELECT (SELECT array_agg((random() * 2 - 1)::real) FROM generate_series(1, 1 + i % 700) WHERE i > 0)::pgv.vector AS v
      FROM generate_series(1, 1500) i) s;

-- aggregates, over groups that sometimes mix dimensions or overflow
SELECT count(*) AS groups,
       count(*) FILTER (WHERE pg_temp.result_of(format('SELECT avg(x::vector)::text FROM unnest(%L::text[]) x', ts))
                          <> pg_temp.result_of(format('SELECT pgv.avg(x::pgv.vector)::text FROM unnest(%L::text[]) x', ts))) AS avg_differing,
       count(*) FILTER (WHERE pg_temp.result_of(format('SELECT sum(x::vector)::text FROM unnest(%L::text[]) x', ts))
                          <> pg_temp.result_of(format('SELECT pgv.sum(x::pgv.vector)::text FROM unnest(%L::text[]) x', ts))) AS sum_differing,
       count(*) FILTER (WHERE pg_temp.result_of(format('SELECT avg(x::vector)::text FROM unnest(%L::text[]) x', ts)) NOT LIKE '2%') AS avg_results
FROM (SELECT array_agg(t ORDER BY i) AS ts FROM samples GROUP BY vector_dims(t::vector), i % 3
      UNION ALL SELECT array_agg(t ORDER BY i) FROM samples GROUP BY i % 40) g;
-- the support functions on states of every shape
SELECT count(*) AS cases,
       count(*) FILTER (WHERE pg_temp.result_of(format('SELECT vector_accum(%L, %L::vector)::text', s, v))
                          <> pg_temp.result_of(format('SELECT pgv.vector_accum(%L, %L::pgv.vector)::text', s, v))
                       OR pg_temp.result_of(format('SELECT vector_combine(%L, %L)::text', s, s2))
                          <> pg_temp.result_of(format('SELECT pgv.vector_combine(%L, %L)::text', s, s2))
                       OR pg_temp.result_of(format('SELECT vector_avg(%L)::text', s))
                          <> pg_temp.result_of(format('SELECT pgv.vector_avg(%L)::text', s))) AS differing
FROM unnest(ARRAY['{0}', '{1}', '{2,2,4,6}', '{3,1,2}', '{{1,2}}', '{NULL,1}', '{}', '{1,Infinity}', '{1,NaN}',
                  '{1e-300,1}', '{1,1.7e308,0,0}', '{-1,2,3}']) s,
     unnest(ARRAY['{0}', '{1,2}', '{1,3,4,5}', '{2,1.7e308,1,1}', '{1,NULL}', '{}']) s2,
     unnest(ARRAY['[1,2,3]', '[3e38]', '[1,2]']) v;

-- In the other order, pgvector's type in the schema: knn_gpu creates
-- none of these functions, and ||, avg and sum are pgvector's.
DROP EXTENSION vector;
DROP SCHEMA pgv;
DROP EXTENSION knn_gpu;
CREATE EXTENSION vector;
CREATE EXTENSION knn_gpu;
SELECT e.extname, count(*) AS functions
FROM pg_proc p JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
JOIN pg_extension e ON e.oid = d.refobjid
WHERE p.proname IN ('l2_normalize', 'subvector', 'vector_cmp', 'vector_accum', 'vector_combine', 'vector_avg',
                    'knn_vector_add', 'knn_vector_sub', 'knn_vector_mul', 'knn_vector_concat',
                    'array_to_vector', 'vector_to_float4', 'vector', 'avg', 'sum')
GROUP BY 1 ORDER BY 1;
SELECT '[1,2]'::vector || '[3]' AS concat, avg(v), sum(v) FROM unnest(ARRAY['[1,2]'::vector, '[3,4]']) v;
DROP EXTENSION knn_gpu;
DROP EXTENSION vector;
