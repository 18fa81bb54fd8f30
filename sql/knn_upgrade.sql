-- ALTER EXTENSION knn_gpu UPDATE from 0.1 (the script as shipped, kept in
-- extension/sql/history/) gives a database the same objects, definitions
-- and comments as a fresh install of the current version.
SELECT current_database() AS regression_db \gset
CREATE DATABASE knn_upgrade;
\c knn_upgrade
SET client_min_messages = warning;

-- What a fingerprint of the extension's objects holds: every member's
-- description, and for functions, types, operators and casts what defines
-- them.
CREATE FUNCTION extension_objects() RETURNS TABLE (object text, definition text, comment text)
LANGUAGE sql AS $$
SELECT pg_describe_object(d.classid, d.objid, 0),
       CASE d.classid
         WHEN 'pg_proc'::regclass THEN
           (SELECT CASE WHEN p.prokind IN ('f', 'p') THEN pg_get_functiondef(p.oid)
                        ELSE concat_ws(' ', p.prokind, pg_get_function_identity_arguments(p.oid)) END
            FROM pg_proc p WHERE p.oid = d.objid)
         WHEN 'pg_type'::regclass THEN
           (SELECT concat_ws(' ', t.typlen, t.typalign, t.typstorage, t.typinput, t.typoutput,
                             t.typreceive, t.typsend, t.typmodin, t.typmodout, t.typanalyze,
                             t.typsubscript, t.typelem::regtype)
            FROM pg_type t WHERE t.oid = d.objid)
         WHEN 'pg_operator'::regclass THEN
           (SELECT concat_ws(' ', o.oprcode, o.oprcom::regoperator, o.oprnegate::regoperator,
                             o.oprrest, o.oprjoin, o.oprcanmerge, o.oprcanhash)
            FROM pg_operator o WHERE o.oid = d.objid)
         WHEN 'pg_cast'::regclass THEN
           (SELECT concat_ws(' ', c.castfunc::regprocedure, c.castcontext, c.castmethod)
            FROM pg_cast c WHERE c.oid = d.objid)
       END,
       obj_description(d.objid, (SELECT relname FROM pg_class WHERE oid = d.classid))
FROM pg_depend d
JOIN pg_extension e ON e.oid = d.refobjid
WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e' AND e.extname = 'knn_gpu'
$$;

CREATE EXTENSION knn_gpu VERSION '0.1';
SELECT extversion FROM pg_extension WHERE extname = 'knn_gpu';

-- The current library serves a database still on 0.1.
CREATE TABLE items (id bigint, v vector(2));
INSERT INTO items VALUES (1, '[0,0]'), (2, '[1,0]'), (3, '[0,3]');
SELECT query_id, target_id, rank, distance
FROM knn_join('SELECT id, v FROM items', 'SELECT id, v FROM items', 2)
ORDER BY query_id, rank;

ALTER EXTENSION knn_gpu UPDATE;
SELECT extversion = (SELECT default_version FROM pg_available_extensions WHERE name = 'knn_gpu') AS updated_to_default
FROM pg_extension WHERE extname = 'knn_gpu';
CREATE TABLE objects_updated AS SELECT * FROM extension_objects();

DROP TABLE items;
DROP EXTENSION knn_gpu;
CREATE EXTENSION knn_gpu;
CREATE TABLE objects_fresh AS SELECT * FROM extension_objects();

SELECT count(*) > 40 AS fingerprint_has_objects FROM objects_fresh;
-- Both differences must be empty.
SELECT 'only after update' AS side, * FROM (TABLE objects_updated EXCEPT TABLE objects_fresh) u
UNION ALL
SELECT 'only in a fresh install', * FROM (TABLE objects_fresh EXCEPT TABLE objects_updated) f
ORDER BY 1, 2;

\c :regression_db
DROP DATABASE knn_upgrade;
