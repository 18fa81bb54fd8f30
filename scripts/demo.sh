#!/usr/bin/env bash
# demo.sh -- the main job on a fresh machine: installs what is missing, builds
# and installs knn_gpu, starts a throw-away PostgreSQL, runs a sample KNN join
# and stops the server again.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

knn_install_prerequisites
knn_build_and_install
knn_cluster_start "${TMPDIR:-/tmp}/knn_gpu_demo" "${PGPORT_DEMO:-5499}"

"$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 <<'SQL'
CREATE EXTENSION knn_gpu;
SELECT knn_gpu_info() AS engine;
CREATE TABLE items (id bigint PRIMARY KEY, v vector(3));
INSERT INTO items VALUES (1, '[1,2,3]'), (2, '[4,5,6]'), (3, '[1,2,4]'), (4, '[0,0,0]');
\echo 'k = 2 nearest items of every item (L2):'
SELECT * FROM knn_join('SELECT id, v FROM items', 'SELECT id, v FROM items', 2);
\echo 'the same without the trivial self-match:'
SELECT * FROM knn_join('SELECT id, v FROM items', 'SELECT id, v FROM items', 2, exclude_self => true);
\echo 'the pgvector-style LATERAL query, planned as one KNN Join:'
EXPLAIN (COSTS OFF)
SELECT q.id, n.id AS neighbour, n.dist FROM items q
CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS dist FROM items t ORDER BY t.v <-> q.v LIMIT 2) n;
SQL
echo "demo done: the throw-away cluster is stopped."
