--
-- Distance operators and functions, comparison operators.
-- Every expected value below is computed by hand; with integer elements all
-- partial sums are exact, so the order of summation cannot change them.
--

\i sql/error_of.psql

-- a = [1,2,3], b = [4,5,6]: differences 3,3,3; a.b = 4+10+18 = 32;
-- |a|^2 = 14, |b|^2 = 77
--   <->  sqrt(27)                = 5.196152422706632
--   <#>  -32
--   <=>  1 - 32 / sqrt(14 * 77)  = 0.025368153802923787
--   <+>  9
SELECT '[1,2,3]'::vector <-> '[4,5,6]'::vector AS l2,
	'[1,2,3]'::vector <#> '[4,5,6]'::vector AS negative_ip,
	'[1,2,3]'::vector <=> '[4,5,6]'::vector AS cosine,
	'[1,2,3]'::vector <+> '[4,5,6]'::vector AS l1;
-- (one operand typed: with halfvec there, as with pgvector, two untyped
-- literals would be ambiguous)
SELECT l2_distance('[1,2,3]'::vector, '[4,5,6]'), inner_product('[1,2,3]'::vector, '[4,5,6]'),
	negative_inner_product('[1,2,3]'::vector, '[4,5,6]'),
	cosine_distance('[1,2,3]'::vector, '[4,5,6]'), l1_distance('[1,2,3]'::vector, '[4,5,6]');

-- 20 dimensions (two full blocks of 8 lanes and a tail of 4):
-- a = [1..20], b = [20..1], a[i] - b[i] = 2i - 21 = -19, -17, ..., 17, 19
--   <->  sqrt(2 * (1 + 9 + 25 + ... + 361)) = sqrt(2660) = 51.57518783291051
--   a.b  sum i * (21 - i) = 21 * 210 - 2870 = 1540, so <#> = -1540
--   <=>  1 - 1540 / sqrt(2870 * 2870) = 1 - 1540 / 2870 = 0.46341463414634143
--   <+>  2 * (1 + 3 + ... + 19) = 200
CREATE TEMP TABLE long_pair AS
	SELECT (SELECT array_agg(i ORDER BY i) FROM generate_series(1, 20) i)::vector AS a,
		(SELECT array_agg(21 - i ORDER BY i) FROM generate_series(1, 20) i)::vector AS b;
SELECT a, b FROM long_pair;
SELECT a <-> b AS l2, a <#> b AS negative_ip, a <=> b AS cosine, a <+> b AS l1,
	inner_product(a, b) AS ip
FROM long_pair;

-- The sums follow knn_distance.h: element i goes to lane i % 8, lanes are
-- folded at the end. For a = [1e8,1,1,1,1,1,1,1,-1e8] and b = 9 ones, lane 0
-- holds 1e8 - 1e8 = 0 and lanes 1..7 hold 1 each: a.b = 7 (the exact value).
-- A left-to-right float sum would lose every 1 against 1e8 and return 0.
SELECT inner_product('[1e8,1,1,1,1,1,1,1,-1e8]'::vector, '[1,1,1,1,1,1,1,1,1]'),
	'[1e8,1,1,1,1,1,1,1,-1e8]'::vector <#> '[1,1,1,1,1,1,1,1,1]' AS negative_ip;

-- parallel, opposite and orthogonal vectors: cosine 0, 2 and 1;
-- a zero vector has no direction: NaN
SELECT '[1,2,3]'::vector <=> '[2,4,6]' AS parallel,
	'[1,2,3]'::vector <=> '[-1,-2,-3]' AS opposite,
	'[1,0]'::vector <=> '[0,5]' AS orthogonal,
	'[0,0]'::vector <=> '[1,1]' AS zero,
	'[0,0]'::vector <-> '[0,0]' AS l2_zero;

-- one dimension; negative elements
SELECT '[-2]'::vector <-> '[3]' AS l2, '[-2]'::vector <#> '[3]' AS negative_ip,
	'[-2]'::vector <+> '[3]' AS l1, '[-2]'::vector <=> '[3]' AS cosine;

-- the functions and the operators agree, and all are symmetric
CREATE TEMP TABLE pairs AS
	SELECT ('[' || i || ',' || (i * 0.37)::real || ',' || -i || ']')::vector AS a,
		('[' || (10 - i) * 0.11 || ',' || i % 3 || ',' || i * i || ']')::vector AS b
	FROM generate_series(1, 10) i;
SELECT count(*) AS pairs,
	count(*) FILTER (WHERE l2_distance(a, b) <> a <-> b OR a <-> b <> b <-> a) AS l2_differ,
	count(*) FILTER (WHERE negative_inner_product(a, b) <> a <#> b
					 OR inner_product(a, b) <> -(a <#> b) OR a <#> b <> b <#> a) AS ip_differ,
	count(*) FILTER (WHERE cosine_distance(a, b) <> a <=> b OR a <=> b <> b <=> a) AS cosine_differ,
	count(*) FILTER (WHERE l1_distance(a, b) <> a <+> b OR a <+> b <> b <+> a) AS l1_differ
FROM pairs;

-- nearest neighbours by each operator, q = [1,1]:
--   id v        <->        <#>  <=>                           <+>
--   1  [1,1]    0          -2   1 - 2/sqrt(2*2)  = 0           0
--   2  [2,2]    sqrt(2)    -4   1 - 4/sqrt(8*2)  = 0           2
--   3  [-1,-1]  sqrt(8)     2   1 + 2/sqrt(2*2)  = 2           4
--   4  [0,3]    sqrt(5)    -3   1 - 3/sqrt(9*2)  = 0.2928932188134524   3
--   5  [3,0]    sqrt(5)    -3   1 - 3/sqrt(9*2)  = 0.2928932188134524   3
--   6  [1,2]    1          -3   1 - 3/sqrt(5*2)  = 0.05131670194948623  1
CREATE TEMP TABLE points (id int, v vector);
INSERT INTO points VALUES (1, '[1,1]'), (2, '[2,2]'), (3, '[-1,-1]'), (4, '[0,3]'),
	(5, '[3,0]'), (6, '[1,2]');
SELECT id, v <-> '[1,1]' AS l2 FROM points ORDER BY v <-> '[1,1]', id;
SELECT id, v <#> '[1,1]' AS negative_ip FROM points ORDER BY v <#> '[1,1]', id;
SELECT id, v <=> '[1,1]' AS cosine FROM points ORDER BY v <=> '[1,1]', id;
SELECT id, v <+> '[1,1]' AS l1 FROM points ORDER BY v <+> '[1,1]', id;

-- different dimensions are an error for every distance
SELECT statement, pg_temp.error_of(statement) AS error
FROM (VALUES ($$SELECT '[1,2]'::vector <-> '[1,2,3]'$$),
			 ($$SELECT '[1,2]'::vector <#> '[1,2,3]'$$),
			 ($$SELECT '[1,2]'::vector <=> '[1,2,3]'$$),
			 ($$SELECT '[1,2]'::vector <+> '[1,2,3]'$$),
			 ($$SELECT inner_product('[1,2,3]'::vector, '[1,2]')$$),
			 ($$SELECT l2_distance('[1]'::vector, '[1,2]')$$)) AS t(statement);

-- NULL in, NULL out
SELECT NULL::vector <-> '[1]' IS NULL AS l2_null, l1_distance('[1]'::vector, NULL) IS NULL AS l1_null;

-- comparison: element by element, then the shorter vector first
SELECT '[1,2]'::vector < '[1,3]' AS lt, '[1,2]'::vector < '[1,2,0]' AS prefix_lt,
	'[2]'::vector > '[1,9]' AS gt, '[1,2]'::vector = '[1,2]' AS eq,
	'[0]'::vector = '[-0]' AS zero_eq, '[1,2]'::vector <> '[1,2,3]' AS ne,
	'[1,2]'::vector <= '[1,2]' AS le, '[1,2]'::vector >= '[1,3]' AS ge;
CREATE TEMP TABLE sorted (v vector);
INSERT INTO sorted VALUES ('[1,2,3]'), ('[1,2]'), ('[0,9,9]'), ('[1,2]'), ('[1,-2]'),
	('[2]'), ('[-1.5,0]');
SELECT v FROM sorted ORDER BY v;
SELECT v FROM sorted ORDER BY v DESC;
SELECT DISTINCT v FROM sorted ORDER BY v;
SELECT v, count(*) FROM sorted GROUP BY v ORDER BY v;
-- a btree index answers equality and range lookups
CREATE INDEX sorted_v ON sorted (v);
SET enable_seqscan = off;
EXPLAIN (COSTS OFF) SELECT v FROM sorted WHERE v = '[1,2]';
SELECT v FROM sorted WHERE v = '[1,2]';
SELECT v FROM sorted WHERE v > '[1,2]' ORDER BY v;
RESET enable_seqscan;
