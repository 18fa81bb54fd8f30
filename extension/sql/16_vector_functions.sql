-- ---------------------------------------------------------------------------
-- pgvector's functions, operators and aggregates of the vector type that
-- the type's own part (10_vector.sql) does not define: + - * ||, vector_cmp,
-- l2_normalize, subvector, avg and sum with their transition, combine and
-- final functions. Same results and errors as pgvector's.
--
-- Created exactly when knn_gpu created its own vector type (the coexistence
-- rule of 10_vector.sql): where pgvector's "vector" is used, pgvector has
-- all of these, and knn_gpu creates none of them.
--
-- The C functions are named knn_*; so are the SQL functions behind the
-- operators. The functions a user calls by name have pgvector's names
-- (l2_normalize, subvector, and vector_cmp, vector_accum, vector_combine,
-- vector_avg, array_to_vector, vector_to_float4, vector(), which pgvector's
-- users and tests call directly); they take knn_gpu's vector, so they clash
-- with nothing of pgvector's in another schema.
-- ---------------------------------------------------------------------------

DO $knn_vector_functions$
DECLARE
	vector_owner name;
BEGIN
	SELECT e.extname INTO vector_owner
	FROM pg_type t
	JOIN pg_depend d
		ON d.classid = 'pg_type'::regclass AND d.objid = t.oid
		AND d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
	JOIN pg_extension e ON e.oid = d.refobjid
	WHERE t.typname = 'vector' AND t.typnamespace = '@extschema@'::regnamespace;
	IF vector_owner IS DISTINCT FROM 'knn_gpu' THEN
		RETURN;					-- pgvector's type and functions are used
	END IF;

	EXECUTE $create_vector_functions$

-- functions of one value

CREATE FUNCTION l2_normalize(vector) RETURNS vector
	AS 'MODULE_PATHNAME', 'knn_vector_l2_normalize' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION l2_normalize(vector) IS 'normalize with Euclidean norm';
CREATE FUNCTION subvector(vector, integer, integer) RETURNS vector
	AS 'MODULE_PATHNAME', 'knn_vector_subvector' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION subvector(vector, integer, integer) IS 'subvector';

-- the btree comparison function under pgvector's name (the operator class
-- of 10_vector.sql uses knn_vector_cmp, the same C function)

CREATE FUNCTION vector_cmp(vector, vector) RETURNS integer
	AS 'MODULE_PATHNAME', 'knn_vector_cmp' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION vector_cmp(vector, vector) IS 'less-equal-greater';

-- the cast functions under pgvector's names (the casts of 10_vector.sql
-- call the knn_* SQL functions, the same C functions)

CREATE FUNCTION vector(vector, integer, boolean) RETURNS vector
	AS 'MODULE_PATHNAME', 'knn_vector_typmod_cast' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION vector(vector, integer, boolean) IS 'adjust vector to typmod';
CREATE FUNCTION array_to_vector(integer[], integer, boolean) RETURNS vector
	AS 'MODULE_PATHNAME', 'knn_array_to_vector' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION array_to_vector(integer[], integer, boolean) IS 'convert int4 array to vector';
CREATE FUNCTION array_to_vector(real[], integer, boolean) RETURNS vector
	AS 'MODULE_PATHNAME', 'knn_array_to_vector' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION array_to_vector(real[], integer, boolean) IS 'convert float4 array to vector';
CREATE FUNCTION array_to_vector(double precision[], integer, boolean) RETURNS vector
	AS 'MODULE_PATHNAME', 'knn_array_to_vector' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION array_to_vector(double precision[], integer, boolean) IS 'convert float8 array to vector';
CREATE FUNCTION array_to_vector(numeric[], integer, boolean) RETURNS vector
	AS 'MODULE_PATHNAME', 'knn_array_to_vector' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION array_to_vector(numeric[], integer, boolean) IS 'convert numeric array to vector';
CREATE FUNCTION vector_to_float4(vector, integer, boolean) RETURNS real[]
	AS 'MODULE_PATHNAME', 'knn_vector_to_float4' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION vector_to_float4(vector, integer, boolean) IS 'convert vector to float4 array';

-- arithmetic and concatenation, element by element

CREATE FUNCTION knn_vector_add(vector, vector) RETURNS vector
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION knn_vector_add(vector, vector) IS 'implementation of + operator';
CREATE FUNCTION knn_vector_sub(vector, vector) RETURNS vector
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION knn_vector_sub(vector, vector) IS 'implementation of - operator';
CREATE FUNCTION knn_vector_mul(vector, vector) RETURNS vector
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION knn_vector_mul(vector, vector) IS 'implementation of * operator';
CREATE FUNCTION knn_vector_concat(vector, vector) RETURNS vector
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION knn_vector_concat(vector, vector) IS 'implementation of || operator';

CREATE OPERATOR + (
	LEFTARG = vector, RIGHTARG = vector, FUNCTION = knn_vector_add, COMMUTATOR = +
);
COMMENT ON OPERATOR + (vector, vector) IS 'add';
CREATE OPERATOR - (
	LEFTARG = vector, RIGHTARG = vector, FUNCTION = knn_vector_sub
);
COMMENT ON OPERATOR - (vector, vector) IS 'subtract';
CREATE OPERATOR * (
	LEFTARG = vector, RIGHTARG = vector, FUNCTION = knn_vector_mul, COMMUTATOR = *
);
COMMENT ON OPERATOR * (vector, vector) IS 'multiply';
-- without it, '[1,2]'::vector || '[3]' would be text concatenation
CREATE OPERATOR || (
	LEFTARG = vector, RIGHTARG = vector, FUNCTION = knn_vector_concat
);
COMMENT ON OPERATOR || (vector, vector) IS 'concatenate';

-- aggregates: parallel-safe, with combine functions

CREATE FUNCTION vector_accum(double precision[], vector) RETURNS double precision[]
	AS 'MODULE_PATHNAME', 'knn_vector_accum' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION vector_accum(double precision[], vector) IS 'aggregate transition function';
CREATE FUNCTION vector_combine(double precision[], double precision[]) RETURNS double precision[]
	AS 'MODULE_PATHNAME', 'knn_vector_combine' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION vector_combine(double precision[], double precision[]) IS 'aggregate combine function';
CREATE FUNCTION vector_avg(double precision[]) RETURNS vector
	AS 'MODULE_PATHNAME', 'knn_vector_avg' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION vector_avg(double precision[]) IS 'aggregate final function';

CREATE AGGREGATE avg(vector) (
	SFUNC = vector_accum,
	STYPE = double precision[],
	FINALFUNC = vector_avg,
	COMBINEFUNC = vector_combine,
	INITCOND = '{0}',
	PARALLEL = SAFE
);
COMMENT ON AGGREGATE avg(vector) IS 'the average (arithmetic mean) as vector of all vector values';
CREATE AGGREGATE sum(vector) (
	SFUNC = knn_vector_add,
	STYPE = vector,
	COMBINEFUNC = knn_vector_add,
	PARALLEL = SAFE
);
COMMENT ON AGGREGATE sum(vector) IS 'sum as vector across all vector input values';

	$create_vector_functions$;
END
$knn_vector_functions$;
