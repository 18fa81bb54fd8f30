-- ---------------------------------------------------------------------------
-- Upgrade from 0.1 to 0.2: first what changes among 0.1's objects; the
-- objects new in 0.2 follow (the install-script parts added since 0.1, see
-- the Makefile). sql/knn_upgrade.sql proves that an updated database has
-- the same objects and definitions as a fresh install.
-- ---------------------------------------------------------------------------
\echo Use "ALTER EXTENSION knn_gpu UPDATE TO '0.2'" to load this file. \quit
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
