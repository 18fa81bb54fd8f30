--
-- The other install order: knn_gpu first (its own vector, halfvec and bit
-- operators), pgvector after it in a schema of its own. Each extension's
-- types and operators are recognised by catalog identity; both join.
--
CREATE EXTENSION knn_gpu;
CREATE SCHEMA pgv;
CREATE EXTENSION vector SCHEMA pgv;

-- two halfvec types, two <~> on bit: one of each extension
SELECT t.typnamespace::regnamespace AS schema, t.typname, e.extname
FROM pg_type t JOIN pg_depend d ON d.classid = 'pg_type'::regclass AND d.objid = t.oid AND d.deptype = 'e'
JOIN pg_extension e ON e.oid = d.refobjid
WHERE t.typname IN ('vector', 'halfvec') ORDER BY 1, 2;
SELECT o.oprnamespace::regnamespace AS schema, o.oprname, e.extname
FROM pg_operator o JOIN pg_depend d ON d.classid = 'pg_operator'::regclass AND d.objid = o.oid AND d.deptype = 'e'
JOIN pg_extension e ON e.oid = d.refobjid
WHERE o.oprname IN ('<~>', '<%>') ORDER BY 1, 2;

-- the same values in both extensions' halfvec, read the same
CREATE TABLE items (id int, h halfvec(3), ph pgv.halfvec(3), b bit(8));
INSERT INTO items
SELECT i, format('[%s,%s,%s]', i % 7, (i * 3) % 11, (i * 5) % 13)::halfvec,
       format('[%s,%s,%s]', i % 7, (i * 3) % 11, (i * 5) % 13)::pgv.halfvec,
       ((i * 73) % 256)::bit(8)
FROM generate_series(1, 300) i;
ANALYZE items;
SELECT count(*) AS differing FROM (
  (SELECT * FROM knn_join('SELECT id, h FROM items WHERE id <= 30', 'SELECT id, h FROM items', 4, 'cosine'))
  EXCEPT ALL
  (SELECT * FROM knn_join('SELECT id, ph FROM items WHERE id <= 30', 'SELECT id, ph FROM items', 4, 'cosine'))) x;
-- knn_gpu's operators and pgvector's agree on these exact values
SELECT count(*) FILTER (WHERE (a.h <-> b.h) IS DISTINCT FROM (a.ph OPERATOR(pgv.<->) b.ph)
	OR (a.h <=> b.h) IS DISTINCT FROM (a.ph OPERATOR(pgv.<=>) b.ph)
	OR (a.b <~> b.b) IS DISTINCT FROM (a.b OPERATOR(pgv.<~>) b.b)
	OR (a.b <%> b.b) IS DISTINCT FROM (a.b OPERATOR(pgv.<%>) b.b)
	OR binary_quantize(format('[%s,%s,0,-0.5]', a.id % 7 - 3, 2 - b.id % 5)::vector)
		IS DISTINCT FROM pgv.binary_quantize(format('[%s,%s,0,-0.5]', a.id % 7 - 3, 2 - b.id % 5)::pgv.vector)
	OR binary_quantize(a.h) IS DISTINCT FROM pgv.binary_quantize(a.ph)) AS differing
FROM items a, items b WHERE a.id <= 40;
-- text input, output and binary form agree with pgvector's halfvec, for
-- values that round (ties to even, subnormals, the largest finite)
SELECT count(*) AS values,
	count(*) FILTER (WHERE x::halfvec::text IS DISTINCT FROM x::pgv.halfvec::text
		OR knn_halfvec_send(x::halfvec) IS DISTINCT FROM pgv.halfvec_send(x::pgv.halfvec)
		OR knn_halfvec_send(x::vector::halfvec) IS DISTINCT FROM pgv.halfvec_send(x::pgv.vector::pgv.halfvec)
		OR knn_halfvec_send(x::halfvec::vector::halfvec) IS DISTINCT FROM knn_halfvec_send(x::halfvec)) AS differing
FROM (SELECT format('[%s,%s,%s]', (i * 0.0137)::real, (1 + i * 2.0 ^ -11)::real, (i * 2.0 ^ -26)::real) AS x
	  FROM generate_series(-3000, 3000) i
	  UNION ALL VALUES ('[65504,65519,-65519]'), ('[0.1,1e-8,6e-8]'), ('[-0,3e-5,2049]')) v;

-- the node takes either extension's bit operator and halfvec type
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM items q CROSS JOIN LATERAL (SELECT t.id FROM items t ORDER BY t.b OPERATOR(pgv.<~>) q.b LIMIT 3) n;
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM items q CROSS JOIN LATERAL (SELECT t.id FROM items t ORDER BY t.ph OPERATOR(pgv.<+>) q.ph LIMIT 3) n;
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM items q CROSS JOIN LATERAL (SELECT t.id FROM items t ORDER BY t.b <%> q.b LIMIT 3) n;

-- A user's operator called <~> on bit is none of them: PostgreSQL's plan.
CREATE SCHEMA mallory;
CREATE FUNCTION mallory.fake(bit, bit) RETURNS float8 LANGUAGE sql IMMUTABLE AS 'SELECT 0::float8';
CREATE OPERATOR mallory.<~> (LEFTARG = bit, RIGHTARG = bit, FUNCTION = mallory.fake);
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM items q CROSS JOIN LATERAL (SELECT t.id FROM items t ORDER BY t.b OPERATOR(mallory.<~>) q.b LIMIT 3) n;
DROP SCHEMA mallory CASCADE;

DROP TABLE items;
DROP EXTENSION vector;
DROP SCHEMA pgv;
DROP EXTENSION knn_gpu;
