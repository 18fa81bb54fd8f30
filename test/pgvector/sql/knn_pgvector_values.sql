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
-- operator sorted by (value, id), k = 7 (the targets' column is col too,
-- or tcol).
CREATE FUNCTION by_operator(metric text, col text, ex boolean, tcol text DEFAULT NULL)
RETURNS TABLE (query_id bigint, target_id bigint, rank bigint, distance float8)
LANGUAGE plpgsql AS $$
DECLARE op text := CASE metric WHEN 'l2' THEN '<->' WHEN 'cosine' THEN '<=>'
                                WHEN 'ip' THEN '<#>' ELSE '<+>' END;
BEGIN
  RETURN QUERY EXECUTE format(
    'SELECT q.id::bigint, n.id::bigint, row_number() OVER (PARTITION BY q.id ORDER BY n.d, n.id), n.d
     FROM pts q CROSS JOIN LATERAL (
       SELECT t.id, t.%4$s %2$s q.%1$s AS d FROM pts t
       WHERE NOT %3$L OR t.id <> q.id
       ORDER BY t.%4$s %2$s q.%1$s, t.id LIMIT 7) n', col, op, ex, coalesce(tcol, col));
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

-- A domain over pgvector's type on one side only: the operator SQL
-- resolves for it is pgvector's, so the join's values are pgvector's too
-- (they were the engine's: the two sides' types were compared as written).
CREATE DOMAIN pts_vector AS vector;
CREATE TEMP TABLE mine AS
  SELECT query_id, target_id, rank::bigint, distance
  FROM knn_join('SELECT id, v::pts_vector FROM pts', 'SELECT id, v FROM pts', 7);
CREATE TEMP TABLE theirs AS SELECT * FROM by_operator('l2', 'v', false);
SELECT (SELECT count(*) FROM (TABLE mine EXCEPT ALL TABLE theirs) x) AS knn_join_only,
       (SELECT count(*) FROM (TABLE theirs EXCEPT ALL TABLE mine) y) AS operator_only;
DROP TABLE mine, theirs;
DROP DOMAIN pts_vector;

-- Columns of two types: halfvec beside vector (either side), which SQL
-- resolves to pgvector's halfvec operator (its implicit cast vector ->
-- halfvec), and real[] or double precision[] beside vector, which meet
-- in SQL as arr::vector (here exactly v): the join's values are those
-- operators' (they were the engine's: the two sides' types differed).
-- knn_range_join too, at a radius among the values.
CREATE TABLE mixed_differences (metric text, sides text, n bigint);
DO $$
DECLARE m text; s text[];
BEGIN
  FOREACH m IN ARRAY ARRAY['l2', 'cosine', 'ip', 'l1'] LOOP
    -- the texts' columns, then the reference's
    FOREACH s SLICE 1 IN ARRAY ARRAY[['h', 'v', 'h', 'v'], ['v', 'h', 'v', 'h'],
                                     ['v::real[]', 'v', 'v', 'v'], ['v', 'v::real[]::float8[]', 'v', 'v']] LOOP
      CREATE TEMP TABLE mine AS
        SELECT query_id, target_id, rank::bigint, distance
        FROM knn_join(format('SELECT id, %s FROM pts', s[1]), format('SELECT id, %s FROM pts', s[2]), 7,
                      metric => m);
      CREATE TEMP TABLE theirs AS SELECT * FROM by_operator(m, s[3], false, s[4]);
      INSERT INTO mixed_differences
        SELECT m, s[1] || ' x ' || s[2], count(*) FROM (
          (TABLE mine EXCEPT ALL TABLE theirs) UNION ALL (TABLE theirs EXCEPT ALL TABLE mine)) x;
      DROP TABLE mine, theirs;
    END LOOP;
  END LOOP;
END $$;
SELECT count(*) AS comparisons, sum(n) AS differing_rows FROM mixed_differences;
SELECT radius, (SELECT count(*) FROM pts q, pts t WHERE q.h <-> t.v <= radius) AS sql_pairs,
       (SELECT count(*) FROM knn_range_join('SELECT id, h FROM pts', 'SELECT id, v FROM pts', radius)) AS knn_range_join_pairs,
       (SELECT count(*) FROM (
          SELECT q.id::bigint, t.id::bigint, q.h <-> t.v FROM pts q, pts t WHERE q.h <-> t.v <= radius
          EXCEPT ALL
          SELECT query_id, target_id, distance FROM knn_range_join('SELECT id, h FROM pts', 'SELECT id, v FROM pts', radius)) x) AS sql_only
FROM (SELECT q.h <-> t.v AS radius FROM pts q, pts t WHERE q.id = 3 AND t.id = 500) r;
DROP TABLE mixed_differences;

-- Sums near FLT_MAX: pgvector's L1 sum stays finite where the engine's
-- canonical one overflows (+inf), and the other way. A canonical +inf
-- gives no bound on the operator's value: the row of the least operator
-- value (id 100) is found, by knn_join, the KNN Join node and
-- knn_range_join (the joins used to prove the 17 rows of canonical +inf
-- enough and return id 1, and the range join took no pair).
CREATE TABLE near_max_q (id int, v vector(7));
INSERT INTO near_max_q VALUES (1, '[0,0,0,0,0,0,0]');
CREATE TABLE near_max_t (id int, v vector(7));
INSERT INTO near_max_t
SELECT i, ARRAY[(3.4028234663852886e+38 - 2^104)::real, (0.7*2^103)::real, (0.7*2^103)::real,
                (0.7*2^103)::real, (0.7*2^103)::real, (0.7*2^103)::real, (0.7*2^103)::real]::vector
FROM generate_series(1, 17) i;
INSERT INTO near_max_t VALUES (100, ARRAY[(0.9*2^103)::real, (0.9*2^103)::real, (0.9*2^103)::real,
  (3.4028234663852886e+38 - 2*2^104)::real, (0.9*2^103)::real, (0.9*2^103)::real, (0.9*2^103)::real]::vector);
SET knn_gpu.enable_knn_join = off;
SELECT t.id, t.v <+> q.v AS sql_distance FROM near_max_q q CROSS JOIN LATERAL (
  SELECT t.id, t.v FROM near_max_t t ORDER BY t.v <+> q.v, t.id LIMIT 1) t;
SET knn_gpu.enable_knn_join = on;
EXPLAIN (COSTS OFF) SELECT t.id, t.v <+> q.v AS node_distance FROM near_max_q q CROSS JOIN LATERAL (
  SELECT t.id, t.v FROM near_max_t t ORDER BY t.v <+> q.v, t.id LIMIT 1) t;
SELECT t.id, t.v <+> q.v AS node_distance FROM near_max_q q CROSS JOIN LATERAL (
  SELECT t.id, t.v FROM near_max_t t ORDER BY t.v <+> q.v, t.id LIMIT 1) t;
RESET knn_gpu.enable_knn_join;
SELECT target_id, distance, method FROM (VALUES ('auto'), ('brute'), ('ti')) m(method),
  LATERAL knn_join('SELECT id, v FROM near_max_q', 'SELECT id, v FROM near_max_t', 1, metric => 'l1',
                   method => m.method);
SELECT target_id, distance FROM knn_range_join('SELECT id, v FROM near_max_q', 'SELECT id, v FROM near_max_t',
                                               3.4028233e38, metric => 'l1');
DROP TABLE near_max_q, near_max_t;

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
-- node_vs_plain(query): whether the node ran it, its rows, and the rows in
-- one result and not in the other (EXCEPT ALL both ways).
CREATE FUNCTION node_vs_plain(q text, OUT node boolean, OUT rows bigint, OUT n bigint)
LANGUAGE plpgsql AS $$
DECLARE line text;
BEGIN
  PERFORM set_config('knn_gpu.enable_knn_join', 'on', true);
  node := false;
  FOR line IN EXECUTE 'EXPLAIN (COSTS OFF) ' || q LOOP
    node := node OR line LIKE '%KNN Join%';
  END LOOP;
  EXECUTE 'CREATE TEMP TABLE node AS ' || q;
  PERFORM set_config('knn_gpu.enable_knn_join', 'off', true);
  EXECUTE 'CREATE TEMP TABLE plain AS ' || q;
  PERFORM set_config('knn_gpu.enable_knn_join', 'on', true);
  SELECT count(*) INTO rows FROM plain;
  SELECT (SELECT count(*) FROM (TABLE node EXCEPT ALL TABLE plain) x)
       + (SELECT count(*) FROM (TABLE plain EXCEPT ALL TABLE node) y) INTO n;
  DROP TABLE node, plain;
END $$;
-- Per query, the rows in the order they came (r).
CREATE FUNCTION lateral_query(op text, col text) RETURNS text
LANGUAGE sql AS $$
  SELECT format(
    'SELECT q.id AS qid, n.id AS tid, n.d, row_number() OVER (PARTITION BY q.id) AS r
     FROM pts q CROSS JOIN LATERAL (
       SELECT t.id, t.%1$s %2$s q.%1$s AS d FROM pts t
       ORDER BY t.%1$s %2$s q.%1$s, t.id LIMIT 5) n', col, op)
$$;
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM pts q CROSS JOIN LATERAL (
  SELECT t.id, t.v <=> q.v AS d FROM pts t ORDER BY t.v <=> q.v, t.id LIMIT 5) n;
-- FETCH FIRST ... WITH TIES over a view: the ties are decided on
-- pgvector's values (30 copies of row 1 tie at distance 0, far past 3).
-- Compared as sets of (query, target, distance): the order within a tie is
-- the plan's choice.
CREATE VIEW pts_view AS SELECT id, v, h FROM pts WHERE id % 7 <> 3;
CREATE FUNCTION ties_query(op text, col text) RETURNS text
LANGUAGE sql AS $$
  SELECT format(
    'SELECT q.id AS qid, n.id AS tid, n.d
     FROM pts q CROSS JOIN LATERAL (
       SELECT t.id, t.%1$s %2$s q.%1$s AS d FROM pts_view t
       ORDER BY t.%1$s %2$s q.%1$s FETCH FIRST 3 ROWS WITH TIES) n', col, op)
$$;
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM pts q CROSS JOIN LATERAL (
  SELECT t.id, t.h <+> q.h AS d FROM pts_view t ORDER BY t.h <+> q.h FETCH FIRST 3 ROWS WITH TIES) n;
CREATE TABLE node_differences AS
SELECT o AS op, c AS col, s AS shape, x.*
FROM unnest(ARRAY['<->', '<=>', '<#>', '<+>']) o, unnest(ARRAY['v', 'h']) c,
     unnest(ARRAY['limit', 'ties']) s,
     LATERAL node_vs_plain(CASE s WHEN 'limit' THEN lateral_query(o, c) ELSE ties_query(o, c) END) x;
SELECT shape, count(*) AS comparisons, bool_and(node) AS all_by_the_node,
       min(rows) > 3 * (SELECT count(*) FROM pts) AS more_than_3_per_query,
       sum(n) AS differing_rows
FROM node_differences GROUP BY shape ORDER BY shape;

-- A radius with pgvector's type: the pairs whose pgvector value is < r (or
-- <= r) are exactly those of PostgreSQL's plan, also at radii equal to
-- some pair's value, where the canonical value alone could decide the
-- pair the other way (knn_operator_values.c: candidates by the canonical
-- value with a proven margin, each decided by the operator). The radii:
-- values of pairs whose L2 value differs from the canonical one, and for
-- every metric and both types values of a few pairs of the queries.
CREATE TABLE radii (op text, col text, r float8);
INSERT INTO radii
SELECT '<->', 'v', d FROM (
  SELECT DISTINCT a.v <-> b.v AS d FROM pts a, pts b
  WHERE a.id <= 30 AND b.id <= 100 AND (a.v <-> b.v) <> canonical_l2(a.v, b.v)
  ORDER BY 1 LIMIT 4) x;
DO $$
DECLARE o text; c text;
BEGIN
  FOREACH o IN ARRAY ARRAY['<->', '<=>', '<#>', '<+>'] LOOP
    FOREACH c IN ARRAY ARRAY['v', 'h'] LOOP
      EXECUTE format(
        'INSERT INTO radii SELECT %1$L, %2$L, d FROM (
           SELECT DISTINCT a.%2$s %1$s b.%2$s AS d FROM pts a, pts b
           WHERE a.id IN (3, 5) AND b.id IN (20, 705, 801)) x', o, c);
    END LOOP;
  END LOOP;
END $$;
SELECT count(*) AS radii FROM radii;
-- Not vacuous: at these radii some pairs lie on the boundary by pgvector's
-- value and off it by the canonical one.
SELECT count(*) > 0 AS canonical_would_differ
FROM radii r, pts a, pts b
WHERE r.op = '<->' AND r.col = 'v' AND a.id <= 60
  AND (a.v <-> b.v) = r.r AND canonical_l2(a.v, b.v) <> r.r;

-- The LATERAL query with the radius (< and <=, without and with LIMIT),
-- run as a KNN Join and as PostgreSQL's plan, for the first 60 queries;
-- knn_range_join against the cross join filtered by the operator.
CREATE FUNCTION radius_query(op text, col text, r float8, cmp text, lim text) RETURNS text
LANGUAGE sql AS $$
  SELECT format(
    'SELECT q.id AS qid, n.id AS tid, n.d, row_number() OVER () AS pos
     FROM pts q CROSS JOIN LATERAL (
       SELECT t.id, t.%1$s %2$s q.%1$s AS d FROM pts t
       WHERE t.%1$s %2$s q.%1$s %3$s %4$L::float8
       ORDER BY t.%1$s %2$s q.%1$s, t.id %5$s) n
     WHERE q.id <= 60', col, op, cmp, r, lim)
$$;
EXPLAIN (COSTS OFF)
SELECT q.id, n.id FROM pts q CROSS JOIN LATERAL (
  SELECT t.id, t.v <-> q.v AS d FROM pts t WHERE t.v <-> q.v <= 0.5
  ORDER BY t.v <-> q.v, t.id) n WHERE q.id <= 60;
CREATE TABLE radius_differences AS
SELECT r.op, r.col, r.r, cmp, lim, x.*
FROM radii r, unnest(ARRAY['<', '<=']) cmp, unnest(ARRAY['', 'LIMIT 2']) lim,
     LATERAL node_vs_plain(radius_query(r.op, r.col, r.r, cmp, lim)) x;
-- Every comparison ran the node; 0 differing rows.
SELECT count(*) AS comparisons, bool_and(node) AS all_by_the_node,
       sum(rows) AS pairs, sum(n) AS differing_rows FROM radius_differences;
SELECT * FROM radius_differences WHERE n <> 0 OR NOT node;

CREATE TABLE range_differences (op text, col text, r float8, inclusive boolean, pairs bigint,
                                n bigint);
DO $$
DECLARE x record; inc boolean; m text;
BEGIN
  FOR x IN SELECT * FROM radii LOOP
    m := CASE x.op WHEN '<->' THEN 'l2' WHEN '<=>' THEN 'cosine' WHEN '<#>' THEN 'ip' ELSE 'l1' END;
    FOREACH inc IN ARRAY ARRAY[false, true] LOOP
      CREATE TEMP TABLE mine AS
        SELECT query_id, target_id, rank::bigint, distance
        FROM knn_range_join(format('SELECT id, %s FROM pts WHERE id <= 60', x.col),
                            format('SELECT id, %s FROM pts', x.col), x.r,
                            metric => m, inclusive => inc);
      EXECUTE format(
        'CREATE TEMP TABLE theirs AS
         SELECT q.id::bigint AS query_id, t.id::bigint AS target_id,
                row_number() OVER (PARTITION BY q.id ORDER BY q.%1$s %2$s t.%1$s, t.id) AS rank,
                q.%1$s %2$s t.%1$s AS distance
         FROM pts q, pts t WHERE q.id <= 60 AND q.%1$s %2$s t.%1$s %3$s %4$L::float8',
        x.col, x.op, CASE WHEN inc THEN '<=' ELSE '<' END, x.r);
      INSERT INTO range_differences
        SELECT x.op, x.col, x.r, inc, (SELECT count(*) FROM theirs),
               (SELECT count(*) FROM (TABLE mine EXCEPT ALL TABLE theirs) a)
             + (SELECT count(*) FROM (TABLE theirs EXCEPT ALL TABLE mine) b);
      DROP TABLE mine, theirs;
    END LOOP;
  END LOOP;
END $$;
SELECT count(*) AS comparisons, sum(pairs) AS pairs, sum(n) AS differing_rows
FROM range_differences;
SELECT * FROM range_differences WHERE n <> 0;
DROP TABLE radii, radius_differences, range_differences;
DROP FUNCTION radius_query(text, text, float8, text, text), ties_query(text, text),
  lateral_query(text, text), node_vs_plain(text);
DROP VIEW pts_view;

DROP TABLE pts, differences, node_differences;
DROP FUNCTION by_operator(text, text, boolean, text), canonical_l2(vector, vector);
DROP AGGREGATE real_sum(real);
DROP EXTENSION knn_gpu;
DROP EXTENSION vector;
