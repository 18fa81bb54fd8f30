-- ---------------------------------------------------------------------------
-- The vector type, pgvector-compatible (same storage, text and binary forms,
-- operators, casts), unless pgvector's own type is already there.
--
-- Coexistence with pgvector: when the extension "vector" (pgvector) already
-- has its type "vector" in the schema knn_gpu is being installed into,
-- knn_gpu uses that type (the layout is the same) and creates none of the
-- objects below (and records that knn_gpu depends on pgvector). Otherwise
-- knn_gpu creates its own type; pgvector then has to go to another schema.
-- The objects are created by EXECUTE inside the DO block; being created
-- during CREATE EXTENSION, they are still members of knn_gpu (dropped with
-- it, not dumped by pg_dump on their own). MODULE_PATHNAME and @extschema@
-- are replaced in the whole script, string literals included.
--
-- The functions behind the type are named knn_* in SQL and in C, never like
-- pgvector's, so that both libraries can be loaded in one backend and both
-- extensions can live in one database (in two schemas).
-- ---------------------------------------------------------------------------

DO $knn_vector$
DECLARE
	existing_type oid;
	existing_owner name;
BEGIN
	SELECT t.oid, e.extname INTO existing_type, existing_owner
	FROM pg_type t
	LEFT JOIN pg_depend d
		ON d.classid = 'pg_type'::regclass AND d.objid = t.oid
		AND d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
	LEFT JOIN pg_extension e ON e.oid = d.refobjid
	WHERE t.typname = 'vector'
		AND t.typnamespace = '@extschema@'::regnamespace;

	IF existing_type IS NOT NULL THEN
		IF existing_owner IS DISTINCT FROM 'vector' THEN
			RAISE EXCEPTION 'type "vector" already exists in schema @extschema@ and is not pgvector''s'
				USING ERRCODE = 'duplicate_object',
					  HINT = 'Install knn_gpu into a schema of its own: CREATE SCHEMA knn_gpu; CREATE EXTENSION knn_gpu SCHEMA knn_gpu;';
		END IF;
		-- pgvector's type: use it as it is. Record that knn_gpu now needs
		-- pgvector, as "requires" in a control file would: pg_dump then
		-- restores pgvector first (sorted by name, knn_gpu would come first,
		-- create its own type, and pgvector's CREATE TYPE would fail), and
		-- DROP EXTENSION vector asks for CASCADE.
		INSERT INTO pg_catalog.pg_depend
			(classid, objid, objsubid, refclassid, refobjid, refobjsubid, deptype)
		SELECT 'pg_extension'::regclass, knn.oid, 0, 'pg_extension'::regclass, pgvector.oid, 0, 'n'
		FROM pg_extension knn, pg_extension pgvector
		WHERE knn.extname = 'knn_gpu' AND pgvector.extname = 'vector';
		-- pgvector's operators call no knn_gpu function, so nothing loads
		-- knn_gpu's planner hook in a new session before its first KNN query.
		-- (A NOTICE would not be seen: extension scripts run with
		-- client_min_messages raised to WARNING.)
		RAISE WARNING 'knn_gpu uses pgvector''s type "vector"'
			USING DETAIL = 'Until knn_gpu''s library is loaded in a session, LATERAL top-k queries with pgvector''s operators keep PostgreSQL''s plan.',
				  HINT = 'Load it for every session: ALTER SYSTEM SET session_preload_libraries = ''knn_gpu''; SELECT pg_reload_conf(); (or ALTER DATABASE ... SET, or LOAD ''knn_gpu'' in a session).';
		RETURN;
	END IF;

	EXECUTE $create_vector_type$

-- the type and its input/output functions

CREATE TYPE vector;

CREATE FUNCTION knn_vector_in(cstring, oid, integer) RETURNS vector
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION knn_vector_out(vector) RETURNS cstring
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION knn_vector_typmod_in(cstring[]) RETURNS integer
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION knn_vector_typmod_out(integer) RETURNS cstring
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION knn_vector_recv(internal, oid, integer) RETURNS vector
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION knn_vector_send(vector) RETURNS bytea
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

-- STORAGE external: stored uncompressed, like pgvector (floats compress badly)
CREATE TYPE vector (
	INPUT = knn_vector_in,
	OUTPUT = knn_vector_out,
	TYPMOD_IN = knn_vector_typmod_in,
	TYPMOD_OUT = knn_vector_typmod_out,
	RECEIVE = knn_vector_recv,
	SEND = knn_vector_send,
	STORAGE = external
);
COMMENT ON TYPE vector IS 'single-precision vector (knn_gpu, pgvector-compatible)';

-- functions of one value

CREATE FUNCTION vector_dims(vector) RETURNS integer
	AS 'MODULE_PATHNAME', 'knn_vector_dims' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION vector_dims(vector) IS 'number of dimensions';
CREATE FUNCTION vector_norm(vector) RETURNS float8
	AS 'MODULE_PATHNAME', 'knn_vector_norm' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION vector_norm(vector) IS 'Euclidean norm';

-- distances (float8), computed exactly like the CPU and GPU engines

-- A planner support function that changes nothing: planning any query with
-- <->, <#>, <=> or <+> calls it, which loads knn_gpu's library -- and so
-- installs the KNN Join planner hook -- before the join search, even on a
-- session's very first query.
CREATE FUNCTION knn_distance_support(internal) RETURNS internal
	AS 'MODULE_PATHNAME', 'knn_distance_support' LANGUAGE C STRICT;

CREATE FUNCTION l2_distance(vector, vector) RETURNS float8
	AS 'MODULE_PATHNAME', 'knn_vector_l2_distance' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE
	SUPPORT knn_distance_support;
COMMENT ON FUNCTION l2_distance(vector, vector) IS 'Euclidean distance';
CREATE FUNCTION inner_product(vector, vector) RETURNS float8
	AS 'MODULE_PATHNAME', 'knn_vector_inner_product' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION inner_product(vector, vector) IS 'inner product';
CREATE FUNCTION negative_inner_product(vector, vector) RETURNS float8
	AS 'MODULE_PATHNAME', 'knn_vector_negative_inner_product' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE
	SUPPORT knn_distance_support;
COMMENT ON FUNCTION negative_inner_product(vector, vector) IS 'negative inner product (the <#> operator)';
CREATE FUNCTION cosine_distance(vector, vector) RETURNS float8
	AS 'MODULE_PATHNAME', 'knn_vector_cosine_distance' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE
	SUPPORT knn_distance_support;
COMMENT ON FUNCTION cosine_distance(vector, vector) IS 'cosine distance';
CREATE FUNCTION l1_distance(vector, vector) RETURNS float8
	AS 'MODULE_PATHNAME', 'knn_vector_l1_distance' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE
	SUPPORT knn_distance_support;
COMMENT ON FUNCTION l1_distance(vector, vector) IS 'taxicab distance';

CREATE OPERATOR <-> (
	LEFTARG = vector, RIGHTARG = vector, FUNCTION = l2_distance, COMMUTATOR = <->
);
CREATE OPERATOR <#> (
	LEFTARG = vector, RIGHTARG = vector, FUNCTION = negative_inner_product, COMMUTATOR = <#>
);
CREATE OPERATOR <=> (
	LEFTARG = vector, RIGHTARG = vector, FUNCTION = cosine_distance, COMMUTATOR = <=>
);
CREATE OPERATOR <+> (
	LEFTARG = vector, RIGHTARG = vector, FUNCTION = l1_distance, COMMUTATOR = <+>
);

-- comparison: element by element, then by dimension; btree operator class

CREATE FUNCTION knn_vector_cmp(vector, vector) RETURNS integer
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION knn_vector_lt(vector, vector) RETURNS boolean
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION knn_vector_le(vector, vector) RETURNS boolean
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION knn_vector_eq(vector, vector) RETURNS boolean
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION knn_vector_ne(vector, vector) RETURNS boolean
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION knn_vector_ge(vector, vector) RETURNS boolean
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION knn_vector_gt(vector, vector) RETURNS boolean
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE OPERATOR < (
	LEFTARG = vector, RIGHTARG = vector, FUNCTION = knn_vector_lt,
	COMMUTATOR = >, NEGATOR = >=, RESTRICT = scalarltsel, JOIN = scalarltjoinsel
);
CREATE OPERATOR <= (
	LEFTARG = vector, RIGHTARG = vector, FUNCTION = knn_vector_le,
	COMMUTATOR = >=, NEGATOR = >, RESTRICT = scalarlesel, JOIN = scalarlejoinsel
);
CREATE OPERATOR = (
	LEFTARG = vector, RIGHTARG = vector, FUNCTION = knn_vector_eq,
	COMMUTATOR = =, NEGATOR = <>, RESTRICT = eqsel, JOIN = eqjoinsel
);
CREATE OPERATOR <> (
	LEFTARG = vector, RIGHTARG = vector, FUNCTION = knn_vector_ne,
	COMMUTATOR = <>, NEGATOR = =, RESTRICT = neqsel, JOIN = neqjoinsel
);
CREATE OPERATOR >= (
	LEFTARG = vector, RIGHTARG = vector, FUNCTION = knn_vector_ge,
	COMMUTATOR = <=, NEGATOR = <, RESTRICT = scalargesel, JOIN = scalargejoinsel
);
CREATE OPERATOR > (
	LEFTARG = vector, RIGHTARG = vector, FUNCTION = knn_vector_gt,
	COMMUTATOR = <, NEGATOR = <=, RESTRICT = scalargtsel, JOIN = scalargtjoinsel
);

CREATE OPERATOR CLASS vector_ops
	DEFAULT FOR TYPE vector USING btree AS
	OPERATOR 1 <,
	OPERATOR 2 <=,
	OPERATOR 3 =,
	OPERATOR 4 >=,
	OPERATOR 5 >,
	FUNCTION 1 knn_vector_cmp(vector, vector);

-- casts; the typmod argument carries vector(n) to the cast function

CREATE FUNCTION knn_vector_typmod_cast(vector, integer, boolean) RETURNS vector
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION knn_array_to_vector(integer[], integer, boolean) RETURNS vector
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION knn_array_to_vector(real[], integer, boolean) RETURNS vector
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION knn_array_to_vector(double precision[], integer, boolean) RETURNS vector
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION knn_array_to_vector(numeric[], integer, boolean) RETURNS vector
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION knn_vector_to_float4(vector, integer, boolean) RETURNS real[]
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE CAST (vector AS vector)
	WITH FUNCTION knn_vector_typmod_cast(vector, integer, boolean) AS IMPLICIT;
CREATE CAST (vector AS real[])
	WITH FUNCTION knn_vector_to_float4(vector, integer, boolean) AS IMPLICIT;
CREATE CAST (integer[] AS vector)
	WITH FUNCTION knn_array_to_vector(integer[], integer, boolean) AS ASSIGNMENT;
CREATE CAST (real[] AS vector)
	WITH FUNCTION knn_array_to_vector(real[], integer, boolean) AS ASSIGNMENT;
CREATE CAST (double precision[] AS vector)
	WITH FUNCTION knn_array_to_vector(double precision[], integer, boolean) AS ASSIGNMENT;
CREATE CAST (numeric[] AS vector)
	WITH FUNCTION knn_array_to_vector(numeric[], integer, boolean) AS ASSIGNMENT;

	$create_vector_type$;
END
$knn_vector$;
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
-- ---------------------------------------------------------------------------
-- Distances between PostgreSQL bit strings, pgvector's: hamming_distance
-- (<~>) and jaccard_distance (<%>), and binary_quantize(vector | halfvec),
-- created exactly when knn_gpu created its
-- own vector type (10_vector.sql; 12_halfvec.sql comes first, for the
-- halfvec function): where pgvector's types are used, its bit operators and
-- functions (0.7.0 and later) are too.
-- ---------------------------------------------------------------------------

DO $knn_bit$
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
		RETURN;
	END IF;

	EXECUTE $create_bit_distances$

CREATE FUNCTION hamming_distance(bit, bit) RETURNS float8
	AS 'MODULE_PATHNAME', 'knn_bit_hamming_distance' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE
	SUPPORT knn_distance_support;
COMMENT ON FUNCTION hamming_distance(bit, bit) IS 'Hamming distance';
CREATE FUNCTION jaccard_distance(bit, bit) RETURNS float8
	AS 'MODULE_PATHNAME', 'knn_bit_jaccard_distance' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE
	SUPPORT knn_distance_support;
COMMENT ON FUNCTION jaccard_distance(bit, bit) IS 'Jaccard distance';

CREATE OPERATOR <~> (
	LEFTARG = bit, RIGHTARG = bit, FUNCTION = hamming_distance, COMMUTATOR = <~>
);
CREATE OPERATOR <%> (
	LEFTARG = bit, RIGHTARG = bit, FUNCTION = jaccard_distance, COMMUTATOR = <%>
);

-- sign bits of a vector: the first stage of a binary-quantised search
CREATE FUNCTION binary_quantize(vector) RETURNS bit
	AS 'MODULE_PATHNAME', 'knn_vector_binary_quantize' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION binary_quantize(vector) IS 'binary quantize';
CREATE FUNCTION binary_quantize(halfvec) RETURNS bit
	AS 'MODULE_PATHNAME', 'knn_halfvec_binary_quantize' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION binary_quantize(halfvec) IS 'binary quantize';

	$create_bit_distances$;
END
$knn_bit$;
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
-- knn_join: for every row of a query set, the k nearest rows of a target set.

-- Its row estimate: |Q| x min(k, |T|) from the planner's estimates of the
-- two query texts (ROWS 1000 where they do not plan).
CREATE FUNCTION knn_join_support(internal) RETURNS internal
AS 'MODULE_PATHNAME', 'knn_join_support'
LANGUAGE C STRICT;

CREATE FUNCTION knn_join(
    queries text,
    targets text,
    k integer,
    metric text DEFAULT 'l2',
    exclude_self boolean DEFAULT false,
    method text DEFAULT 'auto')
RETURNS TABLE (query_id bigint, target_id bigint, rank integer, distance double precision)
AS 'MODULE_PATHNAME', 'knn_join'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 1000 SUPPORT knn_join_support;

COMMENT ON FUNCTION knn_join(text, text, integer, text, boolean, text) IS
'Exact k-nearest-neighbour join. queries and targets are SQL queries returning (integer id, vector | halfvec | real[] | double precision[] | bit), optionally followed by group key columns of hashable types: each query then meets only the targets whose keys all equal its own (NULL matches nothing); metric is l2, cosine, ip or l1 for vectors, hamming or jaccard for bit strings; exclude_self drops pairs with equal ids; method is auto, ti or brute.';

CREATE FUNCTION knn_gpu_info() RETURNS text
AS 'MODULE_PATHNAME', 'knn_gpu_info'
LANGUAGE C VOLATILE PARALLEL SAFE;

CREATE FUNCTION knn_gpu_last_stats() RETURNS json
AS 'MODULE_PATHNAME', 'knn_gpu_last_stats'
LANGUAGE C VOLATILE PARALLEL RESTRICTED;
-- knn_join with bind parameters and with keys of any type, and the
-- progress of running joins.

-- Both forms below are meant to be called with named arguments after k.
-- Their fourth argument (params text[], key anyelement) has no default, and
-- exclude_self (boolean) comes fifth as in the first form: a positional
-- call of the first form, e.g. knn_join(q, t, 5, 'l2', 'f'), where unknown
-- literals resolve by type category, position by position, still resolves
-- to the first form alone.

-- params: $1, $2, ... of both query texts, as text, each converted to the
-- type the text's use of it implies.
CREATE FUNCTION knn_join(
    queries text,
    targets text,
    k integer,
    params text[],
    exclude_self boolean DEFAULT false,
    metric text DEFAULT 'l2',
    method text DEFAULT 'auto')
RETURNS TABLE (query_id bigint, target_id bigint, rank integer, distance double precision)
AS 'MODULE_PATHNAME', 'knn_join_params'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 1000 SUPPORT knn_join_support;

COMMENT ON FUNCTION knn_join(text, text, integer, text[], boolean, text, text) IS
'knn_join with bind parameters: params gives $1, $2, ... of both query texts as text, each converted to the type its use in the text implies.';

-- key: ids of any type with a default btree ordering, returned as that
-- type; only its type matters (key => NULL::uuid).
CREATE FUNCTION knn_join(
    queries text,
    targets text,
    k integer,
    key anyelement,
    exclude_self boolean DEFAULT false,
    metric text DEFAULT 'l2',
    method text DEFAULT 'auto',
    params text[] DEFAULT NULL)
RETURNS TABLE (query_id anyelement, target_id anyelement, rank integer, distance double precision)
AS 'MODULE_PATHNAME', 'knn_join_keyed'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 1000 SUPPORT knn_join_support;

COMMENT ON FUNCTION knn_join(text, text, integer, anyelement, boolean, text, text, text[]) IS
'knn_join with ids of the type of key (e.g. key => NULL::uuid), unique in each set, returned as that type; ties are broken by the key type''s default btree order and exclude_self compares keys by equality. params as in the params form.';

-- One row per backend running a join, from its progress file.
CREATE FUNCTION knn_gpu_progress_rows(
    OUT pid integer,
    OUT backend_start timestamptz,
    OUT query_start timestamptz,
    OUT source text,
    OUT phase text,
    OUT join_start timestamptz,
    OUT phase_start timestamptz,
    OUT k integer,
    OUT queries_read bigint,
    OUT targets_read bigint,
    OUT queries bigint,
    OUT targets bigint,
    OUT distance_computations bigint,
    OUT rows_returned bigint,
    OUT rows_total bigint)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'knn_gpu_progress_rows'
LANGUAGE C VOLATILE PARALLEL RESTRICTED;

-- The joins running now: a row whose backend has moved on to another
-- statement (its join ended by an ERROR) is not one. pg_stat_activity
-- shows other roles' backends to members of pg_read_all_stats only.
CREATE VIEW knn_gpu_progress AS
SELECT p.pid, a.datname, a.usename, p.source, p.phase,
       clock_timestamp() - p.join_start AS elapsed, clock_timestamp() - p.phase_start AS in_phase,
       p.k, p.queries_read, p.targets_read, p.queries, p.targets,
       p.distance_computations, p.rows_returned, p.rows_total
FROM knn_gpu_progress_rows() p
JOIN pg_stat_activity a
  ON a.pid = p.pid AND a.backend_start = p.backend_start
 AND a.query_start = p.query_start AND a.state = 'active';

COMMENT ON VIEW knn_gpu_progress IS
'Joins running now (knn_join), one row per backend: phase (reading queries, reading targets, sorting, engine running, returning rows), rows read, sizes, distance computations (once the engine has finished), rows returned of rows_total.';
-- knn_range_join: every pair of a query set and a target set within a radius.

CREATE FUNCTION knn_range_join(
    queries text,
    targets text,
    radius double precision,
    metric text DEFAULT 'l2',
    exclude_self boolean DEFAULT false,
    k integer DEFAULT NULL,
    inclusive boolean DEFAULT true,
    method text DEFAULT 'auto',
    params text[] DEFAULT NULL)
RETURNS TABLE (query_id bigint, target_id bigint, rank integer, distance double precision)
AS 'MODULE_PATHNAME', 'knn_range_join'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 1000;

COMMENT ON FUNCTION knn_range_join(text, text, double precision, text, boolean, integer, boolean, text, text[]) IS
'Exact range join: every (query, target) pair whose distance is <= radius (< radius with inclusive => false), as the distance operator computes it, ranked per query by (distance, target id). queries and targets are SQL queries returning (integer id, vector | halfvec | real[] | double precision[] | bit), optionally followed by group key columns of hashable types: each query then meets only the targets whose keys all equal its own (NULL matches nothing); metric is l2, cosine, ip or l1 for vectors, hamming or jaccard for bit strings; exclude_self drops pairs with equal ids; k (NULL = no cap) keeps only the first k pairs of each query; method is auto, ti or brute; params gives $1, $2, ... of both query texts as in knn_join.';
-- The statistics of this backend's last knn_join that ran on shards
-- (foreign partitions of postgres_fdw servers): per shard its server, rows,
-- time and remote SQL; the local part, the shipping and the merge.
CREATE FUNCTION knn_gpu_last_shard_stats() RETURNS json
AS 'MODULE_PATHNAME', 'knn_gpu_last_shard_stats'
LANGUAGE C VOLATILE PARALLEL RESTRICTED;
