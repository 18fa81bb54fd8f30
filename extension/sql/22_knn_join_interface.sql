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
