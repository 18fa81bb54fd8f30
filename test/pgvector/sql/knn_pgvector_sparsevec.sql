--
-- knn_gpu's own sparsevec (extension/sql/13_sparsevec.sql) against the real
-- pgvector's in the same database (pgvector in schema pgv): the same
-- catalogue (functions, operators, casts and their contexts, the btree
-- class), the same stored bytes (each type reads the other's datums), the
-- same binary form (COPY BINARY files move between the two), the same text
-- results or the same SQLSTATE and message, and bit-identical distances and
-- norms (pgvector built as ../shared/pgvector/build.sh builds it, without
-- -march). Then the other install order: with pgvector's types in the
-- schema, knn_gpu creates none of its sparsevec objects.
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

-- ---- the catalogue: every object of either extension that involves
-- sparsevec (pgvector's hnsw classes and their support function aside),
-- with pgv. taken out of the type names
CREATE TEMP TABLE sparsevec_objects AS
WITH members AS (
  SELECT e.extname, d.classid, d.objid
  FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid
  WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e' AND e.extname IN ('knn_gpu', 'vector')
), objects AS (
  SELECT m.extname, 'function' AS kind,
         format('%s(%s) -> %s volatility %s strict %s parallel %s', p.proname,
                pg_get_function_identity_arguments(p.oid), format_type(p.prorettype, NULL),
                p.provolatile, p.proisstrict, p.proparallel) AS object
  FROM members m JOIN pg_proc p ON m.classid = 'pg_proc'::regclass AND p.oid = m.objid
  WHERE format_type(p.prorettype, NULL) || pg_get_function_identity_arguments(p.oid) LIKE '%sparsevec%'
  UNION ALL
  SELECT m.extname, 'operator',
         format('%s(%s, %s) -> %s function %s commutator %s negator %s %s %s', o.oprname,
                format_type(o.oprleft, NULL), format_type(o.oprright, NULL), format_type(o.oprresult, NULL),
                (SELECT proname FROM pg_proc WHERE oid = o.oprcode),
                (SELECT oprname FROM pg_operator WHERE oid = o.oprcom),
                (SELECT oprname FROM pg_operator WHERE oid = o.oprnegate), o.oprrest, o.oprjoin)
  FROM members m JOIN pg_operator o ON m.classid = 'pg_operator'::regclass AND o.oid = m.objid
  WHERE format_type(o.oprleft, NULL) LIKE '%sparsevec'
  UNION ALL
  SELECT m.extname, 'cast',
         format('%s -> %s context %s method %s', format_type(c.castsource, NULL), format_type(c.casttarget, NULL),
                c.castcontext, c.castmethod)
  FROM members m JOIN pg_cast c ON m.classid = 'pg_cast'::regclass AND c.oid = m.objid
  WHERE format_type(c.castsource, NULL) || format_type(c.casttarget, NULL) LIKE '%sparsevec%'
  UNION ALL
  SELECT m.extname, 'operator class',
         format('%s for %s using %s default %s', c.opcname, format_type(c.opcintype, NULL), a.amname, c.opcdefault)
  FROM members m JOIN pg_opclass c ON m.classid = 'pg_opclass'::regclass AND c.oid = m.objid
  JOIN pg_am a ON a.oid = c.opcmethod
  WHERE format_type(c.opcintype, NULL) LIKE '%sparsevec'
  UNION ALL
  SELECT m.extname, 'type',
         format('%s length %s alignment %s storage %s', t.typname, t.typlen, t.typalign, t.typstorage)
  FROM members m JOIN pg_type t ON m.classid = 'pg_type'::regclass AND t.oid = m.objid
  WHERE t.typname = 'sparsevec'
)
SELECT extname, kind, replace(object, 'pgv.', '') AS object FROM objects
WHERE object NOT LIKE 'hnsw%' AND object NOT LIKE '% using hnsw %';
SELECT extname, kind, count(*) FROM sparsevec_objects GROUP BY 1, 2 ORDER BY 1, 2;
-- pgvector's that knn_gpu lacks: only the type's I/O functions (knn_gpu's
-- are knn_sparsevec_in ... knn_sparsevec_send)
SELECT kind, object AS only_pgvector FROM sparsevec_objects WHERE extname = 'vector'
EXCEPT SELECT kind, object FROM sparsevec_objects WHERE extname = 'knn_gpu' ORDER BY 1, 2;
SELECT kind, object AS only_knn_gpu FROM sparsevec_objects WHERE extname = 'knn_gpu'
EXCEPT SELECT kind, object FROM sparsevec_objects WHERE extname = 'vector' ORDER BY 1, 2;

-- ---- random values: 1 to 1000 dimensions, 0 to all of them stored,
-- values of every magnitude (their shortest text reads back exactly)
SELECT setseed(0.25);
CREATE TEMP TABLE samples AS
SELECT i, dim,
       '{' || coalesce((SELECT string_agg(j || ':' || ((random() - 0.5) * 10 ^ (random() * 8 - 4))::real::text, ',' ORDER BY j)
                        FROM generate_series(1, dim) j WHERE random() < density AND i > 0), '') || '}/' || dim AS t
FROM generate_series(1, 1200) i,
     LATERAL (SELECT (ARRAY[1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 17, 33, 64, 100, 1000])[1 + i % 16] AS dim,
                     (ARRAY[0.1, 0.5, 0.9, 1.0])[1 + (i / 16) % 4] AS density) d;
SELECT count(*) AS samples, count(DISTINCT dim) AS dimension_counts,
       count(*) FILTER (WHERE t LIKE '{}%') AS empty, max(length(t)) > 10000 AS some_long
FROM samples;

-- text and binary forms, and the stored bytes: a binary-coercible cast
-- reads one extension's datum as the other's type, unconverted
CREATE CAST (sparsevec AS pgv.sparsevec) WITHOUT FUNCTION;
CREATE CAST (pgv.sparsevec AS sparsevec) WITHOUT FUNCTION;
SELECT count(*) AS samples,
       count(*) FILTER (WHERE t::sparsevec::text <> t::pgv.sparsevec::text) AS text_differing,
       count(*) FILTER (WHERE knn_sparsevec_send(t::sparsevec) <> pgv.sparsevec_send(t::pgv.sparsevec)) AS binary_differing,
       count(*) FILTER (WHERE t::sparsevec::pgv.sparsevec::text <> t::pgv.sparsevec::text
                           OR t::pgv.sparsevec::sparsevec::text <> t::sparsevec::text) AS stored_differing,
       count(*) FILTER (WHERE pg_column_size(t::sparsevec) <> pg_column_size(t::pgv.sparsevec)) AS size_differing
FROM samples;
DROP CAST (sparsevec AS pgv.sparsevec);
DROP CAST (pgv.sparsevec AS sparsevec);

-- COPY BINARY both ways through a file in the data directory (server-side
-- COPY, as the superuser that runs the tests); a sparsevec(n) column checks
-- the typmod on receive
CREATE TEMP TABLE knn_side (i int, v sparsevec);
CREATE TEMP TABLE pgv_side (i int, v pgv.sparsevec);
CREATE TEMP TABLE knn_typmod (i int, v sparsevec(5));
CREATE FUNCTION pg_temp.copy_file() RETURNS text LANGUAGE sql AS
  $$ SELECT current_setting('data_directory') || '/knn_pgvector_sparsevec.copy' $$;
INSERT INTO knn_side SELECT i, t::sparsevec FROM samples;
DO $$
BEGIN
  EXECUTE format('COPY knn_side TO %L (FORMAT binary)', pg_temp.copy_file());
  EXECUTE format('COPY pgv_side FROM %L (FORMAT binary)', pg_temp.copy_file());
  EXECUTE format('COPY pgv_side TO %L (FORMAT binary)', pg_temp.copy_file());
  TRUNCATE knn_side;
  EXECUTE format('COPY knn_side FROM %L (FORMAT binary)', pg_temp.copy_file());
END $$;
SELECT count(*) AS rows,
       count(*) FILTER (WHERE k.v::text <> s.t OR p.v::text <> s.t) AS differing
FROM samples s JOIN knn_side k USING (i) JOIN pgv_side p USING (i);
SELECT pg_temp.result_of(format('COPY knn_typmod FROM %L (FORMAT binary)', pg_temp.copy_file())) AS typmod_checked;
DROP TABLE knn_side, pgv_side, knn_typmod;

-- distances, bit for bit, on pairs of samples of one dimension count
-- (both orders: which operand runs out first changes the summation)
SELECT count(*) AS pairs,
       count(*) FILTER (WHERE float8send(l2_distance(a.t::sparsevec, b.t::sparsevec))
                              <> float8send(pgv.l2_distance(a.t::pgv.sparsevec, b.t::pgv.sparsevec))) AS l2,
       count(*) FILTER (WHERE float8send(sparsevec_l2_squared_distance(a.t::sparsevec, b.t::sparsevec))
                              <> float8send(pgv.sparsevec_l2_squared_distance(a.t::pgv.sparsevec, b.t::pgv.sparsevec))) AS l2_squared,
       count(*) FILTER (WHERE float8send(inner_product(a.t::sparsevec, b.t::sparsevec))
                              <> float8send(pgv.inner_product(a.t::pgv.sparsevec, b.t::pgv.sparsevec))) AS inner_product,
       count(*) FILTER (WHERE float8send(a.t::sparsevec <#> b.t::sparsevec)
                              <> float8send(a.t::pgv.sparsevec OPERATOR(pgv.<#>) b.t::pgv.sparsevec)) AS negative_inner_product,
       count(*) FILTER (WHERE float8send(cosine_distance(a.t::sparsevec, b.t::sparsevec))
                              <> float8send(pgv.cosine_distance(a.t::pgv.sparsevec, b.t::pgv.sparsevec))) AS cosine,
       count(*) FILTER (WHERE float8send(l1_distance(a.t::sparsevec, b.t::sparsevec))
                              <> float8send(pgv.l1_distance(a.t::pgv.sparsevec, b.t::pgv.sparsevec))) AS l1
FROM samples a JOIN samples b ON a.dim = b.dim AND a.i <> b.i AND (a.i * 7 + b.i) % 11 = 0;
SELECT pg_temp.result_of($$SELECT '{1:1}/2'::sparsevec <-> '{1:1}/3'$$) AS knn_gpu,
       pg_temp.result_of($$SELECT '{1:1}/2'::pgv.sparsevec OPERATOR(pgv.<->) '{1:1}/3'$$) AS pgvector;

-- the btree order, equality and functions of one value
SELECT count(*) AS pairs,
       count(*) FILTER (WHERE sparsevec_cmp(a.t::sparsevec, b.t::sparsevec)
                              <> pgv.sparsevec_cmp(a.t::pgv.sparsevec, b.t::pgv.sparsevec)) AS cmp_differing
FROM samples a JOIN samples b ON (a.i * 13 + b.i) % 31 = 0;
SELECT (SELECT array_agg(i ORDER BY t::sparsevec, i) FROM samples)
     = (SELECT array_agg(i ORDER BY t::pgv.sparsevec, i) FROM samples) AS same_order;
SELECT count(*) AS samples,
       count(*) FILTER (WHERE float8send(l2_norm(t::sparsevec)) <> float8send(pgv.l2_norm(t::pgv.sparsevec))) AS norm_differing,
       count(*) FILTER (WHERE l2_normalize(t::sparsevec)::text <> pgv.l2_normalize(t::pgv.sparsevec)::text) AS normalize_differing,
       count(*) FILTER (WHERE pg_temp.result_of(format('SELECT %L::sparsevec::vector::text', t))
                              <> pg_temp.result_of(format('SELECT %L::pgv.sparsevec::pgv.vector::text', t))
                           OR pg_temp.result_of(format('SELECT %L::sparsevec::halfvec::text', t))
                              <> pg_temp.result_of(format('SELECT %L::pgv.sparsevec::pgv.halfvec::text', t))) AS to_dense_differing
FROM samples;

-- ---- inputs that are not quite right: the same value, or the same error
SELECT count(*) AS inputs,
       count(*) FILTER (WHERE pg_temp.result_of(format('SELECT %L::sparsevec::text', s))
                              <> pg_temp.result_of(format('SELECT %L::pgv.sparsevec::text', s))) AS differing,
       count(*) FILTER (WHERE pg_temp.result_of(format('SELECT %L::sparsevec::text', s)) ~ '^[0-9A-Z]{5}: ') AS errors
FROM unnest(ARRAY['{1:1,2:2}/2', ' {1 :1, 2: 2 } /2 ', E'\t{\n1:1\r}\f/\x0B3', '{}/1', '{ }/7', '{}/0', '{}/-1',
                  '{1:0}/1', '{0:0}/1', '{0:1}/1', '{3:1}/2', '{2:1,1:1}/2', '{1:1,1:2}/3', '{1:1,1:0}/3',
                  '{1:1,2:2,3:3}/2', '{1:1,1:1,1:1}/2', '{+1:1}/1', '{-1:1}/1', '{1:+1.5}/1', '{1:-0}/1',
                  '{1:1e-46}/1', '{1:-1e-46}/1', '{1:1e-45}/1', '{1:7e-46}/1', '{1:3.4028235e38}/1', '{1:3.5e38}/1',
                  '{1:0x1p-3}/1', '{1:inf}/1', '{1:-Infinity}/1', '{1:nan}/1', '{1:NaN()}/1', '{1:1}', '{1:1}/',
                  '{1:1}/2x', '{1:1}/ 2 ', '{1:1}/+2', '{1:1}/0x10', '{1:1}//2', '{1:1,}/2', '{,1:1}/2',
                  '{1::1}/2', '{1:1:1}/2', '{1 1:1}/2', '{1:1 1}/2', '1:1}/2', '{1:1/2', '[1,2]', '',
                  '{2147483647:1}/1000000000', '{1000000000:1}/1000000000', '{1:1}/1000000001',
                  '{1:1}/99999999999999999999', '{99999999999999999999:1}/5', '{-99999999999999999999:1}/5',
                  '{1:1,' || repeat(',', 16000) || '}/2', repeat(' ', 5) || '{}/3' || repeat(' ', 5)]) s;
-- random edits of valid texts (1..3 pieces inserted or characters deleted
-- at random places): the same value, or the same error
SELECT setseed(0.75);
CREATE TEMP TABLE mutated AS
WITH RECURSIVE edits(n, s, step) AS (
  SELECT n, (ARRAY['{1:1,3:-2.5}/5', ' { 2 : 0.5 , 1 : 3e2 } / 3 ', '{}/1', '{1:0,2:1}/2', '{10:1,9:2,8:3}/10',
                   '{5:1.5e-38,1:-3.4028235e38,3:0x1p-3}/1000000000'])[1 + n % 6], 0
  FROM generate_series(1, 3000) n
  UNION ALL
  SELECT n, CASE WHEN random() < 0.6
                 THEN overlay(s PLACING (ARRAY['0', '1', '9', '.', 'e', 'e-', '-', '+', '{', '}', ':', ',', '/', ' ',
                                               E'\t', 'nan', 'inf', '0x', 'p', 'a', 'e39', 'e-46', '2147483648',
                                               '99999999999999999999', '1000000001'])[1 + floor(random() * 25)::int]
                      FROM 1 + floor(random() * (length(s) + 1))::int FOR 0)
                 ELSE overlay(s PLACING '' FROM 1 + floor(random() * (length(s) + 1))::int FOR 1 + floor(random() * 2)::int) END,
         step + 1
  FROM edits WHERE step < 1 + n % 3
)
SELECT n, s FROM edits WHERE step = 1 + n % 3;
SELECT count(*) AS texts, count(DISTINCT s) AS distinct_texts,
       count(*) FILTER (WHERE pg_temp.result_of(format('SELECT %L::sparsevec::text', s))
                              <> pg_temp.result_of(format('SELECT %L::pgv.sparsevec::text', s))) AS differing,
       count(*) FILTER (WHERE pg_temp.result_of(format('SELECT %L::sparsevec::text', s)) !~ '^[0-9A-Z]{5}: ') AS accepted
FROM mutated;

SELECT count(*) AS cases,
       count(*) FILTER (WHERE pg_temp.result_of(format('SELECT %s(%L::%s, %s, true)::text', f, x, ty, m))
                              <> pg_temp.result_of(format('SELECT pgv.%s(%L::%s, %s, true)::text', f, x,
                                                          CASE WHEN ty LIKE '%[]' THEN ty ELSE 'pgv.' || ty END, m))) AS differing
FROM (VALUES ('array_to_sparsevec', 'real[]'), ('array_to_sparsevec', 'double precision[]'),
             ('array_to_sparsevec', 'integer[]'), ('array_to_sparsevec', 'numeric[]'),
             ('vector_to_sparsevec', 'vector'), ('halfvec_to_sparsevec', 'halfvec')) f(f, ty),
     unnest(ARRAY['{0,1.5,0,-2}', '{0,0,0}', '{1e-46,1,-1e-46}', '{4e38,1}', '{1,NaN}', '{-Infinity}', '{}',
                  '{{1,2}}', '{1,NULL}', '{65520,1}', '{0.1,1e-8,3}']) a,
     LATERAL (SELECT CASE WHEN ty LIKE '%[]' THEN a ELSE '[' || btrim(a, '{}') || ']' END AS x) x,
     unnest(ARRAY[-1, 3, 4]) m;
SELECT pg_temp.result_of($$SELECT array_agg(n)::sparsevec::text FROM generate_series(1, 16001) n$$) AS knn_gpu,
       pg_temp.result_of($$SELECT array_agg(n)::pgv.sparsevec::text FROM generate_series(1, 16001) n$$) AS pgvector;

-- In the other order, pgvector's types in the schema: knn_gpu creates none
-- of its sparsevec objects, and what users call is pgvector's.
DROP EXTENSION vector;
DROP SCHEMA pgv;
DROP EXTENSION knn_gpu;
CREATE EXTENSION vector;
CREATE EXTENSION knn_gpu;
SELECT e.extname,
       (SELECT count(*) FROM pg_depend d
        WHERE d.refclassid = 'pg_extension'::regclass AND d.refobjid = e.oid AND d.deptype = 'e'
          AND pg_describe_object(d.classid, d.objid, 0) LIKE '%sparsevec%') AS objects_involving_sparsevec
FROM pg_extension e WHERE e.extname IN ('knn_gpu', 'vector') ORDER BY 1;
SELECT '{1:3,2:4}/2'::sparsevec <-> '{}/2' AS l2, l2_normalize('{1:3,2:4}/2'::sparsevec),
       '[0,2]'::vector::sparsevec AS from_vector;
DROP EXTENSION knn_gpu;
DROP EXTENSION vector;
