-- Damaged stored vector and halfvec values (forged here through
-- binary-coercible casts from bytea, which only a superuser can create):
-- one whose size disagrees with its dimension count is refused by every
-- function with XX001 before any element is read (a dim of 16000 with no
-- elements would otherwise read 64000 or 32000 bytes past the value).
\i sql/error_of.psql
CREATE CAST (bytea AS vector) WITHOUT FUNCTION;
CREATE CAST (bytea AS halfvec) WITHOUT FUNCTION;
CREATE TABLE forged (what text, b bytea);
INSERT INTO forged VALUES
  ('dim 16000, no elements', '\x803e0000'),
  ('dim 3, two elements', '\x030000000000803f0000803f'),
  ('dim 0', '\x00000000'),
  ('dim negative', '\xffff0000'),
  ('short header', '\x01');
-- every function and operator of one or two values, V the forged value;
-- the two not refused read no element: a cast to the value's own type
-- calls no function, and sum() of one row returns that row's datum as is
SELECT t AS type, what, count(*) AS calls,
       count(*) FILTER (WHERE e LIKE 'XX001: invalid ' || t || ' value: %') AS refused,
       string_agg(f || ' -> ' || e, '; ' ORDER BY f COLLATE "C") FILTER (WHERE e NOT LIKE 'XX001: invalid ' || t || ' value: %') AS not_refused
FROM forged,
     unnest(ARRAY['vector', 'halfvec']) t,
     unnest(ARRAY['V::text', 'V <-> V', 'V <#> V', 'V <=> V', 'V <+> V', 'inner_product(V, V)',
                  'l2_distance(V, V)', 'cosine_distance(V, V)', 'l1_distance(V, V)', 'vector_dims(V)',
                  'l2_normalize(V)', 'V = V', 'V < V', 'V + V', 'V || V', 'subvector(V, 1, 1)',
                  'binary_quantize(V)', 'V::real[]', 'V::vector', 'V::halfvec', 'V::sparsevec',
                  'avg(V)', 'sum(V)']) f,
     LATERAL (SELECT pg_temp.error_of(format('SELECT %s FROM (SELECT %L::bytea::%s AS v) x',
                                             replace(f, 'V', 'x.v'), b, t)) AS e) r
GROUP BY 1, 2 ORDER BY t COLLATE "C", what COLLATE "C";
-- and the functions only one type has
SELECT f, pg_temp.error_of(format('SELECT %s', replace(f, 'V', '''\x803e0000''::bytea::vector'))) AS error
FROM unnest(ARRAY['vector_norm(V)', 'knn_vector_send(V)', 'vector_l2_squared_distance(V, V)',
                  'vector_spherical_distance(V, V)', 'vector_negative_inner_product(V, V)', 'vector_cmp(V, V)']) f
ORDER BY f COLLATE "C";
SELECT f, pg_temp.error_of(format('SELECT %s', replace(f, 'V', '''\x803e0000''::bytea::halfvec'))) AS error
FROM unnest(ARRAY['l2_norm(V)', 'knn_halfvec_send(V)', 'halfvec_l2_squared_distance(V, V)',
                  'halfvec_spherical_distance(V, V)', 'halfvec_cmp(V, V)']) f
ORDER BY f COLLATE "C";
DROP TABLE forged;
DROP CAST (bytea AS vector);
DROP CAST (bytea AS halfvec);
