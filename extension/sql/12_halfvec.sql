-- ---------------------------------------------------------------------------
-- The halfvec type, pgvector-compatible (same storage, text and binary
-- forms, distance operators, casts), created exactly when knn_gpu created
-- its own vector type (10_vector.sql): the same coexistence rule. Where
-- pgvector's "vector" is used, pgvector's halfvec (0.7.0 and later) is
-- too, and knn_gpu creates none of the objects below. A "halfvec" type of
-- anyone else in the schema is an error, as for "vector".
-- ---------------------------------------------------------------------------

DO $knn_halfvec$
DECLARE
	vector_owner name;
	existing_type oid;
	existing_owner name;
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

	SELECT t.oid, e.extname INTO existing_type, existing_owner
	FROM pg_type t
	LEFT JOIN pg_depend d
		ON d.classid = 'pg_type'::regclass AND d.objid = t.oid
		AND d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
	LEFT JOIN pg_extension e ON e.oid = d.refobjid
	WHERE t.typname = 'halfvec' AND t.typnamespace = '@extschema@'::regnamespace;
	IF existing_type IS NOT NULL THEN
		RAISE EXCEPTION 'type "halfvec" already exists in schema @extschema@'
			USING ERRCODE = 'duplicate_object',
				  HINT = 'Install knn_gpu into a schema of its own: CREATE SCHEMA knn_gpu; CREATE EXTENSION knn_gpu SCHEMA knn_gpu;';
	END IF;

	EXECUTE $create_halfvec_type$

CREATE TYPE halfvec;

CREATE FUNCTION knn_halfvec_in(cstring, oid, integer) RETURNS halfvec
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION knn_halfvec_out(halfvec) RETURNS cstring
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION knn_halfvec_typmod_in(cstring[]) RETURNS integer
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION knn_halfvec_recv(internal, oid, integer) RETURNS halfvec
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION knn_halfvec_send(halfvec) RETURNS bytea
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

-- pgvector's halfvec has no TYPMOD_OUT either: halfvec(3) prints as such.
CREATE TYPE halfvec (
	INPUT = knn_halfvec_in,
	OUTPUT = knn_halfvec_out,
	TYPMOD_IN = knn_halfvec_typmod_in,
	RECEIVE = knn_halfvec_recv,
	SEND = knn_halfvec_send,
	STORAGE = external
);
COMMENT ON TYPE halfvec IS 'half-precision vector (knn_gpu, pgvector-compatible)';

CREATE FUNCTION vector_dims(halfvec) RETURNS integer
	AS 'MODULE_PATHNAME', 'knn_halfvec_dims' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION vector_dims(halfvec) IS 'number of dimensions';

-- distances (float8): the vector distances of the widened values

CREATE FUNCTION l2_distance(halfvec, halfvec) RETURNS float8
	AS 'MODULE_PATHNAME', 'knn_halfvec_l2_distance' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE
	SUPPORT knn_distance_support;
COMMENT ON FUNCTION l2_distance(halfvec, halfvec) IS 'Euclidean distance';
CREATE FUNCTION inner_product(halfvec, halfvec) RETURNS float8
	AS 'MODULE_PATHNAME', 'knn_halfvec_inner_product' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION inner_product(halfvec, halfvec) IS 'inner product';
CREATE FUNCTION negative_inner_product(halfvec, halfvec) RETURNS float8
	AS 'MODULE_PATHNAME', 'knn_halfvec_negative_inner_product' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE
	SUPPORT knn_distance_support;
COMMENT ON FUNCTION negative_inner_product(halfvec, halfvec) IS 'negative inner product (the <#> operator)';
CREATE FUNCTION cosine_distance(halfvec, halfvec) RETURNS float8
	AS 'MODULE_PATHNAME', 'knn_halfvec_cosine_distance' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE
	SUPPORT knn_distance_support;
COMMENT ON FUNCTION cosine_distance(halfvec, halfvec) IS 'cosine distance';
CREATE FUNCTION l1_distance(halfvec, halfvec) RETURNS float8
	AS 'MODULE_PATHNAME', 'knn_halfvec_l1_distance' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE
	SUPPORT knn_distance_support;
COMMENT ON FUNCTION l1_distance(halfvec, halfvec) IS 'taxicab distance';

CREATE OPERATOR <-> (
	LEFTARG = halfvec, RIGHTARG = halfvec, FUNCTION = l2_distance, COMMUTATOR = <->
);
CREATE OPERATOR <#> (
	LEFTARG = halfvec, RIGHTARG = halfvec, FUNCTION = negative_inner_product, COMMUTATOR = <#>
);
CREATE OPERATOR <=> (
	LEFTARG = halfvec, RIGHTARG = halfvec, FUNCTION = cosine_distance, COMMUTATOR = <=>
);
CREATE OPERATOR <+> (
	LEFTARG = halfvec, RIGHTARG = halfvec, FUNCTION = l1_distance, COMMUTATOR = <+>
);

-- casts, with pgvector's contexts; the typmod argument carries halfvec(n)

CREATE FUNCTION knn_halfvec_typmod_cast(halfvec, integer, boolean) RETURNS halfvec
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION knn_halfvec_to_vector(halfvec, integer, boolean) RETURNS vector
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION knn_vector_to_halfvec(vector, integer, boolean) RETURNS halfvec
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION knn_halfvec_to_float4(halfvec, integer, boolean) RETURNS real[]
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION knn_array_to_halfvec(integer[], integer, boolean) RETURNS halfvec
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION knn_array_to_halfvec(real[], integer, boolean) RETURNS halfvec
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION knn_array_to_halfvec(double precision[], integer, boolean) RETURNS halfvec
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION knn_array_to_halfvec(numeric[], integer, boolean) RETURNS halfvec
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE CAST (halfvec AS halfvec)
	WITH FUNCTION knn_halfvec_typmod_cast(halfvec, integer, boolean) AS IMPLICIT;
CREATE CAST (halfvec AS vector)
	WITH FUNCTION knn_halfvec_to_vector(halfvec, integer, boolean) AS ASSIGNMENT;
CREATE CAST (vector AS halfvec)
	WITH FUNCTION knn_vector_to_halfvec(vector, integer, boolean) AS IMPLICIT;
CREATE CAST (halfvec AS real[])
	WITH FUNCTION knn_halfvec_to_float4(halfvec, integer, boolean) AS ASSIGNMENT;
CREATE CAST (integer[] AS halfvec)
	WITH FUNCTION knn_array_to_halfvec(integer[], integer, boolean) AS ASSIGNMENT;
CREATE CAST (real[] AS halfvec)
	WITH FUNCTION knn_array_to_halfvec(real[], integer, boolean) AS ASSIGNMENT;
CREATE CAST (double precision[] AS halfvec)
	WITH FUNCTION knn_array_to_halfvec(double precision[], integer, boolean) AS ASSIGNMENT;
CREATE CAST (numeric[] AS halfvec)
	WITH FUNCTION knn_array_to_halfvec(numeric[], integer, boolean) AS ASSIGNMENT;

	$create_halfvec_type$;
END
$knn_halfvec$;
