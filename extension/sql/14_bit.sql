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
