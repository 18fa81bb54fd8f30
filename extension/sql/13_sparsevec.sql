-- ---------------------------------------------------------------------------
-- The sparsevec type, pgvector-compatible (same storage, text and binary
-- forms, distance functions and operators, btree order, casts with
-- pgvector's contexts), created exactly when knn_gpu created its own vector
-- type (10_vector.sql): the same coexistence rule. Where pgvector's
-- "vector" is used, pgvector's sparsevec is too, and knn_gpu creates none
-- of the objects below. A "sparsevec" type of anyone else in the schema is
-- an error, as for "vector".
--
-- After 10_vector.sql and 12_halfvec.sql: the casts to and from vector and
-- halfvec need both types. The type's input/output functions are named
-- knn_* like vector's and halfvec's; every function a user may call by
-- name has pgvector's name (sparsevec_cmp, array_to_sparsevec, ...), with
-- a C function named knn_*. pgvector's hnsw operator classes are not
-- created: knn_gpu has no index access method.
-- ---------------------------------------------------------------------------

DO $knn_sparsevec$
DECLARE
	vector_owner name;
	existing_type oid;
BEGIN
	SELECT e.extname INTO vector_owner
	FROM pg_type t
	JOIN pg_depend d
		ON d.classid = 'pg_type'::regclass AND d.objid = t.oid
		AND d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
	JOIN pg_extension e ON e.oid = d.refobjid
	WHERE t.typname = 'vector' AND t.typnamespace = '@extschema@'::regnamespace;
	IF vector_owner IS DISTINCT FROM 'knn_gpu' THEN
		RETURN;					-- pgvector's types are used
	END IF;

	SELECT t.oid INTO existing_type
	FROM pg_type t
	WHERE t.typname = 'sparsevec' AND t.typnamespace = '@extschema@'::regnamespace;
	IF existing_type IS NOT NULL THEN
		RAISE EXCEPTION 'type "sparsevec" already exists in schema @extschema@'
			USING ERRCODE = 'duplicate_object',
				  HINT = 'Install knn_gpu into a schema of its own: CREATE SCHEMA knn_gpu; CREATE EXTENSION knn_gpu SCHEMA knn_gpu;';
	END IF;

	EXECUTE $create_sparsevec_type$

CREATE TYPE sparsevec;

CREATE FUNCTION knn_sparsevec_in(cstring, oid, integer) RETURNS sparsevec
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION knn_sparsevec_in(cstring, oid, integer) IS 'I/O';
CREATE FUNCTION knn_sparsevec_out(sparsevec) RETURNS cstring
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION knn_sparsevec_out(sparsevec) IS 'I/O';
CREATE FUNCTION knn_sparsevec_typmod_in(cstring[]) RETURNS integer
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION knn_sparsevec_typmod_in(cstring[]) IS 'I/O typmod';
CREATE FUNCTION knn_sparsevec_recv(internal, oid, integer) RETURNS sparsevec
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION knn_sparsevec_recv(internal, oid, integer) IS 'I/O';
CREATE FUNCTION knn_sparsevec_send(sparsevec) RETURNS bytea
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION knn_sparsevec_send(sparsevec) IS 'I/O';

-- as pgvector's: no TYPMOD_OUT (sparsevec(3) prints as such), stored
-- uncompressed (floats compress badly)
CREATE TYPE sparsevec (
	INPUT = knn_sparsevec_in,
	OUTPUT = knn_sparsevec_out,
	TYPMOD_IN = knn_sparsevec_typmod_in,
	RECEIVE = knn_sparsevec_recv,
	SEND = knn_sparsevec_send,
	STORAGE = external
);
COMMENT ON TYPE sparsevec IS 'single-precision sparse vector (knn_gpu, pgvector-compatible)';

-- distances (float8) and norms

CREATE FUNCTION l2_distance(sparsevec, sparsevec) RETURNS float8
	AS 'MODULE_PATHNAME', 'knn_sparsevec_l2_distance' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION l2_distance(sparsevec, sparsevec) IS 'Euclidean distance';
CREATE FUNCTION inner_product(sparsevec, sparsevec) RETURNS float8
	AS 'MODULE_PATHNAME', 'knn_sparsevec_inner_product' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION inner_product(sparsevec, sparsevec) IS 'inner product';
CREATE FUNCTION cosine_distance(sparsevec, sparsevec) RETURNS float8
	AS 'MODULE_PATHNAME', 'knn_sparsevec_cosine_distance' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION cosine_distance(sparsevec, sparsevec) IS 'cosine distance';
CREATE FUNCTION l1_distance(sparsevec, sparsevec) RETURNS float8
	AS 'MODULE_PATHNAME', 'knn_sparsevec_l1_distance' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION l1_distance(sparsevec, sparsevec) IS 'taxicab distance';
CREATE FUNCTION l2_norm(sparsevec) RETURNS float8
	AS 'MODULE_PATHNAME', 'knn_sparsevec_l2_norm' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION l2_norm(sparsevec) IS 'Euclidean norm';
CREATE FUNCTION l2_normalize(sparsevec) RETURNS sparsevec
	AS 'MODULE_PATHNAME', 'knn_sparsevec_l2_normalize' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION l2_normalize(sparsevec) IS 'normalize with Euclidean norm';
CREATE FUNCTION sparsevec_l2_squared_distance(sparsevec, sparsevec) RETURNS float8
	AS 'MODULE_PATHNAME', 'knn_sparsevec_l2_squared_distance' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sparsevec_l2_squared_distance(sparsevec, sparsevec) IS 'squared Euclidean distance';
CREATE FUNCTION sparsevec_negative_inner_product(sparsevec, sparsevec) RETURNS float8
	AS 'MODULE_PATHNAME', 'knn_sparsevec_negative_inner_product' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sparsevec_negative_inner_product(sparsevec, sparsevec) IS 'negative inner product';

CREATE OPERATOR <-> (
	LEFTARG = sparsevec, RIGHTARG = sparsevec, FUNCTION = l2_distance, COMMUTATOR = <->
);
CREATE OPERATOR <#> (
	LEFTARG = sparsevec, RIGHTARG = sparsevec, FUNCTION = sparsevec_negative_inner_product,
	COMMUTATOR = <#>
);
CREATE OPERATOR <=> (
	LEFTARG = sparsevec, RIGHTARG = sparsevec, FUNCTION = cosine_distance, COMMUTATOR = <=>
);
CREATE OPERATOR <+> (
	LEFTARG = sparsevec, RIGHTARG = sparsevec, FUNCTION = l1_distance, COMMUTATOR = <+>
);

-- comparison and the btree operator class

CREATE FUNCTION sparsevec_lt(sparsevec, sparsevec) RETURNS bool
	AS 'MODULE_PATHNAME', 'knn_sparsevec_lt' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sparsevec_lt(sparsevec, sparsevec) IS 'implementation of < operator';
CREATE FUNCTION sparsevec_le(sparsevec, sparsevec) RETURNS bool
	AS 'MODULE_PATHNAME', 'knn_sparsevec_le' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sparsevec_le(sparsevec, sparsevec) IS 'implementation of <= operator';
CREATE FUNCTION sparsevec_eq(sparsevec, sparsevec) RETURNS bool
	AS 'MODULE_PATHNAME', 'knn_sparsevec_eq' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sparsevec_eq(sparsevec, sparsevec) IS 'implementation of = operator';
CREATE FUNCTION sparsevec_ne(sparsevec, sparsevec) RETURNS bool
	AS 'MODULE_PATHNAME', 'knn_sparsevec_ne' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sparsevec_ne(sparsevec, sparsevec) IS 'implementation of <> operator';
CREATE FUNCTION sparsevec_ge(sparsevec, sparsevec) RETURNS bool
	AS 'MODULE_PATHNAME', 'knn_sparsevec_ge' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sparsevec_ge(sparsevec, sparsevec) IS 'implementation of >= operator';
CREATE FUNCTION sparsevec_gt(sparsevec, sparsevec) RETURNS bool
	AS 'MODULE_PATHNAME', 'knn_sparsevec_gt' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sparsevec_gt(sparsevec, sparsevec) IS 'implementation of > operator';
CREATE FUNCTION sparsevec_cmp(sparsevec, sparsevec) RETURNS integer
	AS 'MODULE_PATHNAME', 'knn_sparsevec_cmp' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sparsevec_cmp(sparsevec, sparsevec) IS 'less-equal-greater';

CREATE OPERATOR < (
	LEFTARG = sparsevec, RIGHTARG = sparsevec, FUNCTION = sparsevec_lt,
	COMMUTATOR = >, NEGATOR = >=, RESTRICT = scalarltsel, JOIN = scalarltjoinsel
);
COMMENT ON OPERATOR < (sparsevec, sparsevec) IS 'less than';
CREATE OPERATOR <= (
	LEFTARG = sparsevec, RIGHTARG = sparsevec, FUNCTION = sparsevec_le,
	COMMUTATOR = >=, NEGATOR = >, RESTRICT = scalarlesel, JOIN = scalarlejoinsel
);
COMMENT ON OPERATOR <= (sparsevec, sparsevec) IS 'less than or equal';
CREATE OPERATOR = (
	LEFTARG = sparsevec, RIGHTARG = sparsevec, FUNCTION = sparsevec_eq,
	COMMUTATOR = =, NEGATOR = <>, RESTRICT = eqsel, JOIN = eqjoinsel
);
COMMENT ON OPERATOR = (sparsevec, sparsevec) IS 'equal';
CREATE OPERATOR <> (
	LEFTARG = sparsevec, RIGHTARG = sparsevec, FUNCTION = sparsevec_ne,
	COMMUTATOR = <>, NEGATOR = =, RESTRICT = eqsel, JOIN = eqjoinsel
);
COMMENT ON OPERATOR <> (sparsevec, sparsevec) IS 'not equal';
CREATE OPERATOR >= (
	LEFTARG = sparsevec, RIGHTARG = sparsevec, FUNCTION = sparsevec_ge,
	COMMUTATOR = <=, NEGATOR = <, RESTRICT = scalargesel, JOIN = scalargejoinsel
);
COMMENT ON OPERATOR >= (sparsevec, sparsevec) IS 'greater than or equal';
CREATE OPERATOR > (
	LEFTARG = sparsevec, RIGHTARG = sparsevec, FUNCTION = sparsevec_gt,
	COMMUTATOR = <, NEGATOR = <=, RESTRICT = scalargtsel, JOIN = scalargtjoinsel
);
COMMENT ON OPERATOR > (sparsevec, sparsevec) IS 'greater than';

CREATE OPERATOR CLASS sparsevec_ops
	DEFAULT FOR TYPE sparsevec USING btree AS
	OPERATOR 1 <,
	OPERATOR 2 <=,
	OPERATOR 3 =,
	OPERATOR 4 >=,
	OPERATOR 5 >,
	FUNCTION 1 sparsevec_cmp(sparsevec, sparsevec);

-- casts, with pgvector's contexts; the typmod argument carries sparsevec(n)

CREATE FUNCTION sparsevec(sparsevec, integer, boolean) RETURNS sparsevec
	AS 'MODULE_PATHNAME', 'knn_sparsevec_typmod_cast' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sparsevec(sparsevec, integer, boolean) IS 'adjust sparsevec to typmod';
CREATE FUNCTION vector_to_sparsevec(vector, integer, boolean) RETURNS sparsevec
	AS 'MODULE_PATHNAME', 'knn_vector_to_sparsevec' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION vector_to_sparsevec(vector, integer, boolean) IS 'convert vector to sparsevec';
CREATE FUNCTION sparsevec_to_vector(sparsevec, integer, boolean) RETURNS vector
	AS 'MODULE_PATHNAME', 'knn_sparsevec_to_vector' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sparsevec_to_vector(sparsevec, integer, boolean) IS 'convert sparsevec to vector';
CREATE FUNCTION halfvec_to_sparsevec(halfvec, integer, boolean) RETURNS sparsevec
	AS 'MODULE_PATHNAME', 'knn_halfvec_to_sparsevec' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION halfvec_to_sparsevec(halfvec, integer, boolean) IS 'convert halfvec to sparsevec';
CREATE FUNCTION sparsevec_to_halfvec(sparsevec, integer, boolean) RETURNS halfvec
	AS 'MODULE_PATHNAME', 'knn_sparsevec_to_halfvec' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION sparsevec_to_halfvec(sparsevec, integer, boolean) IS 'convert sparsevec to halfvec';
CREATE FUNCTION array_to_sparsevec(integer[], integer, boolean) RETURNS sparsevec
	AS 'MODULE_PATHNAME', 'knn_array_to_sparsevec' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION array_to_sparsevec(integer[], integer, boolean) IS 'convert int4 array to sparsevec';
CREATE FUNCTION array_to_sparsevec(real[], integer, boolean) RETURNS sparsevec
	AS 'MODULE_PATHNAME', 'knn_array_to_sparsevec' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION array_to_sparsevec(real[], integer, boolean) IS 'convert float4 array to sparsevec';
CREATE FUNCTION array_to_sparsevec(double precision[], integer, boolean) RETURNS sparsevec
	AS 'MODULE_PATHNAME', 'knn_array_to_sparsevec' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION array_to_sparsevec(double precision[], integer, boolean) IS 'convert float8 array to sparsevec';
CREATE FUNCTION array_to_sparsevec(numeric[], integer, boolean) RETURNS sparsevec
	AS 'MODULE_PATHNAME', 'knn_array_to_sparsevec' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION array_to_sparsevec(numeric[], integer, boolean) IS 'convert numeric array to sparsevec';

CREATE CAST (sparsevec AS sparsevec)
	WITH FUNCTION sparsevec(sparsevec, integer, boolean) AS IMPLICIT;
CREATE CAST (sparsevec AS vector)
	WITH FUNCTION sparsevec_to_vector(sparsevec, integer, boolean) AS ASSIGNMENT;
CREATE CAST (vector AS sparsevec)
	WITH FUNCTION vector_to_sparsevec(vector, integer, boolean) AS IMPLICIT;
CREATE CAST (sparsevec AS halfvec)
	WITH FUNCTION sparsevec_to_halfvec(sparsevec, integer, boolean) AS ASSIGNMENT;
CREATE CAST (halfvec AS sparsevec)
	WITH FUNCTION halfvec_to_sparsevec(halfvec, integer, boolean) AS IMPLICIT;
CREATE CAST (integer[] AS sparsevec)
	WITH FUNCTION array_to_sparsevec(integer[], integer, boolean) AS ASSIGNMENT;
CREATE CAST (real[] AS sparsevec)
	WITH FUNCTION array_to_sparsevec(real[], integer, boolean) AS ASSIGNMENT;
CREATE CAST (double precision[] AS sparsevec)
	WITH FUNCTION array_to_sparsevec(double precision[], integer, boolean) AS ASSIGNMENT;
CREATE CAST (numeric[] AS sparsevec)
	WITH FUNCTION array_to_sparsevec(numeric[], integer, boolean) AS ASSIGNMENT;

	$create_sparsevec_type$;
END
$knn_sparsevec$;
