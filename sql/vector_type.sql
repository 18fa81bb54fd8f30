--
-- The vector type: text form, limits, typmod vector(n), storage.
-- Everything here is what pgvector does for the same input.
--

\i sql/error_of.psql

-- text input: blanks are allowed around numbers and brackets
SELECT '[1,2,3]'::vector;
SELECT ' [ 1 , 2.5 ,-3e2 ] '::vector;
SELECT E'\t[\n1\r,\f2\x0B]\n'::vector;

-- output is the shortest decimal that reads back as the same float
SELECT '[0.1, +1.5, -0, 100000000, 1.0000001, 16777217]'::vector;
SELECT '[3.4028235e38, -3.4028235e38, 1.17549435e-38, 1e-45]'::vector;
-- below the smallest subnormal the value becomes 0 (as in pgvector)
SELECT '[1e-50, -1e-46]'::vector;

-- each element is read exactly as a real is read (strtof, no double rounding)
SET extra_float_digits = 1;
SELECT setseed(0.25);
CREATE TEMP TABLE samples AS
	SELECT ((random() - 0.5) * 10 ^ (random() * 60 - 30))::text AS literal
	FROM generate_series(1, 5000);
SELECT count(*) AS samples,
	count(*) FILTER (WHERE ('[' || literal || ']')::vector::text
						<> '[' || literal::real::text || ']') AS differ_from_real,
	count(*) FILTER (WHERE ('[' || literal || ']')::vector::text::vector::text
						<> ('[' || literal || ']')::vector::text) AS do_not_round_trip
FROM samples;
RESET extra_float_digits;

-- invalid input: SQLSTATE and message
SELECT literal, pg_temp.error_of(format('SELECT %L::vector', literal)) AS error
FROM (VALUES ('[]'), ('[ ]'), ('[1,NaN]'), ('[nan]'), ('[1,Infinity]'), ('[-inf]'),
			 ('[1e39]'), ('[-1e39]'), (''), ('   '), ('1,2'), ('(1,2)'), ('{1,2}'),
			 ('[1,2'), ('[1,2,]'), ('[,1]'), ('[1,,2]'), ('[1 2]'), ('[1;2]'),
			 ('[1,2]x'), ('[1,2]]'), ('[1,2] [3]'), ('[a]'), ('[1e]'), ('[[1]]'),
			 ('[1,2,3')) AS t(literal);

-- the messages in full, with their details
SELECT '1,2'::vector;
SELECT '[1,2] 3'::vector;
SELECT '[1,2,'::vector;

-- at most 16000 dimensions
SELECT vector_dims(('[' || repeat('1,', 15999) || '1]')::vector);
SELECT pg_temp.error_of(format('SELECT %L::vector', '[' || repeat('1,', 16000) || '1]'));

-- vector_dims and vector_norm (sqrt(9 + 16) = 5, sqrt(1 + 4 + 9) = 3.7416573867739413)
SELECT vector_dims('[1,2,3]'::vector), vector_norm('[3,4]'::vector),
	vector_norm('[1,2,3]'::vector), vector_norm('[-0]'::vector);

-- typmod vector(n)
CREATE TABLE vector_typmod (v vector(3));
SELECT format_type(atttypid, atttypmod) FROM pg_attribute
	WHERE attrelid = 'vector_typmod'::regclass AND attname = 'v';
INSERT INTO vector_typmod VALUES ('[1,2,3]'), ('[4,5,6]'::vector), (NULL);
INSERT INTO vector_typmod VALUES ('[1,2]');
INSERT INTO vector_typmod VALUES ('[1,2,3,4]'::vector);
UPDATE vector_typmod SET v = '[1]'::vector;
SELECT v FROM vector_typmod ORDER BY v;
SELECT '[1,2,3]'::vector(3), '[1]'::vector(1), vector_dims(('[' || repeat('0,', 15999) || '0]')::vector(16000));
SELECT statement, pg_temp.error_of(statement) AS error
FROM (VALUES ($$SELECT '[1,2]'::vector(3)$$),
			 ($$SELECT '[1,2,3]'::vector::vector(2)$$),
			 ($$SELECT NULL::vector(0)$$),
			 ($$SELECT NULL::vector(-1)$$),
			 ($$SELECT NULL::vector(16001)$$),
			 ($$SELECT NULL::vector(3, 4)$$),
			 ($$CREATE TEMP TABLE bad_typmod (v vector(0))$$)) AS t(statement);

-- storage: 4-byte varlena header, int16 dim, int16 unused, dim float4
SELECT typlen, typbyval, typalign, typstorage FROM pg_type WHERE oid = 'vector'::regtype;
SELECT pg_column_size('[1,2,3]'::vector) AS bytes_3,
	pg_column_size(('[' || repeat('1,', 99) || '1]')::vector) AS bytes_100;

DROP TABLE vector_typmod;
