--
-- knn_gpu's own halfvec (extension/sql/12_halfvec.sql, 18_halfvec_functions.sql)
-- against the real pgvector's in the same database (pgvector in schema pgv):
-- the same catalogue (functions, operators, aggregates, casts and their
-- contexts, the btree class), and the same text results, or the same
-- SQLSTATE and message, for random halfvecs with ordinary, huge, tiny and
-- zero elements. Then the other install order: with pgvector's types in
-- the schema, knn_gpu creates none of its halfvec objects. (l2_norm's
-- bits are those of pgvector built as ../shared/pgvector/build.sh builds it,
-- without -march.) The distances are not compared here: knn_gpu's follow
-- its engine's canonical sums (sql/halfvec.sql).
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

-- ---- the catalogue: each extension's halfvec objects (sparsevec's and the
-- index access methods' aside), with pgv. taken out of the type names
CREATE TEMP TABLE halfvec_objects AS
WITH members AS (
  SELECT e.extname, d.classid, d.objid
  FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid
  WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e' AND e.extname IN ('knn_gpu', 'vector')
), described AS (
  SELECT m.extname, 'function' AS kind,
         format('%s(%s) -> %s kind %s volatility %s strict %s parallel %s', p.proname,
                pg_get_function_identity_arguments(p.oid), format_type(p.prorettype, NULL),
                p.prokind, p.provolatile, p.proisstrict, p.proparallel) AS object
  FROM members m JOIN pg_proc p ON m.classid = 'pg_proc'::regclass AND p.oid = m.objid
  WHERE (format_type(p.prorettype, NULL) || pg_get_function_identity_arguments(p.oid) LIKE '%halfvec%'
         OR p.proname LIKE 'halfvec%')
    AND format_type(p.prorettype, NULL) || pg_get_function_identity_arguments(p.oid) NOT LIKE '%sparsevec%'
    AND p.proname NOT LIKE '%\_support'
  UNION ALL
  SELECT m.extname, 'operator',
         format('%s(%s, %s) -> %s commutator %s negator %s %s %s', o.oprname, format_type(o.oprleft, NULL),
                format_type(o.oprright, NULL), format_type(o.oprresult, NULL),
                (SELECT oprname FROM pg_operator WHERE oid = o.oprcom),
                (SELECT oprname FROM pg_operator WHERE oid = o.oprnegate), o.oprrest, o.oprjoin)
  FROM members m JOIN pg_operator o ON m.classid = 'pg_operator'::regclass AND o.oid = m.objid
  WHERE format_type(o.oprleft, NULL) = 'halfvec' OR format_type(o.oprleft, NULL) = 'pgv.halfvec'
  UNION ALL
  SELECT m.extname, 'cast',
         format('%s -> %s %s %s', format_type(c.castsource, NULL), format_type(c.casttarget, NULL),
                c.castcontext, c.castmethod)
  FROM members m JOIN pg_cast c ON m.classid = 'pg_cast'::regclass AND c.oid = m.objid
  WHERE format_type(c.castsource, NULL) || format_type(c.casttarget, NULL) LIKE '%halfvec%'
    AND format_type(c.castsource, NULL) || format_type(c.casttarget, NULL) NOT LIKE '%sparsevec%'
  UNION ALL
  SELECT m.extname, 'operator class',
         format('%s for %s using %s default %s', c.opcname, format_type(c.opcintype, NULL), a.amname, c.opcdefault)
  FROM members m JOIN pg_opclass c ON m.classid = 'pg_opclass'::regclass AND c.oid = m.objid
  JOIN pg_am a ON a.oid = c.opcmethod
  WHERE format_type(c.opcintype, NULL) LIKE '%halfvec' AND a.amname = 'btree'
)
SELECT extname, kind, replace(object, 'pgv.', '') AS object FROM described;
SELECT extname, kind, count(*) FROM halfvec_objects GROUP BY 1, 2 ORDER BY 1, 2;
-- pgvector's that knn_gpu lacks: only the type's I/O functions, which
-- knn_gpu names knn_halfvec_in ... knn_halfvec_send
SELECT kind, object AS only_pgvector FROM halfvec_objects WHERE extname = 'vector'
EXCEPT SELECT kind, object FROM halfvec_objects WHERE extname = 'knn_gpu' ORDER BY 1, 2;
-- knn_gpu's that pgvector lacks, its knn_* functions aside
SELECT kind, object AS only_knn_gpu FROM halfvec_objects WHERE extname = 'knn_gpu' AND object NOT LIKE 'knn\_%'
EXCEPT SELECT kind, object FROM halfvec_objects WHERE extname = 'vector' ORDER BY 1, 2;

-- ---- values: random halfvecs of 1..57 dimensions
SELECT setseed(0.5);
CREATE TEMP TABLE samples AS
SELECT i, '[' || string_agg(CASE (random() * 40)::int
                              WHEN 0 THEN round((random() * 65504)::numeric)::text
                              WHEN 1 THEN round((-random() * 65504)::numeric)::text
                              WHEN 2 THEN (random() * 1e-4)::real::text
                              WHEN 3 THEN (random() * 1e-7)::real::text
                              WHEN 4 THEN '0'
                              WHEN 5 THEN '-0'
                              WHEN 6 THEN round((random() * 600 - 300)::numeric, 1)::text
                              ELSE round((random() * 20 - 10)::numeric, 3)::text END, ',') || ']' AS t
FROM generate_series(1, 240) i, LATERAL generate_series(1, 1 + i % 9 + (i % 5) * (i % 5) * 3) j
GROUP BY i;
SELECT count(*) AS samples, min(vector_dims(t::halfvec)) AS min_dims, max(vector_dims(t::halfvec)) AS max_dims FROM samples;

-- binary operators on pairs of samples (some of the same, some of different dimensions)
SELECT op, count(*) AS pairs,
       count(*) FILTER (WHERE pg_temp.result_of(format('SELECT (%L::halfvec %s %L::halfvec)::text', a.t, op, b.t))
                          <> pg_temp.result_of(format('SELECT (%L::pgv.halfvec OPERATOR(pgv.%s) %L::pgv.halfvec)::text', a.t, op, b.t))) AS differing,
       count(*) FILTER (WHERE pg_temp.result_of(format('SELECT (%L::halfvec %s %L::halfvec)::text', a.t, op, b.t)) LIKE '2%') AS errors
FROM samples a JOIN samples b ON vector_dims(a.t::halfvec) = vector_dims(b.t::halfvec) OR b.i = a.i + 1,
     unnest(ARRAY['+', '-', '*', '||', '<', '<=', '=', '<>', '>=', '>']) op
GROUP BY op ORDER BY op;
SELECT count(*) AS pairs,
       count(*) FILTER (WHERE halfvec_cmp(a.t::halfvec, b.t::halfvec) <> pgv.halfvec_cmp(a.t::pgv.halfvec, b.t::pgv.halfvec)) AS cmp_differing
FROM samples a JOIN samples b ON b.i % 23 = a.i % 23;
-- the btree class: the same order (and equal groups) as pgvector's
SELECT (SELECT array_agg(t ORDER BY t::halfvec, i) FROM samples)
     = (SELECT array_agg(t ORDER BY t::pgv.halfvec, i) FROM samples) AS same_order,
       (SELECT count(DISTINCT t::halfvec) FROM samples) AS distinct_values,
       (SELECT count(DISTINCT t::pgv.halfvec) FROM samples) AS pgvector_distinct_values;

-- functions of one halfvec
SELECT count(*) AS samples,
       count(*) FILTER (WHERE l2_norm(t::halfvec) <> pgv.l2_norm(t::pgv.halfvec)) AS norm_differing,
       count(*) FILTER (WHERE pg_temp.result_of(format('SELECT l2_normalize(%L::halfvec)::text', t))
                          <> pg_temp.result_of(format('SELECT pgv.l2_normalize(%L::pgv.halfvec)::text', t))) AS normalize_differing,
       count(*) FILTER (WHERE binary_quantize(t::halfvec)::text <> pgv.binary_quantize(t::pgv.halfvec)::text) AS quantize_differing,
       count(*) FILTER (WHERE halfvec_to_float4(t::halfvec, -1, true)::text <> pgv.halfvec_to_float4(t::pgv.halfvec, -1, true)::text
                           OR halfvec_to_vector(t::halfvec, -1, true)::text <> pgv.halfvec_to_vector(t::pgv.halfvec, -1, true)::text) AS casts_differing
FROM samples;
SELECT count(*) AS cases,
       count(*) FILTER (WHERE pg_temp.result_of(format('SELECT subvector(%L::halfvec, %s, %s)::text', t, s, c))
                          <> pg_temp.result_of(format('SELECT pgv.subvector(%L::pgv.halfvec, %s, %s)::text', t, s, c))) AS subvector_differing
FROM samples, unnest(ARRAY[-2147483644, -1, 0, 1, 2, 5, 9, 2147483647]) s, unnest(ARRAY[-1, 0, 1, 3, 8, 2147483647]) c
WHERE i % 4 = 0;
-- longer random halfvecs (l2_norm's summation order over many elements)
SELECT count(*) AS halfvecs,
       count(*) FILTER (WHERE l2_norm(v::text::halfvec) <> pgv.l2_norm(v)) AS norm_differing,
       count(*) FILTER (WHERE l2_normalize(v::text::halfvec)::text <> pgv.l2_normalize(v)::text) AS normalize_differing
FROM (SELECT (SELECT array_agg((random() * 2 - 1)::real) FROM generate_series(1, 1 + i % 700) WHERE i > 0)::pgv.halfvec AS v
      FROM generate_series(1, 1500) i) s;

-- conversions into halfvec: rounding, range and typmod errors
SELECT count(*) AS cases,
       count(*) FILTER (WHERE pg_temp.result_of(format('SELECT vector_to_halfvec(%L::vector, %s, true)::text', x, m))
                          <> pg_temp.result_of(format('SELECT pgv.vector_to_halfvec(%L::pgv.vector, %s, true)::text', x, m))
                       OR pg_temp.result_of(format('SELECT array_to_halfvec(%L::float8[], %s, true)::text', a, m))
                          <> pg_temp.result_of(format('SELECT pgv.array_to_halfvec(%L::float8[], %s, true)::text', a, m))
                       OR pg_temp.result_of(format('SELECT halfvec(%L::halfvec, %s, true)::text', x, m))
                          <> pg_temp.result_of(format('SELECT pgv.halfvec(%L::pgv.halfvec, %s, true)::text', x, m))) AS differing
FROM (SELECT '[' || btrim(a, '{}') || ']' AS x, a
      FROM unnest(ARRAY['{1,2,3}', '{65504,-65504,0.1}', '{65519,1,2}', '{65520,1,2}', '{1e-8,6e-8,3e-8}',
                        '{4e38,1,1}', '{0.333333,1e-5,-2.5e-7}', '{1,NaN,2}', '{Infinity,1}']) a) inputs,
     unnest(ARRAY[-1, 2, 3]) m;

-- aggregates, over groups that sometimes mix dimensions or overflow
SELECT count(*) AS groups,
       count(*) FILTER (WHERE pg_temp.result_of(format('SELECT avg(x::halfvec)::text FROM unnest(%L::text[]) x', ts))
                          <> pg_temp.result_of(format('SELECT pgv.avg(x::pgv.halfvec)::text FROM unnest(%L::text[]) x', ts))) AS avg_differing,
       count(*) FILTER (WHERE pg_temp.result_of(format('SELECT sum(x::halfvec)::text FROM unnest(%L::text[]) x', ts))
                          <> pg_temp.result_of(format('SELECT pgv.sum(x::pgv.halfvec)::text FROM unnest(%L::text[]) x', ts))) AS sum_differing,
       count(*) FILTER (WHERE pg_temp.result_of(format('SELECT avg(x::halfvec)::text FROM unnest(%L::text[]) x', ts)) NOT LIKE '2%') AS avg_results,
       count(*) FILTER (WHERE pg_temp.result_of(format('SELECT sum(x::halfvec)::text FROM unnest(%L::text[]) x', ts)) NOT LIKE '2%') AS sum_results
FROM (SELECT array_agg(t ORDER BY i) AS ts FROM samples GROUP BY vector_dims(t::halfvec), i % 3
      UNION ALL SELECT array_agg(t ORDER BY i) FROM samples GROUP BY i % 40) g;
-- the support functions on states of every shape
SELECT count(*) AS cases,
       count(*) FILTER (WHERE pg_temp.result_of(format('SELECT halfvec_accum(%L, %L::halfvec)::text', s, v))
                          <> pg_temp.result_of(format('SELECT pgv.halfvec_accum(%L, %L::pgv.halfvec)::text', s, v))
                       OR pg_temp.result_of(format('SELECT halfvec_combine(%L, %L)::text', s, s2))
                          <> pg_temp.result_of(format('SELECT pgv.halfvec_combine(%L, %L)::text', s, s2))
                       OR pg_temp.result_of(format('SELECT halfvec_avg(%L)::text', s))
                          <> pg_temp.result_of(format('SELECT pgv.halfvec_avg(%L)::text', s))) AS differing
FROM unnest(ARRAY['{0}', '{1}', '{2,2,4,6}', '{3,1,2}', '{{1,2}}', '{NULL,1}', '{}', '{1,Infinity}', '{1,NaN}',
                  '{1e-300,1}', '{1,1.7e308,0,0}', '{-1,2,3}', '{2,131070,1,1}', '{3,1e-7,1,1}']) s,
     unnest(ARRAY['{0}', '{1,2}', '{1,3,4,5}', '{2,1.7e308,1,1}', '{1,NULL}', '{}']) s2,
     unnest(ARRAY['[1,2,3]', '[65504]', '[1,2]']) v;

-- In the other order, pgvector's types in the schema: knn_gpu creates none
-- of its halfvec objects, and the operators and aggregates are pgvector's.
DROP EXTENSION vector;
DROP SCHEMA pgv;
DROP EXTENSION knn_gpu;
CREATE EXTENSION vector;
CREATE EXTENSION knn_gpu;
SELECT e.extname, count(*) AS halfvec_functions
FROM pg_proc p JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
JOIN pg_extension e ON e.oid = d.refobjid
WHERE format_type(p.prorettype, NULL) || pg_get_function_identity_arguments(p.oid) LIKE '%halfvec%'
   OR p.proname LIKE 'halfvec%'
GROUP BY 1 ORDER BY 1;
SELECT '[1,2]'::halfvec || '[3]' AS concat, '[1,2]'::halfvec < '[1,3]' AS less, avg(v), sum(v)
FROM unnest(ARRAY['[1,2]'::halfvec, '[3,4]']) v;
DROP EXTENSION knn_gpu;
DROP EXTENSION vector;
