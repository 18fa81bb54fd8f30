-- ---------------------------------------------------------------------------
-- pgvector's functions, operators, aggregates and operator class of the
-- halfvec type that the type's own part (12_halfvec.sql) and 14_bit.sql
-- (binary_quantize) do not define: + - * ||, the comparison operators,
-- halfvec_cmp and the btree class halfvec_ops, l2_norm, l2_normalize,
-- subvector, avg and sum with their support functions, the index support
-- distances (halfvec_l2_squared_distance, halfvec_negative_inner_product,
-- halfvec_spherical_distance), and the cast functions under pgvector's
-- names. Same results and errors as pgvector's.
--
-- Created exactly when knn_gpu created its own halfvec type (12_halfvec.sql,
-- itself only with knn_gpu's own vector): where pgvector's types are used,
-- pgvector has all of these, and knn_gpu creates none of them.
--
-- The SQL functions have pgvector's names (they take knn_gpu's halfvec, so
-- they clash with nothing of pgvector's in another schema); the C functions
-- are knn_*, so that both libraries load in one backend.
-- ---------------------------------------------------------------------------

DO $knn_halfvec_functions$
DECLARE
	halfvec_owner name;
BEGIN
	SELECT e.extname INTO halfvec_owner
	FROM pg_type t
	JOIN pg_depend d
		ON d.classid = 'pg_type'::regclass AND d.objid = t.oid
		AND d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
	JOIN pg_extension e ON e.oid = d.refobjid
	WHERE t.typname = 'halfvec' AND t.typnamespace = '@extschema@'::regnamespace;
	IF halfvec_owner IS DISTINCT FROM 'knn_gpu' THEN
		RETURN;					-- pgvector's type and functions are used
	END IF;

	EXECUTE $create_halfvec_functions$

-- functions of one value

CREATE FUNCTION l2_norm(halfvec) RETURNS float8
	AS 'MODULE_PATHNAME', 'knn_halfvec_l2_norm' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION l2_norm(halfvec) IS 'Euclidean norm';
CREATE FUNCTION l2_normalize(halfvec) RETURNS halfvec
	AS 'MODULE_PATHNAME', 'knn_halfvec_l2_normalize' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION l2_normalize(halfvec) IS 'normalize with Euclidean norm';
CREATE FUNCTION subvector(halfvec, integer, integer) RETURNS halfvec
	AS 'MODULE_PATHNAME', 'knn_halfvec_subvector' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION subvector(halfvec, integer, integer) IS 'subvector';

-- pgvector's index support distances, callable by name (knn_gpu builds no
-- index; <#> of 12_halfvec.sql calls the same C function as
-- halfvec_negative_inner_product)

CREATE FUNCTION halfvec_l2_squared_distance(halfvec, halfvec) RETURNS float8
	AS 'MODULE_PATHNAME', 'knn_halfvec_l2_squared_distance' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION halfvec_l2_squared_distance(halfvec, halfvec) IS 'squared Euclidean distance';
CREATE FUNCTION halfvec_negative_inner_product(halfvec, halfvec) RETURNS float8
	AS 'MODULE_PATHNAME', 'knn_halfvec_negative_inner_product' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION halfvec_negative_inner_product(halfvec, halfvec) IS 'negative inner product';
CREATE FUNCTION halfvec_spherical_distance(halfvec, halfvec) RETURNS float8
	AS 'MODULE_PATHNAME', 'knn_halfvec_spherical_distance' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION halfvec_spherical_distance(halfvec, halfvec) IS 'spherical distance';

-- the cast functions under pgvector's names (the casts of 12_halfvec.sql
-- call the knn_* SQL functions, the same C functions)

CREATE FUNCTION halfvec(halfvec, integer, boolean) RETURNS halfvec
	AS 'MODULE_PATHNAME', 'knn_halfvec_typmod_cast' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION halfvec(halfvec, integer, boolean) IS 'adjust halfvec to typmod';
CREATE FUNCTION halfvec_to_vector(halfvec, integer, boolean) RETURNS vector
	AS 'MODULE_PATHNAME', 'knn_halfvec_to_vector' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION halfvec_to_vector(halfvec, integer, boolean) IS 'convert halfvec to vector';
CREATE FUNCTION vector_to_halfvec(vector, integer, boolean) RETURNS halfvec
	AS 'MODULE_PATHNAME', 'knn_vector_to_halfvec' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION vector_to_halfvec(vector, integer, boolean) IS 'convert vector to halfvec';
CREATE FUNCTION array_to_halfvec(integer[], integer, boolean) RETURNS halfvec
	AS 'MODULE_PATHNAME', 'knn_array_to_halfvec' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION array_to_halfvec(integer[], integer, boolean) IS 'convert int4 array to halfvec';
CREATE FUNCTION array_to_halfvec(real[], integer, boolean) RETURNS halfvec
	AS 'MODULE_PATHNAME', 'knn_array_to_halfvec' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION array_to_halfvec(real[], integer, boolean) IS 'convert float4 array to halfvec';
CREATE FUNCTION array_to_halfvec(double precision[], integer, boolean) RETURNS halfvec
	AS 'MODULE_PATHNAME', 'knn_array_to_halfvec' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION array_to_halfvec(double precision[], integer, boolean) IS 'convert float8 array to halfvec';
CREATE FUNCTION array_to_halfvec(numeric[], integer, boolean) RETURNS halfvec
	AS 'MODULE_PATHNAME', 'knn_array_to_halfvec' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION array_to_halfvec(numeric[], integer, boolean) IS 'convert numeric array to halfvec';
CREATE FUNCTION halfvec_to_float4(halfvec, integer, boolean) RETURNS real[]
	AS 'MODULE_PATHNAME', 'knn_halfvec_to_float4' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION halfvec_to_float4(halfvec, integer, boolean) IS 'convert halfvec to float4 array';

-- arithmetic and concatenation, element by element

CREATE FUNCTION halfvec_add(halfvec, halfvec) RETURNS halfvec
	AS 'MODULE_PATHNAME', 'knn_halfvec_add' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION halfvec_add(halfvec, halfvec) IS 'implementation of + operator';
CREATE FUNCTION halfvec_sub(halfvec, halfvec) RETURNS halfvec
	AS 'MODULE_PATHNAME', 'knn_halfvec_sub' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION halfvec_sub(halfvec, halfvec) IS 'implementation of - operator';
CREATE FUNCTION halfvec_mul(halfvec, halfvec) RETURNS halfvec
	AS 'MODULE_PATHNAME', 'knn_halfvec_mul' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION halfvec_mul(halfvec, halfvec) IS 'implementation of * operator';
CREATE FUNCTION halfvec_concat(halfvec, halfvec) RETURNS halfvec
	AS 'MODULE_PATHNAME', 'knn_halfvec_concat' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION halfvec_concat(halfvec, halfvec) IS 'implementation of || operator';

CREATE OPERATOR + (
	LEFTARG = halfvec, RIGHTARG = halfvec, FUNCTION = halfvec_add, COMMUTATOR = +
);
COMMENT ON OPERATOR + (halfvec, halfvec) IS 'add';
CREATE OPERATOR - (
	LEFTARG = halfvec, RIGHTARG = halfvec, FUNCTION = halfvec_sub
);
COMMENT ON OPERATOR - (halfvec, halfvec) IS 'subtract';
CREATE OPERATOR * (
	LEFTARG = halfvec, RIGHTARG = halfvec, FUNCTION = halfvec_mul, COMMUTATOR = *
);
COMMENT ON OPERATOR * (halfvec, halfvec) IS 'multiply';
-- without it, '[1,2]'::halfvec || '[3]' would be text concatenation
CREATE OPERATOR || (
	LEFTARG = halfvec, RIGHTARG = halfvec, FUNCTION = halfvec_concat
);
COMMENT ON OPERATOR || (halfvec, halfvec) IS 'concatenate';

-- comparison, and the btree operator class (ORDER BY, DISTINCT, indexes)

CREATE FUNCTION halfvec_lt(halfvec, halfvec) RETURNS boolean
	AS 'MODULE_PATHNAME', 'knn_halfvec_lt' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION halfvec_lt(halfvec, halfvec) IS 'implementation of < operator';
CREATE FUNCTION halfvec_le(halfvec, halfvec) RETURNS boolean
	AS 'MODULE_PATHNAME', 'knn_halfvec_le' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION halfvec_le(halfvec, halfvec) IS 'implementation of <= operator';
CREATE FUNCTION halfvec_eq(halfvec, halfvec) RETURNS boolean
	AS 'MODULE_PATHNAME', 'knn_halfvec_eq' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION halfvec_eq(halfvec, halfvec) IS 'implementation of = operator';
CREATE FUNCTION halfvec_ne(halfvec, halfvec) RETURNS boolean
	AS 'MODULE_PATHNAME', 'knn_halfvec_ne' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION halfvec_ne(halfvec, halfvec) IS 'implementation of <> operator';
CREATE FUNCTION halfvec_ge(halfvec, halfvec) RETURNS boolean
	AS 'MODULE_PATHNAME', 'knn_halfvec_ge' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION halfvec_ge(halfvec, halfvec) IS 'implementation of >= operator';
CREATE FUNCTION halfvec_gt(halfvec, halfvec) RETURNS boolean
	AS 'MODULE_PATHNAME', 'knn_halfvec_gt' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION halfvec_gt(halfvec, halfvec) IS 'implementation of > operator';
CREATE FUNCTION halfvec_cmp(halfvec, halfvec) RETURNS integer
	AS 'MODULE_PATHNAME', 'knn_halfvec_cmp' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION halfvec_cmp(halfvec, halfvec) IS 'less-equal-greater';

CREATE OPERATOR < (
	LEFTARG = halfvec, RIGHTARG = halfvec, FUNCTION = halfvec_lt,
	COMMUTATOR = >, NEGATOR = >=, RESTRICT = scalarltsel, JOIN = scalarltjoinsel
);
COMMENT ON OPERATOR < (halfvec, halfvec) IS 'less than';
CREATE OPERATOR <= (
	LEFTARG = halfvec, RIGHTARG = halfvec, FUNCTION = halfvec_le,
	COMMUTATOR = >=, NEGATOR = >, RESTRICT = scalarlesel, JOIN = scalarlejoinsel
);
COMMENT ON OPERATOR <= (halfvec, halfvec) IS 'less than or equal';
CREATE OPERATOR = (
	LEFTARG = halfvec, RIGHTARG = halfvec, FUNCTION = halfvec_eq,
	COMMUTATOR = =, NEGATOR = <>, RESTRICT = eqsel, JOIN = eqjoinsel
);
COMMENT ON OPERATOR = (halfvec, halfvec) IS 'equal';
CREATE OPERATOR <> (
	LEFTARG = halfvec, RIGHTARG = halfvec, FUNCTION = halfvec_ne,
	COMMUTATOR = <>, NEGATOR = =, RESTRICT = eqsel, JOIN = eqjoinsel
);
COMMENT ON OPERATOR <> (halfvec, halfvec) IS 'not equal';
CREATE OPERATOR >= (
	LEFTARG = halfvec, RIGHTARG = halfvec, FUNCTION = halfvec_ge,
	COMMUTATOR = <=, NEGATOR = <, RESTRICT = scalargesel, JOIN = scalargejoinsel
);
COMMENT ON OPERATOR >= (halfvec, halfvec) IS 'greater than or equal';
CREATE OPERATOR > (
	LEFTARG = halfvec, RIGHTARG = halfvec, FUNCTION = halfvec_gt,
	COMMUTATOR = <, NEGATOR = <=, RESTRICT = scalargtsel, JOIN = scalargtjoinsel
);
COMMENT ON OPERATOR > (halfvec, halfvec) IS 'greater than';

CREATE OPERATOR CLASS halfvec_ops
	DEFAULT FOR TYPE halfvec USING btree AS
	OPERATOR 1 <,
	OPERATOR 2 <=,
	OPERATOR 3 =,
	OPERATOR 4 >=,
	OPERATOR 5 >,
	FUNCTION 1 halfvec_cmp(halfvec, halfvec);

-- aggregates: parallel-safe, with combine functions; avg's state is
-- avg(vector)'s, so its combine function is vector_combine's C function

CREATE FUNCTION halfvec_accum(double precision[], halfvec) RETURNS double precision[]
	AS 'MODULE_PATHNAME', 'knn_halfvec_accum' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION halfvec_accum(double precision[], halfvec) IS 'aggregate transition function';
CREATE FUNCTION halfvec_avg(double precision[]) RETURNS halfvec
	AS 'MODULE_PATHNAME', 'knn_halfvec_avg' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION halfvec_avg(double precision[]) IS 'aggregate final function';
CREATE FUNCTION halfvec_combine(double precision[], double precision[]) RETURNS double precision[]
	AS 'MODULE_PATHNAME', 'knn_vector_combine' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION halfvec_combine(double precision[], double precision[]) IS 'aggregate combine function';

CREATE AGGREGATE avg(halfvec) (
	SFUNC = halfvec_accum,
	STYPE = double precision[],
	FINALFUNC = halfvec_avg,
	COMBINEFUNC = halfvec_combine,
	INITCOND = '{0}',
	PARALLEL = SAFE
);
COMMENT ON AGGREGATE avg(halfvec) IS 'the average (arithmetic mean) as halfvec of all halfvec values';
CREATE AGGREGATE sum(halfvec) (
	SFUNC = halfvec_add,
	STYPE = halfvec,
	COMBINEFUNC = halfvec_add,
	PARALLEL = SAFE
);
COMMENT ON AGGREGATE sum(halfvec) IS 'sum as halfvec across all halfvec input values';

	$create_halfvec_functions$;
END
$knn_halfvec_functions$;
