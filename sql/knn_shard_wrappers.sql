-- A partitioned table whose foreign partitions belong to another
-- foreign-data wrapper than postgres_fdw (file_fdw here): knn_join and the
-- KNN Join node read them on this server, and postgres_fdw's library is
-- not loaded for them (a server without postgres_fdw installed failed).
-- Checked in this backend's own memory map, first thing in its session.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS file_fdw;
RESET client_min_messages;
CREATE SERVER knn_wrappers_files FOREIGN DATA WRAPPER file_fdw;
CREATE TABLE knn_wrappers (id bigint, v vector(2)) PARTITION BY RANGE (id);
CREATE TABLE knn_wrappers_here PARTITION OF knn_wrappers FOR VALUES FROM (1) TO (100);
CREATE FOREIGN TABLE knn_wrappers_file PARTITION OF knn_wrappers FOR VALUES FROM (100) TO (200)
  SERVER knn_wrappers_files OPTIONS (filename '/dev/null', format 'csv');
INSERT INTO knn_wrappers_here SELECT i, format('[%s,%s]', i % 7, i % 5)::vector FROM generate_series(1, 20) i;
SELECT count(*) AS pairs, sum(distance) AS total
FROM knn_join('SELECT id, v FROM knn_wrappers WHERE id <= 5', 'SELECT id, v FROM knn_wrappers', 2,
              exclude_self => true);
SELECT count(*) AS rows
FROM knn_wrappers q CROSS JOIN LATERAL (SELECT t.id FROM knn_wrappers t ORDER BY t.v <-> q.v, t.id LIMIT 2) n;
SELECT pg_read_file('/proc/self/maps') ~ '/postgres_fdw\.so' AS postgres_fdw_loaded;
DROP TABLE knn_wrappers;
DROP SERVER knn_wrappers_files;
