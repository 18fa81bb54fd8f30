-- ---------------------------------------------------------------------------
-- The rest of pgvector's functions of the vector type, under pgvector's
-- names (new in 0.3): the functions behind its operators (vector_add,
-- vector_sub, vector_mul, vector_concat, vector_lt ... vector_ne), which
-- knn_gpu's operators reach under knn_* names, and its index support
-- distances vector_l2_squared_distance, vector_negative_inner_product and
-- vector_spherical_distance (knn_gpu builds no index; they are callable by
-- name, as in pgvector). Only the type's input/output functions keep their
-- knn_* names (pgvector's would be found by CREATE TYPE in another schema).
--
-- Created exactly when knn_gpu created its own vector type (the coexistence
-- rule of 10_vector.sql).
-- ---------------------------------------------------------------------------

DO $knn_vector_pgvector_names$
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

	EXECUTE $create_vector_names$

CREATE FUNCTION vector_add(vector, vector) RETURNS vector
	AS 'MODULE_PATHNAME', 'knn_vector_add' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION vector_sub(vector, vector) RETURNS vector
	AS 'MODULE_PATHNAME', 'knn_vector_sub' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION vector_mul(vector, vector) RETURNS vector
	AS 'MODULE_PATHNAME', 'knn_vector_mul' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION vector_concat(vector, vector) RETURNS vector
	AS 'MODULE_PATHNAME', 'knn_vector_concat' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE FUNCTION vector_lt(vector, vector) RETURNS bool
	AS 'MODULE_PATHNAME', 'knn_vector_lt' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION vector_le(vector, vector) RETURNS bool
	AS 'MODULE_PATHNAME', 'knn_vector_le' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION vector_eq(vector, vector) RETURNS bool
	AS 'MODULE_PATHNAME', 'knn_vector_eq' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION vector_ne(vector, vector) RETURNS bool
	AS 'MODULE_PATHNAME', 'knn_vector_ne' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION vector_ge(vector, vector) RETURNS bool
	AS 'MODULE_PATHNAME', 'knn_vector_ge' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION vector_gt(vector, vector) RETURNS bool
	AS 'MODULE_PATHNAME', 'knn_vector_gt' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE FUNCTION vector_l2_squared_distance(vector, vector) RETURNS float8
	AS 'MODULE_PATHNAME', 'knn_vector_l2_squared_distance' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION vector_l2_squared_distance(vector, vector) IS 'squared Euclidean distance';
CREATE FUNCTION vector_negative_inner_product(vector, vector) RETURNS float8
	AS 'MODULE_PATHNAME', 'knn_vector_negative_inner_product' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION vector_negative_inner_product(vector, vector) IS 'negative inner product';
CREATE FUNCTION vector_spherical_distance(vector, vector) RETURNS float8
	AS 'MODULE_PATHNAME', 'knn_vector_spherical_distance' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION vector_spherical_distance(vector, vector) IS 'spherical distance';

	$create_vector_names$;
END
$knn_vector_pgvector_names$;
