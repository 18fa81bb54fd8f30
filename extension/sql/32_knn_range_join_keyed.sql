-- ---------------------------------------------------------------------------
-- knn_range_join's keyed form (new in 0.3).
-- ---------------------------------------------------------------------------
-- key: ids of any type with a default btree ordering, returned as that type,
-- as in knn_join's keyed form (key => NULL::uuid). Every argument after key
-- has the type of the first form's argument at its position (metric moves
-- last), so that a positional call of the first form still resolves to it
-- alone; call this form with named arguments.
CREATE FUNCTION knn_range_join(
    queries text,
    targets text,
    radius double precision,
    key anyelement,
    exclude_self boolean DEFAULT false,
    k integer DEFAULT NULL,
    inclusive boolean DEFAULT true,
    method text DEFAULT 'auto',
    params text[] DEFAULT NULL,
    metric text DEFAULT 'l2')
RETURNS TABLE (query_id anyelement, target_id anyelement, rank integer, distance double precision)
AS 'MODULE_PATHNAME', 'knn_range_join_keyed'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 1000;

COMMENT ON FUNCTION knn_range_join(text, text, double precision, anyelement, boolean, integer, boolean, text, text[], text) IS
'knn_range_join with ids of the type of key (e.g. key => NULL::uuid), unique in each set, returned as that type; pairs of a query are ranked by (distance, key) in the key type''s default btree order and exclude_self compares keys by equality. The other arguments as in the first form.';
