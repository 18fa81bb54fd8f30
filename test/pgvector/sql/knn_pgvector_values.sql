--
-- With pgvector's types, knn_join returns what pgvector's own operators
-- return, and ranks by it: pgvector sums in its compiler's order
-- (-fassociative-math), so its values may differ in the last bits from the
-- engine's canonical ones; the join takes every candidate's value from the
-- operator and proves that no other target can rank (knn_operator_values.c).
-- Every comparison below is against PostgreSQL's own plan (the operator
-- evaluated pair by pair, sorted by value then id): both differences empty.
--
CREATE EXTENSION vector;
CREATE EXTENSION knn_gpu;
SET knn_gpu.device = cpu;

SELECT setseed(0.25);
CREATE TABLE pts AS
SELECT i AS id,
       (SELECT array_agg((random() - 0.5)::real) FROM generate_series(1, 32) j WHERE i > 0)::vector(32) AS v
FROM generate_series(1, 600) i;
-- Near-duplicates and exact duplicates: ties in canonical values that
-- extend past the first candidates, so that some queries need more.
INSERT INTO pts
SELECT 600 + id, v FROM pts WHERE id <= 40
UNION ALL
SELECT 700 + id, (SELECT array_agg(x * (1 + 1e-7)) FROM unnest(v::real[]) x)::vector(32)
FROM pts WHERE id <= 40
UNION ALL
SELECT 800 + i, (SELECT v FROM pts WHERE id = 1) FROM generate_series(1, 30) i
ORDER BY 1;
ALTER TABLE pts ADD COLUMN h halfvec(32);
UPDATE pts SET h = v::halfvec(32);
ANALYZE pts;

-- The same values as pgvector's operators, by metric; the reference is the
-- operator sorted by (value, id), k = 7.
CREATE FUNCTION by_operator(metric text, col text, ex boolean)
RETURNS TABLE (query_id bigint, target_id bigint, rank bigint, distance float8)
LANGUAGE plpgsql AS $$
DECLARE op text := CASE metric WHEN 'l2' THEN '<->' WHEN 'cosine' THEN '<=>'
                                WHEN 'ip' THEN '<#>' ELSE '<+>' END;
BEGIN
  RETURN QUERY EXECUTE format(
    'SELECT q.id::bigint, n.id::bigint, row_number() OVER (PARTITION BY q.id ORDER BY n.d, n.id), n.d
     FROM pts q CROSS JOIN LATERAL (
       SELECT t.id, t.%1$s %2$s q.%1$s AS d FROM pts t
       WHERE NOT %3$L OR t.id <> q.id
       ORDER BY t.%1$s %2$s q.%1$s, t.id LIMIT 7) n', col, op, ex);
END $$;

CREATE TABLE differences (metric text, col text, ex boolean, side text, n bigint);
DO $$
DECLARE m text; c text; e boolean;
BEGIN
  FOREACH m IN ARRAY ARRAY['l2', 'cosine', 'ip', 'l1'] LOOP
    FOREACH c IN ARRAY ARRAY['v', 'h'] LOOP
      FOREACH e IN ARRAY ARRAY[false, true] LOOP
        CREATE TEMP TABLE mine AS
          SELECT query_id, target_id, rank::bigint, distance
          FROM knn_join(format('SELECT id, %s FROM pts', c), format('SELECT id, %s FROM pts', c), 7,
                        metric => m, exclude_self => e);
        CREATE TEMP TABLE theirs AS SELECT * FROM by_operator(m, c, e);
        INSERT INTO differences
          SELECT m, c, e, 'knn_join only', count(*) FROM (TABLE mine EXCEPT ALL TABLE theirs) x
          UNION ALL
          SELECT m, c, e, 'operator only', count(*) FROM (TABLE theirs EXCEPT ALL TABLE mine) y;
        DROP TABLE mine, theirs;
      END LOOP;
    END LOOP;
  END LOOP;
END $$;
-- 32 rows, every count 0.
SELECT count(*) AS comparisons, sum(n) AS differing_rows FROM differences;
SELECT * FROM differences WHERE n <> 0;

-- Not vacuous: on these data pgvector's L2 values differ from the
-- canonical ones (knn_distance.h: float sums over 8 interleaved lanes,
-- folded ((l0+l4)+(l2+l6))+((l1+l5)+(l3+l7)), rebuilt here in real
-- arithmetic) for some pairs, which the engine alone would have returned.
CREATE AGGREGATE real_sum(real) (sfunc = float4pl, stype = real, initcond = '0');
CREATE FUNCTION canonical_l2(a vector, b vector) RETURNS float8 LANGUAGE sql AS $$
  WITH terms AS (SELECT i, (x - y) * (x - y) AS sq
                 FROM unnest(a::real[], b::real[]) WITH ORDINALITY u(x, y, i)),
       lanes AS (SELECT array_agg(s ORDER BY lane) AS l
                 FROM (SELECT (i - 1) % 8 AS lane, real_sum(sq ORDER BY i) AS s
                       FROM terms GROUP BY 1) x)
  SELECT sqrt((((l[1] + l[5]) + (l[3] + l[7])) + ((l[2] + l[6]) + (l[4] + l[8])))::float8)
  FROM lanes $$;
SELECT count(*) > 0 AS some_values_differ
FROM pts a, pts b
WHERE a.id <= 30 AND b.id <= 100 AND (a.v <-> b.v) <> canonical_l2(a.v, b.v);

-- The KNN Join node too: each LATERAL query, planned as a KNN Join, gives
-- the rows, order and distances of PostgreSQL's plan (knn_join off).
CREATE FUNCTION lateral_rows(op text, col text)
RETURNS TABLE (qid int, tid int, d float8, r bigint)
LANGUAGE plpgsql AS $$
BEGIN
  RETURN QUERY EXECUTE format(
    'SELECT q.id, n.id, n.d, row_number() OVER (PARTITION BY q.id)
     FROM pts q CROSS JOIN LATERAL (
       SELECT t.id, t.%1$s %2$s q.%1$s AS d FROM pts t
       ORDER BY t.%1$s %2$s q.%1$s, t.id LIMIT 5) n', col, op);
END $$;
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM pts q CROSS JOIN LATERAL (
  SELECT t.id, t.v <=> q.v AS d FROM pts t ORDER BY t.v <=> q.v, t.id LIMIT 5) n;
CREATE TABLE node_differences (op text, col text, n bigint);
DO $$
DECLARE o text; c text;
BEGIN
  FOREACH o IN ARRAY ARRAY['<->', '<=>', '<#>', '<+>'] LOOP
    FOREACH c IN ARRAY ARRAY['v', 'h'] LOOP
      SET LOCAL knn_gpu.enable_knn_join = on;
      CREATE TEMP TABLE node AS SELECT * FROM lateral_rows(o, c);
      SET LOCAL knn_gpu.enable_knn_join = off;
      CREATE TEMP TABLE plain AS SELECT * FROM lateral_rows(o, c);
      INSERT INTO node_differences
        SELECT o, c, (SELECT count(*) FROM (TABLE node EXCEPT ALL TABLE plain) x)
                   + (SELECT count(*) FROM (TABLE plain EXCEPT ALL TABLE node) y);
      DROP TABLE node, plain;
    END LOOP;
  END LOOP;
END $$;
SELECT count(*) AS comparisons, sum(n) AS differing_rows FROM node_differences;

DROP TABLE pts, differences, node_differences;
DROP FUNCTION by_operator(text, text, boolean), lateral_rows(text, text), canonical_l2(vector, vector);
DROP AGGREGATE real_sum(real);
DROP EXTENSION knn_gpu;
DROP EXTENSION vector;
