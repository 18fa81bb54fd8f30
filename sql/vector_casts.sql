--
-- Casts between vector and arrays, as pgvector has them:
--   integer[], real[], double precision[], numeric[] -> vector  (assignment)
--   vector -> real[]                                            (implicit)
--   vector -> vector(n)                                         (implicit)
--

\i sql/error_of.psql

SELECT castsource::regtype AS source, casttarget::regtype AS target,
	castcontext AS context, castmethod AS method
FROM pg_cast
WHERE castsource = 'vector'::regtype OR casttarget = 'vector'::regtype
ORDER BY 1::text, 2::text;

-- arrays to vector; each element becomes the nearest float
SELECT ARRAY[1,2,3]::vector AS from_int, ARRAY[16777217, -7]::vector AS int_rounded;
SELECT ARRAY[1.5, -0.25]::real[]::vector AS from_real;
SELECT ARRAY[0.1, 1e-3, 3.4028234e38]::float8[]::vector AS from_float8;
SELECT ARRAY[1.5, 0.1, -100]::numeric[]::vector AS from_numeric;
-- the lower bound of the array does not matter
SELECT '[0:2]={7,8,9}'::int[]::vector AS lower_bound_0;
-- typmod
SELECT ARRAY[1,2,3]::vector(3) AS int_typmod, ARRAY[1,2]::real[]::vector(2) AS real_typmod,
	ARRAY[1,2]::float8[]::vector(2) AS float8_typmod, ARRAY[1]::numeric[]::vector(1) AS numeric_typmod;
-- the largest vector
SELECT vector_dims(array_fill(0.5, ARRAY[16000])::vector);

-- arrays that are no vectors
SELECT statement, pg_temp.error_of(statement) AS error
FROM (VALUES ($$SELECT ARRAY[1,2,3]::vector(2)$$),
			 ($$SELECT ARRAY[1,2]::real[]::vector(3)$$),
			 ($$SELECT ARRAY[1,NULL,3]::vector$$),
			 ($$SELECT ARRAY[1.5,NULL]::real[]::vector$$),
			 ($$SELECT ARRAY[[1,2],[3,4]]::vector$$),
			 ($$SELECT ARRAY[[1,2],[3,4]]::float8[]::vector$$),
			 ($$SELECT '{}'::int[]::vector$$),
			 ($$SELECT '{}'::numeric[]::vector$$),
			 ($$SELECT array_fill(1, ARRAY[16001])::vector$$),
			 ($$SELECT ARRAY['NaN']::real[]::vector$$),
			 ($$SELECT ARRAY[1, 'NaN'::float8]::vector$$),
			 ($$SELECT ARRAY['NaN']::numeric[]::vector$$),
			 ($$SELECT ARRAY['Infinity']::real[]::vector$$),
			 ($$SELECT ARRAY['-Infinity']::float8[]::vector$$),
			 ($$SELECT ARRAY['Infinity']::numeric[]::vector$$),
			 ($$SELECT ARRAY[1e39]::float8[]::vector$$),
			 ($$SELECT ARRAY[1e39]::numeric[]::vector$$)) AS t(statement);

-- vector to real[]
SELECT '[1,2.5,-0.1]'::vector::real[] AS to_real, array_length('[1,2,3,4]'::vector::real[], 1);
-- ... is implicit: a function of real[] takes a vector
CREATE FUNCTION pg_temp.sum_of(a real[]) RETURNS real
LANGUAGE sql AS $$ SELECT sum(x) FROM unnest(a) x $$;
SELECT pg_temp.sum_of('[1,2,3.5]'::vector);
-- ... and loses nothing
SELECT ('[0.1,1e-45,-3.4028235e38]'::vector::real[])::vector AS round_trip;

-- arrays are assigned to vector columns, typmod included
CREATE TEMP TABLE cast_target (v vector(3));
INSERT INTO cast_target VALUES (ARRAY[1,2,3]), (ARRAY[1.5,2,3]::real[]),
	(ARRAY[0.5,2,3]::float8[]), (ARRAY[2.5,2,3]::numeric[]);
SELECT v FROM cast_target ORDER BY v;
INSERT INTO cast_target VALUES (ARRAY[1,2]);
-- ... but are not converted implicitly in expressions
SELECT ARRAY[1,2,3] <-> '[1,2,3]'::vector;

-- vector -> vector(n) checks the dimension
SELECT '[1,2]'::vector::vector(2) AS same, pg_temp.error_of($$SELECT '[1,2]'::vector::vector(3)$$) AS other;
