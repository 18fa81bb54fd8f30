#!/usr/bin/env bash
# shard_test.sh -- knn_join over a table sharded across PostgreSQL servers.
#
# Starts three throw-away servers: a coordinator and two shards, with
# knn_gpu installed (built and installed beforehand: make install) and
# postgres_fdw from the server package's contrib. The same generated rows
# are held whole in one plain table (items_all) and sharded by hash
# (items_h: a partition on each shard and a local one) and by range
# (items_r: two partitions on shard 1, one on shard 2, a local one, and one
# in a database of shard 2 without knn_gpu, whose rows are read through
# postgres_fdw with a NOTICE). Every sharded join must equal the join of
# items_all (EXCEPT ALL both ways: the same neighbours, ranks and
# distances), and must have run on the shards (knn_gpu_last_shard_stats()).
# The KNN Join node (the LATERAL top-k query) over the same tables must
# equal the same query over items_all, for every metric and form (filters,
# self-exclusion, group keys, radius, OFFSET, WITH TIES, LEFT JOIN), and
# EXPLAIN must show each shard's server and remote SQL. knn_join's other
# forms: knn_range_join and bound parameters go to the shards, keyed calls
# and group keys are read here with a NOTICE, all equal to one server.
# Then: a shard stopped (an ERROR naming it), statement_timeout and a cancel
# in the middle of the shards' work, for knn_join and the node (their work
# stops, nothing is left behind on them).
#
# Ends with "shard tests: N passed, N failed". Ports: SHARD_TEST_PORTS
# (default "5561 5562 5563"); directories: SHARD_TEST_DIRS (default three
# under a fresh temporary directory); SHARD_TEST_KEEP=1 leaves them running.
set -uo pipefail
source "$(dirname "$0")/../scripts/lib.sh"

read -r -a PORTS <<<"${SHARD_TEST_PORTS:-5561 5562 5563}"
if [ -n "${SHARD_TEST_DIRS:-}" ]; then
  read -r -a DIRS <<<"$SHARD_TEST_DIRS"
else
  base=$(mktemp -d "${TMPDIR:-/tmp}/knn_shard_test.XXXXXX")
  chmod 755 "$base"
  DIRS=("$base/coordinator" "$base/shard1" "$base/shard2")
fi
NAMES=(coordinator shard1 shard2)
passed=0 failed=0

pass() { passed=$((passed + 1)); echo "ok: $1"; }
fail() { failed=$((failed + 1)); echo "FAILED: $1"; }
# check NAME EXPECTED ACTUAL
check() { if [ "$2" = "$3" ]; then pass "$1"; else fail "$1 (expected '$2', got '$3')"; fi; }
# check_has NAME TEXT ACTUAL: ACTUAL holds TEXT
check_has() { case "$3" in *"$2"*) pass "$1" ;; *) fail "$1 (no '$2' in: $3)" ;; esac; }

start_server() {
  local i=$1 dir=${DIRS[$1]} port=${PORTS[$1]}
  # a server still running there (SHARD_TEST_KEEP) would outlive its directory
  [ -f "$dir/data/postmaster.pid" ] && knn_as_owner "'$PG_BIN/pg_ctl' -D '$dir/data' -m immediate stop" >/dev/null 2>&1
  rm -rf "$dir"; mkdir -p "$dir"
  [ "$(id -u)" = 0 ] && chown "$KNN_CLUSTER_OWNER" "$dir"
  knn_as_owner "'$PG_BIN/initdb' -D '$dir/data' -U postgres -A trust >'$dir/initdb.log' 2>&1" \
    || { cat "$dir/initdb.log"; return 1; }
  resume_server "$i"
}
resume_server() {
  local dir=${DIRS[$1]} port=${PORTS[$1]}
  knn_as_owner "'$PG_BIN/pg_ctl' -D '$dir/data' -l '$dir/server.log' -w -o \"-p $port -k '$dir' -c listen_addresses='' -c fsync=off\" start" >/dev/null \
    || { tail -20 "$dir/server.log"; return 1; }
}
stop_server() {
  knn_as_owner "'$PG_BIN/pg_ctl' -D '${DIRS[$1]}/data' -m fast stop" >/dev/null 2>&1
}
stop_all() { for i in 0 1 2; do stop_server "$i"; done; }
# SHARD_TEST_KEEP=1 leaves the servers running, to look at them afterwards.
[ "${SHARD_TEST_KEEP:-0}" = 1 ] || trap stop_all EXIT

# sql SERVER [DATABASE] -- psql on one server, script on stdin or -c
sql() {
  local i=$1; shift
  local db=postgres
  if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then db=$1; shift; fi
  "$PG_BIN/psql" -X -q -At -v ON_ERROR_STOP=1 -h "${DIRS[$i]}" -p "${PORTS[$i]}" -U postgres -d "$db" "$@"
}

for i in 0 1 2; do
  start_server "$i" || { echo "shard tests: 0 passed, 1 failed"; exit 1; }
done

# ---- set-up ----
# The generated vectors: 8 values from a hash of (id, position), thirds so
# that halfvec rounds them, few enough distinct ones that distances tie.
GEN="CREATE FUNCTION gen_vec(i bigint, d int DEFAULT 8) RETURNS vector IMMUTABLE LANGUAGE sql AS
\$\$ SELECT array_agg(((hashint8(i * 1000 + j) & 15) - 7)::real / 3 ORDER BY j)::vector FROM generate_series(1, d) j \$\$;"
COLUMNS="id bigint, cat int, v vector(8), h halfvec(8), b bit(8)"

for i in 1 2; do
  sql "$i" <<EOF || { echo "shard tests: 0 passed, 1 failed"; exit 1; }
CREATE EXTENSION knn_gpu;
CREATE TABLE items_h_$((i - 1)) ($COLUMNS);
CREATE TABLE big_$i (id bigint, v vector(96));
EOF
done
sql 1 -c "CREATE TABLE items_r_a ($COLUMNS); CREATE TABLE items_r_c ($COLUMNS);"
sql 2 -c "CREATE TABLE items_r_b ($COLUMNS);"
sql 1 -c "CREATE TABLE items_f_a ($COLUMNS);"
# a database of shard 2 without knn_gpu: no vector type there, so text columns
sql 2 -c "CREATE DATABASE plain"
sql 2 plain -c "CREATE TABLE items_r_p (id bigint, cat int, v text, h text, b bit(8))"

sql 0 <<EOF || { echo "shard tests: 0 passed, 1 failed"; exit 1; }
CREATE EXTENSION knn_gpu;
CREATE EXTENSION postgres_fdw;
CREATE SERVER shard1 FOREIGN DATA WRAPPER postgres_fdw OPTIONS (host '${DIRS[1]}', port '${PORTS[1]}', dbname 'postgres');
CREATE SERVER shard2 FOREIGN DATA WRAPPER postgres_fdw OPTIONS (host '${DIRS[2]}', port '${PORTS[2]}', dbname 'postgres');
CREATE SERVER shard2_plain FOREIGN DATA WRAPPER postgres_fdw OPTIONS (host '${DIRS[2]}', port '${PORTS[2]}', dbname 'plain');
CREATE USER MAPPING FOR postgres SERVER shard1 OPTIONS (user 'postgres');
CREATE USER MAPPING FOR postgres SERVER shard2 OPTIONS (user 'postgres');
CREATE USER MAPPING FOR postgres SERVER shard2_plain OPTIONS (user 'postgres');
$GEN

CREATE TABLE items_all ($COLUMNS);
INSERT INTO items_all
  SELECT i, i % 5, gen_vec(i), gen_vec(i)::halfvec, binary_quantize(gen_vec(i))::bit(8)
  FROM generate_series(1, 1100) i;
INSERT INTO items_all VALUES (1101, 1, NULL, NULL, NULL);

CREATE TABLE items_h ($COLUMNS) PARTITION BY HASH (id);
CREATE FOREIGN TABLE items_h_0 PARTITION OF items_h FOR VALUES WITH (MODULUS 3, REMAINDER 0)
  SERVER shard1 OPTIONS (table_name 'items_h_0');
CREATE FOREIGN TABLE items_h_1 PARTITION OF items_h FOR VALUES WITH (MODULUS 3, REMAINDER 1)
  SERVER shard2 OPTIONS (table_name 'items_h_1');
CREATE TABLE items_h_2 PARTITION OF items_h FOR VALUES WITH (MODULUS 3, REMAINDER 2);
INSERT INTO items_h SELECT * FROM items_all;

CREATE TABLE items_r ($COLUMNS) PARTITION BY RANGE (id);
CREATE FOREIGN TABLE items_r_a PARTITION OF items_r FOR VALUES FROM (MINVALUE) TO (300)
  SERVER shard1 OPTIONS (table_name 'items_r_a');
CREATE FOREIGN TABLE items_r_b PARTITION OF items_r FOR VALUES FROM (300) TO (600)
  SERVER shard2 OPTIONS (table_name 'items_r_b');
CREATE FOREIGN TABLE items_r_c PARTITION OF items_r FOR VALUES FROM (600) TO (800)
  SERVER shard1 OPTIONS (table_name 'items_r_c');
CREATE TABLE items_r_d PARTITION OF items_r FOR VALUES FROM (800) TO (1000);
CREATE FOREIGN TABLE items_r_p PARTITION OF items_r FOR VALUES FROM (1000) TO (MAXVALUE)
  SERVER shard2_plain OPTIONS (table_name 'items_r_p');
INSERT INTO items_r SELECT * FROM items_all;

-- a partition of another foreign-data wrapper (file_fdw, no user mapping) beside a shard's
CREATE EXTENSION file_fdw;
CREATE SERVER files FOREIGN DATA WRAPPER file_fdw;
COPY (SELECT * FROM items_all WHERE id >= 1000) TO '${DIRS[0]}/items_f_b.csv' (FORMAT csv);
CREATE TABLE items_f ($COLUMNS) PARTITION BY RANGE (id);
CREATE FOREIGN TABLE items_f_a PARTITION OF items_f FOR VALUES FROM (MINVALUE) TO (1000)
  SERVER shard1 OPTIONS (table_name 'items_f_a');
CREATE FOREIGN TABLE items_f_b PARTITION OF items_f FOR VALUES FROM (1000) TO (MAXVALUE)
  SERVER files OPTIONS (filename '${DIRS[0]}/items_f_b.csv', format 'csv');
INSERT INTO items_f_a SELECT * FROM items_all WHERE id < 1000;

-- queries: some ids of the targets (exclude_self has work), some of their own
CREATE TABLE q ($COLUMNS);
INSERT INTO q SELECT * FROM items_all WHERE id % 23 = 0;
INSERT INTO q SELECT 5000 + i, 0, gen_vec(5000 + i), gen_vec(5000 + i)::halfvec,
  binary_quantize(gen_vec(5000 + i))::bit(8) FROM generate_series(1, 10) i;

-- a filter postgres_fdw cannot ship (a user's function): filtered here
CREATE FUNCTION odd_cat(int) RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS 'BEGIN RETURN \$1 % 2 = 1; END';

-- a big table on the two shards only, for cancels in the middle of their work
CREATE TABLE big (id bigint, v vector(96)) PARTITION BY HASH (id);
CREATE FOREIGN TABLE big_1 PARTITION OF big FOR VALUES WITH (MODULUS 2, REMAINDER 0)
  SERVER shard1 OPTIONS (table_name 'big_1');
CREATE FOREIGN TABLE big_2 PARTITION OF big FOR VALUES WITH (MODULUS 2, REMAINDER 1)
  SERVER shard2 OPTIONS (table_name 'big_2');
INSERT INTO big SELECT i, gen_vec(i, 96) FROM generate_series(1, 30000) i;
-- many queries (shipping them takes a while), for cancels while they are shipped
CREATE TABLE bigq AS SELECT b.id * 10 + g AS id, b.v FROM big b, generate_series(0, 9) g;
-- big's rows on this server, for a one-server answer to a join of many queries
CREATE TABLE big_here AS SELECT * FROM big;

-- the shards' temporary tables, seen from the coordinator's own remote sessions
CREATE FOREIGN TABLE shard1_pg_class (relname name, relpersistence "char")
  SERVER shard1 OPTIONS (schema_name 'pg_catalog', table_name 'pg_class');
CREATE FOREIGN TABLE shard2_pg_class (relname name, relpersistence "char")
  SERVER shard2 OPTIONS (schema_name 'pg_catalog', table_name 'pg_class');
-- ... and the query rows they hold in memory (knn_shard_receive_queries)
CREATE FOREIGN TABLE shard1_contexts (name text)
  SERVER shard1 OPTIONS (schema_name 'pg_catalog', table_name 'pg_backend_memory_contexts');
CREATE FOREIGN TABLE shard2_contexts (name text)
  SERVER shard2 OPTIONS (schema_name 'pg_catalog', table_name 'pg_backend_memory_contexts');
-- ... and the statements prepared on the coordinator's connections (the shipping's)
CREATE FOREIGN TABLE shard1_prepared (name text)
  SERVER shard1 OPTIONS (schema_name 'pg_catalog', table_name 'pg_prepared_statements');
CREATE FOREIGN TABLE shard2_prepared (name text)
  SERVER shard2 OPTIONS (schema_name 'pg_catalog', table_name 'pg_prepared_statements');
ANALYZE;
EOF
sql 1 -c "ANALYZE" && sql 2 -c "ANALYZE"

rows=$(sql 0 -c "SELECT (SELECT count(*) FROM items_h_0) > 0 AND (SELECT count(*) FROM items_h_1) > 0 AND (SELECT count(*) FROM items_h_2) > 0 AND (SELECT count(*) FROM items_r_p) = 102")
check "the rows are spread over the shards and the local partitions" t "$rows"

# compare NAME QUERIES SHARDED_TARGETS SINGLE_SERVER_TARGETS K METRIC EXCLUDE_SELF SHARDS
# -> differences both ways, rows, and how many shards joined
compare() {
  local out
  out=$(sql 0 -v "qs=$2" -v "ts=$3" -v "tr=$4" -v "k=$5" -v "m=$6" -v "x=$7" 2>&1 <<'EOF'
SET client_min_messages = warning;
CREATE TEMP TABLE s AS SELECT * FROM knn_join(:'qs', :'ts', :k, :'m', :x);
CREATE TEMP TABLE n AS SELECT coalesce(json_array_length(knn_gpu_last_shard_stats()->'shards'), 0) AS shards;
CREATE TEMP TABLE r AS SELECT * FROM knn_join(:'qs', :'tr', :k, :'m', :x);
SELECT (SELECT count(*) FROM (SELECT * FROM s EXCEPT ALL SELECT * FROM r) a)
     + (SELECT count(*) FROM (SELECT * FROM r EXCEPT ALL SELECT * FROM s) b)
     || ' differences, ' || ((SELECT count(*) FROM s) > 0) || ', ' || (SELECT shards FROM n) || ' shards';
EOF
)
  check "$1" "0 differences, true, $8 shards" "$out"
}

V="SELECT id, v FROM q"
for table in items_h items_r; do
  for metric in l2 cosine ip l1; do
    compare "$table $metric" "$V" "SELECT id, v FROM $table" "SELECT id, v FROM items_all" 5 "$metric" false 2
  done
  compare "$table l2 exclude_self" "$V" "SELECT id, v FROM $table" "SELECT id, v FROM items_all" 7 l2 true 2
  compare "$table l1 k past the row count" "$V" "SELECT id, v FROM $table WHERE cat = 3" \
    "SELECT id, v FROM items_all WHERE cat = 3" 1000 l1 false 2
  compare "$table filter pushed to the shards" "$V" "SELECT id, v FROM $table WHERE cat <> 2 AND id > 40" \
    "SELECT id, v FROM items_all WHERE cat <> 2 AND id > 40" 5 cosine false 2
  compare "$table filter the shards cannot run (read here)" "$V" "SELECT id, v FROM $table WHERE odd_cat(cat)" \
    "SELECT id, v FROM items_all WHERE odd_cat(cat)" 5 l2 false 0
  compare "$table halfvec l2" "SELECT id, h FROM q" "SELECT id, h FROM $table" "SELECT id, h FROM items_all" 5 l2 false 2
  compare "$table vector queries, halfvec targets, ip" "$V" "SELECT id, h FROM $table" "SELECT id, h FROM items_all" 5 ip false 2
  compare "$table bit hamming exclude_self" "SELECT id, b FROM q" "SELECT id, b FROM $table" "SELECT id, b FROM items_all" 6 hamming true 2
  compare "$table bit jaccard" "SELECT id, b FROM q" "SELECT id, b FROM $table" "SELECT id, b FROM items_all" 6 jaccard false 2
  compare "$table self-join exclude_self" "SELECT id, v FROM $table" "SELECT id, v FROM $table" "SELECT id, v FROM items_all" 4 l2 true 2
done
compare "ordered targets (Merge Append)" "$V" "SELECT id, v FROM items_h ORDER BY id" \
  "SELECT id, v FROM items_all" 5 l2 false 2
compare "LIMIT over the partitions: joined here" "$V" "SELECT id, v FROM items_h ORDER BY id LIMIT 500" \
  "SELECT id, v FROM items_all ORDER BY id LIMIT 500" 5 l2 false 0
compare "a computed column: joined here" "$V" "SELECT id + 0, v FROM items_h" \
  "SELECT id, v FROM items_all" 5 l2 false 0
compare "a file_fdw partition beside a shard" "$V" "SELECT id, v FROM items_f" \
  "SELECT id, v FROM items_all" 5 l2 true 1
compare "one partition after pruning" "$V" "SELECT id, v FROM items_r WHERE id < 250" \
  "SELECT id, v FROM items_all WHERE id < 250" 5 l2 false 1
compare "a foreign table on its own" "$V" "SELECT id, v FROM items_h_1" \
  "SELECT id, v FROM items_all WHERE satisfies_hash_partition('items_h'::regclass, 3, 1, id)" 5 l2 false 1

# The shards' packed results (knn_join_packed) decode to the very pairs: NaN
# distances (cosine of a zero vector: every target tied, ranked by id), k
# past the row count; a shard without knn_join_packed returns rows instead.
ZERO="SELECT id, v - v FROM q WHERE id < 200"
compare "NaN distances (a zero query vector, cosine): ties by target id" "$ZERO" \
  "SELECT id, v FROM items_h" "SELECT id, v FROM items_all" 6 cosine false 2
compare "NaN distances, k past the row count" "$ZERO" \
  "SELECT id, v FROM items_h WHERE cat = 1" "SELECT id, v FROM items_all WHERE cat = 1" 400 cosine true 2
# away_on_shard2 FUNCTION ARGUMENT_TYPES / back_on_shard2 ...: shard 2's knn_gpu without one of its functions, and with it again
away_on_shard2() { sql 2 -q -c "ALTER FUNCTION $1($2) RENAME TO ${1}_off"; }
back_on_shard2() { sql 2 -q -c "ALTER FUNCTION ${1}_off($2) RENAME TO $1"; }
# how_shards_join: per shard, how a knn_join over items_h gets its queries (memory or table) and returns its rows
how_shards_join() {
  sql 0 -c "SET client_min_messages = warning" \
    -c "SELECT count(*) > 0 FROM knn_join('SELECT id, v FROM q', 'SELECT id, v FROM items_h', 5)" \
    -c "SELECT s->>'server', CASE WHEN s->>'remote_sql' LIKE '%knn_join_received_packed(%' THEN 'memory, packed'
          WHEN s->>'remote_sql' LIKE '%knn_join_packed(''SELECT id, v FROM pg_temp.knn_shard_queries_%' THEN 'table, packed'
          WHEN s->>'remote_sql' LIKE '%knn_join(''SELECT id, v FROM pg_temp.knn_shard_queries_%' THEN 'table, rows' END
        FROM json_array_elements(knn_gpu_last_shard_stats()->'shards') s ORDER BY 1" 2>&1
}
away_on_shard2 knn_join_packed "text, text, integer, text, boolean, text"
compare "a shard without knn_join_packed: rows, merged with the other's packed values" "$V" \
  "SELECT id, v FROM items_h" "SELECT id, v FROM items_all" 5 l2 false 2
check "... its remote SQL is knn_join's" "$(printf 't\nshard1|memory, packed\nshard2|table, rows')" "$(how_shards_join)"
back_on_shard2 knn_join_packed "text, text, integer, text, boolean, text"
# A shard returning each query's pairs out of rank order (here reversed): the
# merge, which takes the lists' heads, sorts that query's candidates instead.
sql 2 -q -c "ALTER FUNCTION knn_join_received_packed(bigint, text, integer, text, boolean, text) RENAME TO knn_join_received_packed_real" \
  -c "CREATE FUNCTION knn_join_received_packed(s bigint, t text, k integer, m text, x boolean, how text) RETURNS SETOF bytea
      LANGUAGE sql SET search_path FROM CURRENT AS \$\$ SELECT string_agg(substr(p, 1 + 24 * i, 24), ''::bytea ORDER BY substr(p, 1 + 24 * i, 8), n DESC, i DESC)
        FROM knn_join_received_packed_real(s, t, k, m, x, how) WITH ORDINALITY v(p, n), generate_series(0, length(p) / 24 - 1) i \$\$"
compare "a shard returning each query's pairs in reverse rank order: the same rows" "$V" \
  "SELECT id, v FROM items_h" "SELECT id, v FROM items_all" 5 l2 false 2
compare "... with NaN distances, ties by target id" "$ZERO" \
  "SELECT id, v FROM items_h" "SELECT id, v FROM items_all" 6 cosine false 2
sql 2 -q -c "DROP FUNCTION knn_join_received_packed(bigint, text, integer, text, boolean, text)" \
  -c "ALTER FUNCTION knn_join_received_packed_real(bigint, text, integer, text, boolean, text) RENAME TO knn_join_received_packed"
check "the shipping's prepared statements are gone after the joins" "0|0" \
  "$(sql 0 -c "SELECT (SELECT count(*) FROM shard1_prepared WHERE name LIKE 'knn_gpu_receive_%') || '|' || (SELECT count(*) FROM shard2_prepared WHERE name LIKE 'knn_gpu_receive_%')" 2>&1)"
check "knn_join_packed: knn_join's pairs, packed" "t" "$(sql 1 -c "SELECT (SELECT count(*) FROM knn_join_packed('SELECT id, v FROM items_h_0', 'SELECT id, v FROM items_h_0', 3, 'l2', true, 'auto') p WHERE length(p) % 24 = 0 HAVING sum(length(p)) / 24 = (SELECT count(*) FROM knn_join('SELECT id, v FROM items_h_0', 'SELECT id, v FROM items_h_0', 3, exclude_self => true))) = 1" 2>&1)"

# ---- the query rows shipped into the shards' memory (knn_shard_receive.h) ----
# Every join above with both shards went this way (knn_join_received_packed);
# a shard whose knn_gpu lacks the receiving functions gets the rows by COPY
# into a temporary table, beside one that receives them.
away_on_shard2 knn_shard_receive_queries "bigint, regtype, bytea"
compare "a shard without knn_shard_receive_queries: COPY, merged with the other's received rows" "$V" \
  "SELECT id, v FROM items_h" "SELECT id, v FROM items_all" 5 l2 false 2
check "... shard1 received the rows in memory, shard2 read them from a temporary table" \
  "$(printf 't\nshard1|memory, packed\nshard2|table, packed')" "$(how_shards_join)"
back_on_shard2 knn_shard_receive_queries "bigint, regtype, bytea"

# A shard whose receiving fails, or whose count of rows held disagrees,
# while the rows are shipped: an ERROR naming the server, and the session
# goes on (the connection back in blocking mode, nothing held on the shards).
# failing_receive BODY: knn_shard_receive_queries on shard 1 as a plpgsql BODY
failing_receive() {
  sql 1 -q -c "ALTER FUNCTION knn_shard_receive_queries(bigint, regtype, bytea) RENAME TO knn_shard_receive_queries_real" \
    -c "CREATE FUNCTION knn_shard_receive_queries(bigint, regtype, bytea) RETURNS bigint LANGUAGE plpgsql AS \$\$ BEGIN $1 END \$\$"
}
real_receive() {
  sql 1 -q -c "DROP FUNCTION knn_shard_receive_queries(bigint, regtype, bytea)" \
    -c "ALTER FUNCTION knn_shard_receive_queries_real(bigint, regtype, bytea) RENAME TO knn_shard_receive_queries"
}
for failure in "RAISE EXCEPTION 'receiving failed';|ERROR:  receiving failed" \
               "RETURN 1;|ERROR:  knn_join: foreign server \"shard1\" holds 1 query rows of the "; do
  failing_receive "${failure%%|*}"
  out=$(sql 0 2>&1 <<'EOF'
\set ON_ERROR_STOP 0
SELECT count(*) FROM knn_join('SELECT id, v FROM bigq', 'SELECT id, v FROM big', 1);
SET client_min_messages = warning;
SELECT 'held:' || count(*) FROM shard2_contexts WHERE name IN ('knn_gpu received queries', 'knn_gpu prefetched targets');
SELECT 'again:' || (count(*) > 0) FROM knn_join('SELECT id, v FROM q', 'SELECT id, v FROM items_h_1', 3);
EOF
)
  real_receive
  check_has "a shard failing while it receives: ${failure#*|}" "${failure#*|}" "$out"
  check "... the session goes on, nothing held on the other shard" "$(printf 'held:0\nagain:true')" \
    "$(echo "$out" | grep -E '^(held|again):')"
done

# The rows received are those COPY gives, bit for bit: on shard 1, a set
# received in two blocks joins exactly as knn_join_packed of the table's rows
# (the same packed pairs, each query's in the same order; the queries in any
# order: the coordinator takes a shard's pairs by query id, and the shard
# does not sort the queries it received).
# received_same NAME TYPE SEND_FUNCTION QUERY_COLUMN TARGETS K METRIC EXCLUDE_SELF
received_same() {
  local block="SELECT string_agg(int4send(8) || int8send(id) || int4send(length($3($4))) || $3($4), ''::bytea ORDER BY id) FROM items_h_0 WHERE $4 IS NOT NULL"
  local out
  out=$(sql 1 2>&1 <<EOF
BEGIN;
SELECT knn_shard_receive_queries(7, '$2', ($block AND id % 2 = 0)) > 0;
SELECT knn_shard_receive_queries(7, '$2', ($block AND id % 2 = 1)) = (SELECT count($4) FROM items_h_0);
CREATE TEMP TABLE got AS SELECT p, n FROM knn_join_received_packed(7, '$5', $6, '$7', $8, 'auto') WITH ORDINALITY x(p, n);
COMMIT;
-- the 24-byte pairs (query id, target id, distance) by query id, each query's in their order
CREATE FUNCTION pg_temp.by_query(b bytea) RETURNS bytea LANGUAGE sql AS \$\$
  SELECT string_agg(substr(b, o, 24), ''::bytea ORDER BY ('x' || encode(substr(b, o, 8), 'hex'))::bit(64)::bigint, o)
  FROM generate_series(1, length(b), 24) o \$\$;
SELECT pg_temp.by_query((SELECT string_agg(p, ''::bytea ORDER BY n) FROM got))
     = pg_temp.by_query((SELECT string_agg(p, ''::bytea ORDER BY n) FROM knn_join_packed('SELECT id, $4 FROM items_h_0', '$5', $6, '$7', $8, 'auto') WITH ORDINALITY x(p, n))),
       (SELECT count(*) FROM got) > 0;
EOF
)
  check "received rows join as knn_join_packed of the table: $1" "$(printf 't\nt\nt|t')" "$out"
}
received_same "vector l2 exclude_self" vector knn_vector_send v "SELECT id, v FROM items_h_0" 4 l2 true
received_same "vector queries, halfvec targets, ip (read as halfvec)" vector knn_vector_send v "SELECT id, h FROM items_h_0" 5 ip false
received_same "halfvec cosine" halfvec knn_halfvec_send h "SELECT id, h FROM items_h_0" 5 cosine false
received_same "bit hamming" varbit varbit_send b "SELECT id, b FROM items_h_0" 6 hamming true

# pgvector's vector and halfvec (where pgvector is installed; its own schema
# on shard 1): their send forms are read on the shard itself while their
# receive functions are pgvector's own, and give what those functions give:
# the same rows (the same packed join of pgvector targets) and the same
# errors, the receive function's way forced by a function of the same C code
# that is not pgvector's. pgvector_received TYPE RECEIVE SEND: "here|..."
# and "receive|..." (the join's md5, a NaN's error, a short value's error),
# then how many sets were read here, and through the receive function.
pgvector_received() {
  local cast="::text::pgv.$1" out
  out=$(sql 1 2>&1 <<EOF
CREATE FUNCTION pg_temp.outcome(set bigint, block bytea) RETURNS text LANGUAGE plpgsql AS \$\$
BEGIN
  RETURN knn_shard_receive_queries(set, 'pgv.$1', block)::text;
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ': ' || SQLERRM;
END \$\$;
CREATE FUNCTION pg_temp.pgv_recv(internal, oid, integer) RETURNS pgv.$1 AS '\$libdir/vector', '$2' LANGUAGE C IMMUTABLE STRICT;
CREATE FUNCTION pg_temp.received(how text) RETURNS text LANGUAGE plpgsql AS \$\$
DECLARE
  result text;
BEGIN
  IF how = 'receive' THEN
    ALTER TYPE pgv.$1 SET (RECEIVE = pg_temp.pgv_recv);
  END IF;
  PERFORM knn_shard_receive_queries(30, 'pgv.$1',
    (SELECT string_agg(int4send(8) || int8send(id) || int4send(length(pgv.$3(v$cast))) || pgv.$3(v$cast), ''::bytea ORDER BY id)
     FROM items_h_0 WHERE v IS NOT NULL));
  SELECT md5(string_agg(p, ''::bytea ORDER BY n)) INTO result
    FROM knn_join_received_packed(30, 'SELECT id, v$cast FROM items_h_0', 4, 'l2', true, 'auto') WITH ORDINALITY x(p, n);
  RETURN result || '|' || pg_temp.outcome(31, int4send(8) || int8send(1) || int4send(8) || int2send(1::int2) || int2send(0::int2) || '\\xffc00000'::bytea)
    || '|' || pg_temp.outcome(32, int4send(8) || int8send(1) || int4send(5) || int2send(1::int2) || int2send(0::int2) || '\\x00'::bytea);
END \$\$;
SET client_min_messages = debug1;
BEGIN;
SELECT 'here|' || pg_temp.received('here');
ROLLBACK;
BEGIN;
SELECT 'receive|' || pg_temp.received('receive');
ROLLBACK;
-- dropped here: a session's temporary objects go after it ends, and the
-- DROP EXTENSION of the next session may come first
DROP FUNCTION pg_temp.pgv_recv(internal, oid, integer);
EOF
)
  echo "$out" | grep -E '^(here|receive)\|' | sort
  echo "$out" | grep -c "read from its send form here"
  echo "$out" | grep -c "read through its receive function"
}
if [ "$(sql 1 -c "SELECT count(*) FROM pg_available_extensions WHERE name = 'vector'")" = 1 ] &&
   sql 1 -q -c "CREATE SCHEMA pgv" -c "CREATE EXTENSION vector SCHEMA pgv" 2>/dev/null; then
  for t in "vector vector_recv vector_send" "halfvec halfvec_recv halfvec_send"; do
    read -r type recv send <<<"$t"
    out=$(pgvector_received "$type" "$recv" "$send")
    here=$(echo "$out" | sed -n 's/^here|//p') through=$(echo "$out" | sed -n 's/^receive|//p')
    check "pgvector's $type: received rows and errors, read here or through its receive function" \
      "$through" "$here"
    check_has "... the rows joined, the errors raised" "|22000: NaN not allowed in $type|08P01: insufficient data left in message" "$here"
    check "... read here for the one, through the receive function for the other (3 sets each)" "$(printf '3\n3')" \
      "$(echo "$out" | tail -2)"
  done
  sql 1 -q -c "DROP EXTENSION vector" -c "DROP SCHEMA pgv"
else
  echo "skipped: pgvector's send forms on a shard (pgvector is not installed here)"
fi

# Blocks are hostile input: every malformed one is refused with a clear
# error, and nothing is left held. refused NAME MESSAGE SQL (on shard 1)
refused() { check_has "refused: $1" "$2" "$(sql 1 -c "$3" "${@:4}" 2>&1)"; }
R="int4send(8) || int8send"
VEC2="knn_vector_send('[1,2]')"
VEC8="knn_vector_send('[1,2,3,4,5,6,7,8]')"
refused "a row cut short" 'malformed block: row 0 is cut short' \
  "SELECT knn_shard_receive_queries(1, 'vector', int4send(8) || int4send(1))"
refused "an id field not 8 bytes long" 'malformed block: row 0 has an id field that is not 8 bytes long (4)' \
  "SELECT knn_shard_receive_queries(1, 'vector', int4send(4) || int8send(1) || int4send(0))"
refused "a vector length past the block's end" "malformed block: row 1 has a vector length past the block's end (100)" \
  "SELECT knn_shard_receive_queries(1, 'vector', $R(1) || int4send(length($VEC2)) || $VEC2 || $R(2) || int4send(100) || $VEC2)"
refused "a negative vector length" "malformed block: row 0 has a vector length past the block's end (-1)" \
  "SELECT knn_shard_receive_queries(1, 'vector', $R(1) || int4send(-1))"
refused "bytes after the send form" "malformed block: row 0 has bytes after its vector's send form (1)" \
  "SELECT knn_shard_receive_queries(1, 'vector', $R(1) || int4send(length($VEC2) + 1) || $VEC2 || '\\x00'::bytea)"
refused "a dimension count past the value" 'insufficient data left in message' \
  "SELECT knn_shard_receive_queries(1, 'vector', $R(1) || int4send(8) || int2send(1000::int2) || int2send(0::int2) || float4send(1))"
refused "a NaN" 'NaN not allowed in vector' \
  "SELECT knn_shard_receive_queries(1, 'vector', $R(1) || int4send(12) || int2send(2::int2) || int2send(0::int2) || float4send('NaN') || float4send(1))"
refused "an infinite halfvec" 'infinite value not allowed in halfvec' \
  "SELECT knn_shard_receive_queries(1, 'halfvec', $R(1) || int4send(6) || int2send(1::int2) || int2send(0::int2) || int2send(31744::int2))"
refused "rows of different dimensions" 'dimension mismatch: query id 2 has 3 dimensions, expected 2' \
  "SELECT knn_shard_receive_queries(1, 'vector', $R(1) || int4send(length($VEC2)) || $VEC2 || $R(2) || int4send(16) || knn_vector_send('[1,2,3]'))"
refused "a type that is not a vector" 'knn_shard_receive_queries receives vector, halfvec or bit values, not integer' \
  "SELECT knn_shard_receive_queries(1, 'integer', '')"
refused "a type OID that names no type" 'knn_shard_receive_queries: type with OID 0 does not exist' \
  "SELECT knn_shard_receive_queries(1, 0::oid::regtype, '')"
# a refused type leaves no memory behind, even inside one transaction
check "refused types hold no memory in the transaction" "0" \
  "$(sql 1 -c "BEGIN" -c "DO \$\$ BEGIN FOR i IN 1 .. 50 LOOP BEGIN PERFORM knn_shard_receive_queries(i, 'integer', ''); EXCEPTION WHEN datatype_mismatch THEN NULL; END; END LOOP; END \$\$" \
     -c "SELECT count(*) FROM pg_backend_memory_contexts WHERE name = 'knn_gpu received queries'" -c "COMMIT" 2>&1 | grep -E '^[0-9]+$')"
refused "another type for the same set" 'received query set 5 holds vector values, not halfvec' \
  "BEGIN; SELECT knn_shard_receive_queries(5, 'vector', ''); SELECT knn_shard_receive_queries(5, 'halfvec', '')"
refused "a join of a set never received" 'no received query set 99 in this transaction' \
  "SELECT * FROM knn_join_received_packed(99, 'SELECT id, v FROM items_h_0', 3, 'l2', false, 'auto')"
refused "a range join of a set never received" 'no received query set 98 in this transaction' \
  "SELECT * FROM knn_range_join_received(98, 'SELECT id, v FROM items_h_0', 1.0, 'l2', false, NULL, true, 'auto')"
refused "a set of an ended transaction" 'no received query set 3 in this transaction' \
  "SELECT knn_shard_receive_queries(3, 'vector', $R(1) || int4send(length($VEC2)) || $VEC2)" \
  -c "SELECT * FROM knn_join_received_packed(3, 'SELECT id, v FROM items_h_0', 3, 'l2', false, 'auto')"
refused "a set of a subtransaction rolled back" 'no received query set 4 in this transaction' \
  "BEGIN; SAVEPOINT a; SELECT knn_shard_receive_queries(4, 'vector', $R(1) || int4send(length($VEC2)) || $VEC2); ROLLBACK TO a; SELECT * FROM knn_join_received_packed(4, 'SELECT id, v FROM items_h_0', 3, 'l2', false, 'auto')"
refused "a set the join took" 'no received query set 6 in this transaction' \
  "BEGIN; SELECT knn_shard_receive_queries(6, 'vector', $R(1) || int4send(length($VEC8)) || $VEC8); SELECT count(*) FROM knn_join_received_packed(6, 'SELECT id, v FROM items_h_0', 3, 'l2', false, 'auto'); SELECT * FROM knn_join_received_packed(6, 'SELECT id, v FROM items_h_0', 3, 'l2', false, 'auto')"
# A caller joins only what it may read: the join's targets run with its rights.
sql 1 -q -c "CREATE ROLE bob" -c "GRANT USAGE ON SCHEMA public TO bob" >/dev/null 2>&1
refused "an ordinary user's join reads only what it may" 'permission denied for table items_h_0' \
  "SET ROLE bob; BEGIN; SELECT knn_shard_receive_queries(8, 'vector', $R(1) || int4send(length($VEC2)) || $VEC2); SELECT * FROM knn_join_received_packed(8, 'SELECT id, v FROM items_h_0', 3, 'l2', false, 'auto')"

# The server without knn_gpu is named in a NOTICE; the statistics list what ran where.
out=$(sql 0 -c "SELECT count(*) FROM knn_join('SELECT id, v FROM q', 'SELECT id, v FROM items_r', 3)" 2>&1)
case "$out" in
  *'NOTICE:  knn_join reads the rows of foreign server "shard2_plain" here: knn_gpu is not installed there'*) pass "NOTICE names the server without knn_gpu" ;;
  *) fail "NOTICE names the server without knn_gpu: $out" ;;
esac
out=$(sql 0 <<'EOF'
SET client_min_messages = warning;
SELECT count(*) FROM knn_join('SELECT id, v FROM q', 'SELECT id, v FROM items_r WHERE cat <> 4', 3);
SELECT s->>'server', s->>'partitions', (s->>'rows')::int > 0, (s->>'seconds_join')::float8 >= 0,
       s->>'remote_sql' LIKE '%knn_join_received_packed(%' || 'WHERE ((cat <> 4))%'
FROM json_array_elements(knn_gpu_last_shard_stats()->'shards') s ORDER BY 1;
SELECT knn_gpu_last_shard_stats()->'fallback'->0->>'server', knn_gpu_last_shard_stats()->'local'->>'targets',
       (knn_gpu_last_shard_stats()->'seconds'->>'merge')::float8 >= 0;
EOF
)
check "statistics: per shard rows, time and remote SQL; fallback; local part" \
  "$(printf '%s\n' 171 'shard1|2|t|t|t' 'shard2|1|t|t|t' 'shard2_plain|241|t')" "$out"
out=$(sql 0 -c "SET client_min_messages = debug1" \
  -c "SELECT count(*) FROM knn_join('SELECT id, v FROM q', 'SELECT id, v FROM items_h', 3)" 2>&1 | grep -c 'knn_join: foreign server "shard[12]" joins: SELECT')
check "DEBUG1 shows each shard's remote SQL" 2 "$out"

# A temporary table per join lives only as long as the join, even in one transaction.
out=$(sql 0 <<'EOF'
SET client_min_messages = warning;
BEGIN;
SELECT count(*) > 0 FROM knn_join('SELECT id, v FROM q', 'SELECT id, v FROM items_h', 3);
SELECT count(*) > 0 FROM knn_join('SELECT id, v FROM q', 'SELECT id, v FROM items_h', 3);
SELECT count(*) FROM shard1_pg_class WHERE relname LIKE 'knn_shard_queries%';
SELECT count(*) FROM shard2_pg_class WHERE relname LIKE 'knn_shard_queries%';
SELECT count(*) FROM shard1_contexts WHERE name IN ('knn_gpu received queries', 'knn_gpu prefetched targets');
SELECT count(*) FROM shard2_contexts WHERE name IN ('knn_gpu received queries', 'knn_gpu prefetched targets');
COMMIT;
EOF
)
check "two joins in one transaction leave no temporary table and no received rows on the shards" \
  "$(printf 't\nt\n0\n0\n0\n0')" "$out"

# The shard's own statistics come along.
out=$(sql 0 -c "SET client_min_messages = warning" \
  -c "SELECT count(*) > 0 FROM knn_join('SELECT id, v FROM q', 'SELECT id, v FROM items_h', 3)" \
  -c "SELECT string_agg((s->'remote_stats'->>'queries') || '/' || (s->'remote_stats'->>'targets'), ' ' ORDER BY s->>'server')
      FROM json_array_elements(knn_gpu_last_shard_stats()->'shards') s")
check "each shard's own knn_gpu_last_stats()" "$(printf 't\n57/%s 57/%s' \
  "$(sql 1 -c 'SELECT count(v) FROM items_h_0')" "$(sql 2 -c 'SELECT count(v) FROM items_h_1')")" "$out"

# Rights: the caller's on the partitioned table, the user mapping's on the shards.
sql 0 -c "CREATE ROLE alice" -c "GRANT SELECT ON q TO alice" >/dev/null
out=$(sql 0 -c "SET ROLE alice" -c "SELECT count(*) FROM knn_join('SELECT id, v FROM q', 'SELECT id, v FROM items_h', 3)" 2>&1)
case "$out" in
  *'ERROR:  permission denied for table items_h'*) pass "no SELECT on the sharded table: permission denied" ;;
  *) fail "no SELECT on the sharded table: permission denied: $out" ;;
esac
sql 0 -c "GRANT SELECT ON items_h TO alice" >/dev/null
out=$(sql 0 -c "SET ROLE alice" -c "SELECT count(*) FROM knn_join('SELECT id, v FROM q', 'SELECT id, v FROM items_h', 3)" 2>&1)
case "$out" in
  *'ERROR:  user mapping not found for "alice"'*) pass "no user mapping: postgres_fdw's error" ;;
  *) fail "no user mapping: postgres_fdw's error: $out" ;;
esac

# The shard runs as the user mapping says: alice's maps to alice_remote on shard1.
sql 1 -c "CREATE ROLE alice_remote LOGIN" >/dev/null
sql 0 -c "CREATE USER MAPPING FOR alice SERVER shard1 OPTIONS (user 'alice_remote', password_required 'false')" \
  -c "CREATE USER MAPPING FOR alice SERVER shard2 OPTIONS (user 'postgres', password_required 'false')" \
  -c "GRANT SELECT ON items_all TO alice" >/dev/null
out=$(sql 0 -c "SET ROLE alice" -c "SELECT count(*) FROM knn_join('SELECT id, v FROM q', 'SELECT id, v FROM items_h', 3)" 2>&1)
case "$out" in
  *'ERROR:  permission denied for table items_h_0'*'knn_join on foreign server "shard1"'*)
    pass "the shard's rights are the user mapping's" ;;
  *) fail "the shard's rights are the user mapping's: $out" ;;
esac
sql 1 -c "GRANT SELECT ON items_h_0 TO alice_remote" >/dev/null
out=$(sql 0 <<'EOF' 2>&1
SET client_min_messages = warning;
SET ROLE alice;
CREATE TEMP TABLE s AS SELECT * FROM knn_join('SELECT id, v FROM q', 'SELECT id, v FROM items_h', 5, 'l1');
CREATE TEMP TABLE r AS SELECT * FROM knn_join('SELECT id, v FROM q', 'SELECT id, v FROM items_all', 5, 'l1');
SELECT (SELECT count(*) FROM (SELECT * FROM s EXCEPT ALL SELECT * FROM r) a)
     + (SELECT count(*) FROM (SELECT * FROM r EXCEPT ALL SELECT * FROM s) b),
       json_array_length(knn_gpu_last_shard_stats()->'shards');
EOF
)
check "an ordinary user with user mappings: the same result, on the shards" "0|2" "$out"
# What alice's join left in the backend is hers to see (and a superuser's, and
# pg_read_all_stats'), as pg_stat_activity's query: another role after SET
# ROLE gets no shard statistics (the remote SQL holds her texts and
# constants) and no engine statistics, as if no join had run.
sql 0 -c "CREATE ROLE carol" -c "CREATE ROLE knn_stats_reader IN ROLE pg_read_all_stats" >/dev/null
out=$(sql 0 <<'EOF' 2>&1
SET client_min_messages = warning;
SET ROLE alice;
SELECT count(*) > 0 FROM knn_join('SELECT id, v FROM q', 'SELECT id, v FROM items_h WHERE cat <> 3', 3);
SELECT knn_gpu_last_shard_stats()->'shards'->0->>'remote_sql' LIKE '%cat <> 3%', knn_gpu_last_stats() IS NOT NULL;
SET ROLE carol;
SELECT knn_gpu_last_shard_stats() IS NULL, knn_gpu_last_stats() IS NULL;
SET ROLE knn_stats_reader;
SELECT json_array_length(knn_gpu_last_shard_stats()->'shards'), knn_gpu_last_stats() IS NOT NULL;
SET ROLE alice;
SELECT json_array_length(knn_gpu_last_shard_stats()->'shards'), knn_gpu_last_stats() IS NOT NULL;
RESET ROLE;
SELECT json_array_length(knn_gpu_last_shard_stats()->'shards'), knn_gpu_last_stats() IS NOT NULL;
EOF
)
check "another role sees nothing of alice's join's statistics; she, pg_read_all_stats and a superuser do" \
  "$(printf 't\nt|t\nt|t\n2|t\n2|t\n2|t')" "$out"

# ---- the KNN Join node (the LATERAL top-k query) over the sharded tables ----
# compare_node NAME QUERY SHARDS: QUERY names its target table TBL; run over
# items_h and items_r (QUERY_TABLES) it must equal the same query over
# items_all (EXCEPT ALL both ways), have rows, have been the KNN Join node
# and have joined on SHARDS shards (a new knn_gpu_last_shard_stats()).
# sharded_against_reference LEVEL: psql statements that run :s (its messages
# from LEVEL up) and :r into temporary tables s and r, then print "N
# differences, ROWS?, M shards": rows in one and not the other, whether s has
# rows, and the shards :s joined on (0 where knn_gpu_last_shard_stats() did
# not change).
sharded_against_reference() {
  cat <<EOF
SET client_min_messages = warning;
CREATE TEMP TABLE before AS SELECT md5(coalesce(knn_gpu_last_shard_stats()::text, '')) AS stats;
SET client_min_messages = $1;
CREATE TEMP TABLE s AS :s;
SET client_min_messages = warning;
CREATE TEMP TABLE n AS SELECT CASE WHEN md5(coalesce(knn_gpu_last_shard_stats()::text, '')) = (SELECT stats FROM before)
  THEN 0 ELSE json_array_length(knn_gpu_last_shard_stats()->'shards') END AS shards;
CREATE TEMP TABLE r AS :r;
SELECT (SELECT count(*) FROM (SELECT * FROM s EXCEPT ALL SELECT * FROM r) a)
     + (SELECT count(*) FROM (SELECT * FROM r EXCEPT ALL SELECT * FROM s) b)
     || ' differences, ' || ((SELECT count(*) FROM s) > 0) || ', ' || (SELECT shards FROM n) || ' shards';
EOF
}
compare_node() {
  local name=$1 query=$2 shards=$3 table out result plan
  for table in ${QUERY_TABLES:-items_h items_r}; do
    out=$({ sharded_against_reference warning; echo 'EXPLAIN :s;'; } |
          sql 0 -v "s=${query//TBL/$table}" -v "r=${query//TBL/items_all}" 2>&1)
    result=$(echo "$out" | grep ' differences, ')
    plan=$(echo "$out" | grep -c 'Custom Scan (KNN Join) ')
    if [ "$result" = "0 differences, true, $shards shards" ] && [ "$plan" -ge 1 ]; then
      pass "KNN Join $table: $name"
    else
      fail "KNN Join $table: $name (expected '0 differences, true, $shards shards' and the node, got '$result', the node $plan times): $(echo "$out" | grep -E 'ERROR')"
    fi
  done
}

# lateral VECTOR OPERATOR [WHERE ...] [LIMIT ...]: ordered by distance, then
# id, so that the order PostgreSQL gives is fully defined
lateral() {
  echo "SELECT q.id AS qid, n.id, n.d FROM q CROSS JOIN LATERAL (SELECT t.id, t.$1 $2 q.$1 AS d FROM TBL t ${3:-} ORDER BY t.$1 $2 q.$1, t.id ${4:-LIMIT 5}) n"
}
compare_node "l2" "$(lateral v '<->')" 2
compare_node "cosine" "$(lateral v '<=>')" 2
compare_node "ip" "$(lateral v '<#>')" 2
compare_node "l1" "$(lateral v '<+>')" 2
compare_node "halfvec l2" "$(lateral h '<->')" 2
compare_node "bit hamming" "$(lateral b '<~>' '' 'LIMIT 6')" 2
compare_node "bit jaccard" "$(lateral b '<%>' '' 'LIMIT 6')" 2
compare_node "filter pushed to the shards" "$(lateral v '<=>' 'WHERE t.cat <> 2 AND t.id > 40')" 2
compare_node "filter the shards cannot run (read here)" "$(lateral v '<->' 'WHERE odd_cat(t.cat)')" 0
compare_node "self-exclusion" "$(lateral v '<->' 'WHERE t.id <> q.id' 'LIMIT 7')" 2
compare_node "group keys" "$(lateral v '<->' 'WHERE t.cat = q.cat' 'LIMIT 4')" 2

# Text group keys travel as their send function writes them, in this
# session's client encoding, while the shard reads the database's: with
# another client encoding they are not shipped (the shards' rows are read
# here), and either way the result is one server's.
for i in 1 2; do sql "$i" -c "CREATE TABLE tg_$i (id bigint, g text, v vector(8))"; done
sql 0 -q <<'EOF'
CREATE TABLE tg_all (id bigint, g text, v vector(8));
INSERT INTO tg_all SELECT i, (ARRAY['e', 'é', 'ü', 'Ã©'])[1 + i % 4], gen_vec(i) FROM generate_series(1, 400) i;
CREATE TABLE tg (id bigint, g text, v vector(8)) PARTITION BY HASH (id);
CREATE FOREIGN TABLE tg_1 PARTITION OF tg FOR VALUES WITH (MODULUS 2, REMAINDER 0) SERVER shard1 OPTIONS (table_name 'tg_1');
CREATE FOREIGN TABLE tg_2 PARTITION OF tg FOR VALUES WITH (MODULUS 2, REMAINDER 1) SERVER shard2 OPTIONS (table_name 'tg_2');
INSERT INTO tg SELECT * FROM tg_all;
EOF
db_encoding=$(sql 0 -c 'SELECT pg_catalog.getdatabaseencoding()')
for encoding in "$db_encoding" LATIN1; do
  out=$(sql 0 -v enc="$encoding" 2>&1 <<'EOF'
SET client_min_messages = warning;
SELECT pg_catalog.set_config('client_encoding', :'enc', false) \g /dev/null
CREATE TEMP TABLE before AS SELECT md5(coalesce(knn_gpu_last_shard_stats()::text, '')) AS stats;
CREATE TEMP TABLE s AS SELECT q.id AS qid, n.id, n.d FROM tg_all q CROSS JOIN LATERAL
  (SELECT t.id, t.v <-> q.v AS d FROM tg t WHERE t.g = q.g ORDER BY t.v <-> q.v, t.id LIMIT 3) n;
CREATE TEMP TABLE n AS SELECT CASE WHEN md5(coalesce(knn_gpu_last_shard_stats()::text, '')) = (SELECT stats FROM before)
  THEN 0 ELSE json_array_length(knn_gpu_last_shard_stats()->'shards') END AS shards;
CREATE TEMP TABLE r AS SELECT q.id AS qid, n.id, n.d FROM tg_all q CROSS JOIN LATERAL
  (SELECT t.id, t.v <-> q.v AS d FROM tg_all t WHERE t.g = q.g ORDER BY t.v <-> q.v, t.id LIMIT 3) n;
SELECT (SELECT count(*) FROM (SELECT * FROM s EXCEPT ALL SELECT * FROM r) a)
     + (SELECT count(*) FROM (SELECT * FROM r EXCEPT ALL SELECT * FROM s) b)
     || ' differences, ' || (SELECT count(*) FROM s) || ' rows, ' || (SELECT shards FROM n) || ' shards';
EOF
)
  expected_shards=2
  [ "$encoding" != "$db_encoding" ] && expected_shards=0
  check "KNN Join text group keys, client encoding $encoding (database $db_encoding)" \
    "0 differences, 1200 rows, $expected_shards shards" "$(echo "$out" | grep ' differences, ')"
done
compare_node "radius and LIMIT" "$(lateral v '<->' 'WHERE t.v <-> q.v < 2.5' 'LIMIT 4')" 2
compare_node "radius alone" "$(lateral v '<->' 'WHERE t.v <-> q.v <= 2.2' ' ')" 2
compare_node "OFFSET" "$(lateral v '<+>' '' 'LIMIT 3 OFFSET 4')" 2
compare_node "k past the row count (NULL distances last)" "$(lateral v '<->' '' 'LIMIT 2000')" 2
compare_node "FETCH FIRST WITH TIES" \
  "SELECT q.id AS qid, n.id, n.d FROM q CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS d FROM TBL t ORDER BY t.v <-> q.v FETCH FIRST 3 ROWS WITH TIES) n" 2
compare_node "distances alone (ties in any order)" \
  "SELECT q.id AS qid, n.d FROM q CROSS JOIN LATERAL (SELECT t.v <=> q.v AS d FROM TBL t ORDER BY t.v <=> q.v LIMIT 5) n" 2
compare_node "LEFT JOIN with a filter above the LIMIT" \
  "SELECT q.id AS qid, n.id, n.d FROM q LEFT JOIN LATERAL (SELECT t.id, t.cat, t.v <-> q.v AS d FROM TBL t ORDER BY t.v <-> q.v, t.id LIMIT 3) n ON n.cat = 1" 2
compare_node "self-join with self-exclusion" \
  "SELECT q.id AS qid, n.id, n.d FROM TBL q CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS d FROM TBL t WHERE t.id <> q.id ORDER BY t.v <-> q.v, t.id LIMIT 4) n" 2
QUERY_TABLES=items_f compare_node "a file_fdw partition beside a shard" "$(lateral v '<->')" 1
QUERY_TABLES=items_r compare_node "one partition after pruning" "$(lateral v '<->' 'WHERE t.id < 250')" 1

# EXPLAIN: per shard its server, partitions and remote SQL; ANALYZE: rows, times, the merge.
NODE_SQL="SELECT q.id, n.id, n.d FROM q CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS d FROM items_r t WHERE t.cat <> 4 ORDER BY t.v <-> q.v LIMIT 3) n"
FUNC_SQL="SELECT * FROM knn_join('SELECT id, v FROM q', 'SELECT id, v FROM items_r WHERE cat <> 4', 3)"
SHARD_LINES="$(printf '%s\n' 'Shard: shard1 (items_r_a, items_r_c)' 'Remote SQL: yes' 'Shard: shard2 (items_r_b)' 'Remote SQL: yes' 'Servers Read Here: shard2_plain')"
ANALYZE_LINES="$(printf '%s\n' 'Shard Rows: 171' 'Shard Time' 'Shard Rows: 171' 'Shard Time' 'Shard Merge Rows' 'Ship Time' 'Shard Merge Time')"
analyze_lines() { sed -n 's/^ *\(Shard Rows: [0-9]*\)$/\1/p; s/^ *\(Shard Time\|Shard Merge Rows\|Ship Time\|Shard Merge Time\): .*/\1/p'; }
out=$(sql 0 -c "SET client_min_messages = warning" -c "EXPLAIN $NODE_SQL")
check "EXPLAIN of the node: each shard, its partitions and its remote SQL" "$SHARD_LINES" \
  "$(echo "$out" | sed -n 's/^ *\(Shard: .*\|Servers Read Here: .*\)$/\1/p; s/^ *Remote SQL: SELECT q.qid, n.d, n.a2 FROM pg_temp.knn_shard_queries_.* q CROSS JOIN LATERAL (SELECT .*WHERE ((cat <> 4)).* ORDER BY .* LIMIT \$1) n$/Remote SQL: yes/p')"
out=$(sql 0 -c "SET client_min_messages = warning" -c "EXPLAIN (ANALYZE) $NODE_SQL")
# (the node asks each partition for its 3 rows: shard1 has two)
check "EXPLAIN ANALYZE of the node: rows and time per shard, shipping, the merge" "${ANALYZE_LINES/171/342}" \
  "$(echo "$out" | analyze_lines)"
out=$(sql 0 -c "SET client_min_messages = warning" -c "EXPLAIN $FUNC_SQL")
check "EXPLAIN of knn_join: each shard, its partitions and its remote SQL" "$SHARD_LINES" \
  "$(echo "$out" | sed -n 's/^ *\(Shard: .*\|Servers Read Here: .*\)$/\1/p; s/^ *Remote SQL: SELECT public.knn_join_received_packed([0-9]*::pg_catalog.int8, .SELECT .*WHERE ((cat <> 4)).*::pg_catalog.text, 3, .l2.::pg_catalog.text, false, .auto.::pg_catalog.text)$/Remote SQL: yes/p')"
out=$(sql 0 -c "SET client_min_messages = warning" -c "EXPLAIN (ANALYZE) $FUNC_SQL")
check "EXPLAIN ANALYZE of knn_join: rows and time per shard, shipping, the merge" "$ANALYZE_LINES" \
  "$(echo "$out" | analyze_lines)"
check "EXPLAIN ANALYZE of knn_join: each shard's target read ahead, the query read here, the wait for the shards" \
  "$(printf '%s\n' 'Shard Target Read Time' 'Shard Target Read Time' 'Query Read Time' 'Target Read Wait Time')" \
  "$(echo "$out" | sed -n 's/^ *\(Shard Target Read Time\|Query Read Time\|Target Read Wait Time\): [0-9.]* ms$/\1/p')"
# Run twice in a statement (the node in a correlated subquery, knn_join as a LATERAL call),
# each time for half the queries: EXPLAIN ANALYZE shows the sums of both runs, those of one
# run over all the queries (the local part read twice: twice its targets).
loop_lines() { sed -n 's/^ *\(Sharded Calls\|Shard Rows\|Shard Merge Rows\|Targets Joined Here\): \([0-9]*\)$/\1: \2/p'; }
summed_twice() {
  awk -F': ' '$1 == "Shard Merge Rows" { print "Sharded Calls: 2" }
              $1 == "Targets Joined Here" { print $1 ": " 2 * $2; next } { print }'
}
for form in node function; do
  if [ $form = node ]; then
    once="$NODE_SQL"
    twice="SELECT o.x, (SELECT count(*) FROM q CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS d FROM items_r t WHERE t.cat <> 4 ORDER BY t.v <-> q.v LIMIT 3) n WHERE q.id % 2 = o.x) FROM generate_series(0, 1) o(x)"
  else
    once="$FUNC_SQL"
    twice="SELECT n.* FROM generate_series(0, 1) o(x), LATERAL knn_join(format('SELECT id, v FROM q WHERE id %% 2 = %s', o.x), 'SELECT id, v FROM items_r WHERE cat <> 4', 3) n"
  fi
  expected=$(sql 0 -c "SET client_min_messages = warning" -c "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) $once" | loop_lines | summed_twice)
  # (enable_sort off: the subquery's own plan, a sort per outer row, would be cheaper for 28 rows)
  check "EXPLAIN ANALYZE of the $form run twice: the sums of its runs" "$expected" \
    "$(sql 0 -c "SET client_min_messages = warning" -c "SET enable_sort = off" \
         -c "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) $twice" | loop_lines)"
done
# The node rescanned once per outer row: a run's scratch (the shards' SQL and statistics) does
# not pile up in the statement's memory (bytes in use in its ExecutorState after 100 and 300 runs).
check "the sharded node rescanned 200 more times: its statement's memory the same, give or take 64 bytes a run" "t" \
  "$(sql 0 -c "SET client_min_messages = warning" -c "SET enable_sort = off" \
       -c "CREATE FUNCTION pg_temp.statement_bytes() RETURNS bigint LANGUAGE sql AS \$\$
             SELECT total_bytes - free_bytes FROM pg_backend_memory_contexts
             WHERE name = 'ExecutorState' AND parent = 'PortalContext' \$\$" \
       -c "SELECT (max(b) FILTER (WHERE x = 300) - max(b) FILTER (WHERE x = 100)) / 200 < 64 FROM (
             SELECT x, pg_temp.statement_bytes() AS b FROM (SELECT o.x, (SELECT count(*) FROM q CROSS JOIN LATERAL
               (SELECT t.id FROM items_r t WHERE t.cat <> 4 ORDER BY t.v <-> q.v LIMIT 3) n WHERE q.id % 2 = o.x % 2) AS c
             FROM generate_series(1, 300) o(x) OFFSET 0) s WHERE x IN (100, 300) AND c >= 0) m" 2>&1)"
check_has "EXPLAIN of knn_join whose text fails: one line, no ERROR" \
  'Shards: not known (relation "no_such_table" does not exist)' \
  "$(sql 0 -c "EXPLAIN SELECT * FROM knn_join('SELECT id, v FROM q', 'SELECT id, v FROM no_such_table', 3)" 2>&1)"

# ---- knn_join's other forms: pushed down, or read here with a NOTICE ----
# same_as_one_server NAME SHARDS SHARDED_CALL SINGLE_SERVER_CALL [FROM_SHARDS]
# (FROM_SHARDS: also whether the queries came from the shards, knn_gpu_last_shard_stats()->'queries_from_shards')
same_as_one_server() {
  local out
  out=$(sql 0 -v "s=$3" -v "r=$4" -v "f=${5:+1}" 2>&1 <<'EOF'
SET client_min_messages = warning;
CREATE TEMP TABLE before AS SELECT md5(coalesce(knn_gpu_last_shard_stats()::text, '')) AS stats;
CREATE TEMP TABLE s AS SELECT * FROM :s;
CREATE TEMP TABLE n AS SELECT CASE WHEN md5(coalesce(knn_gpu_last_shard_stats()::text, '')) = (SELECT stats FROM before)
  THEN 0 ELSE json_array_length(knn_gpu_last_shard_stats()->'shards') END AS shards,
  CASE WHEN md5(coalesce(knn_gpu_last_shard_stats()::text, '')) = (SELECT stats FROM before)
  THEN 'none' ELSE knn_gpu_last_shard_stats()->>'queries_from_shards' END AS f;
CREATE TEMP TABLE r AS SELECT * FROM :r;
SELECT (SELECT count(*) FROM (SELECT * FROM s EXCEPT ALL SELECT * FROM r) a)
     + (SELECT count(*) FROM (SELECT * FROM r EXCEPT ALL SELECT * FROM s) b)
     || ' differences, ' || ((SELECT count(*) FROM s) > 0) || ', ' || (SELECT shards FROM n) || ' shards'
     || CASE WHEN :'f' = '1' THEN ', from shards ' || (SELECT f FROM n) ELSE '' END;
EOF
)
  check "$1" "0 differences, true, $2 shards${5:+, from shards $5}" "$out"
}
same_as_one_server "knn_range_join items_h l2" 2 \
  "knn_range_join('SELECT id, v FROM q', 'SELECT id, v FROM items_h', 2.5)" \
  "knn_range_join('SELECT id, v FROM q', 'SELECT id, v FROM items_all', 2.5)"
same_as_one_server "knn_range_join items_r l1, exclude_self, k, exclusive" 2 \
  "knn_range_join('SELECT id, v FROM q', 'SELECT id, v FROM items_r', 4.0, 'l1', true, 3, false)" \
  "knn_range_join('SELECT id, v FROM q', 'SELECT id, v FROM items_all', 4.0, 'l1', true, 3, false)"
# A radius goes to the shards exactly, whatever extra_float_digits (at 0
# or less float8out wrote 15 digits, at -15 one: the shards kept or dropped
# pairs that one server would not). The radii are distances of pairs on the
# shards that 15 digits round down (<=: those pairs were dropped) and up
# (<: those pairs were kept).
read -r below above <<<"$(sql 0 -F ' ' -c "SELECT min(d) FILTER (WHERE d::numeric::float8 < d), min(d) FILTER (WHERE d::numeric::float8 > d)
  FROM (SELECT q.v <-> t.v AS d FROM q, items_h_0 t WHERE t.id < 800) s WHERE d > 2.5")"
for digits in 0 -15; do
  export PGOPTIONS="-c extra_float_digits=$digits"
  same_as_one_server "knn_range_join, extra_float_digits = $digits, radius $below (<=): the pairs at the radius" 2 \
    "knn_range_join('SELECT id, v FROM q', 'SELECT id, v FROM items_h', $below, 'l2', false, NULL, true)" \
    "knn_range_join('SELECT id, v FROM q', 'SELECT id, v FROM items_all', $below, 'l2', false, NULL, true)"
  same_as_one_server "knn_range_join, extra_float_digits = $digits, radius $above (<): not the pairs at the radius" 2 \
    "knn_range_join('SELECT id, v FROM q', 'SELECT id, v FROM items_r', $above, 'l2', false, NULL, false)" \
    "knn_range_join('SELECT id, v FROM q', 'SELECT id, v FROM items_all', $above, 'l2', false, NULL, false)"
  compare_node "radius, extra_float_digits = $digits, <= $below: the rows at the radius" \
    "$(lateral v '<->' "WHERE t.v <-> q.v <= $below" ' ')" 2
  compare_node "radius and LIMIT, extra_float_digits = $digits, < $above: not the rows at the radius" \
    "$(lateral v '<->' "WHERE t.v <-> q.v < $above" 'LIMIT 50')" 2
  unset PGOPTIONS
done
# Every argument of a shard's call has its type: a user of shard 1 who may
# create in knn_gpu's schema there adds knn_range_join_received with text
# for k, which an untyped NULL k (no k) made the better match: it ran with
# the user mapping's rights, and its answer (no pair) was merged.
sql 1 -c "CREATE ROLE knn_squatter" -c "GRANT CREATE ON SCHEMA public TO knn_squatter" \
  -c "CREATE TABLE knn_captured (who name)" -c "GRANT INSERT ON knn_captured TO PUBLIC" >/dev/null
sql 1 -c "SET ROLE knn_squatter" -c "CREATE FUNCTION public.knn_range_join_received(bigint, text, double precision, text, boolean, text, boolean, text)
  RETURNS TABLE (query_id bigint, target_id bigint, rank integer, distance double precision)
  LANGUAGE sql AS 'WITH c AS (INSERT INTO public.knn_captured SELECT current_user) SELECT 0::bigint, 0::bigint, 0, 0::float8 WHERE false'" >/dev/null
same_as_one_server "knn_range_join without k: a function of that name with text for k on a shard is not called" 2 \
  "knn_range_join('SELECT id, v FROM q', 'SELECT id, v FROM items_h', 2.5, 'l2', false, NULL)" \
  "knn_range_join('SELECT id, v FROM q', 'SELECT id, v FROM items_all', 2.5, 'l2', false, NULL)"
check "... it did not run" 0 "$(sql 1 -c "SELECT count(*) FROM knn_captured")"
sql 1 -c "DROP FUNCTION public.knn_range_join_received(bigint, text, double precision, text, boolean, text, boolean, text)" \
  -c "DROP TABLE knn_captured" -c "REVOKE CREATE ON SCHEMA public FROM knn_squatter" -c "DROP ROLE knn_squatter" >/dev/null
# knn_range_join's queries go into the shards' memory too; a shard without
# knn_range_join_received gets them by COPY, beside one that receives them.
RANGE_ARGS="bigint, text, double precision, text, boolean, integer, boolean, text"
away_on_shard2 knn_range_join_received "$RANGE_ARGS"
same_as_one_server "knn_range_join, a shard without knn_range_join_received: COPY beside memory" 2 \
  "knn_range_join('SELECT id, v FROM q', 'SELECT id, v FROM items_h', 2.5, 'l1', true, 4)" \
  "knn_range_join('SELECT id, v FROM q', 'SELECT id, v FROM items_all', 2.5, 'l1', true, 4)"
check "... shard1 received the rows in memory, shard2 read them from a temporary table" "$(printf 't\nshard1|t\nshard2|f')" \
  "$(sql 0 -c "SET client_min_messages = warning" \
    -c "SELECT count(*) > 0 FROM knn_range_join('SELECT id, v FROM q', 'SELECT id, v FROM items_h', 2.5)" \
    -c "SELECT s->>'server', s->>'remote_sql' LIKE '%knn_range_join_received(%' FROM json_array_elements(knn_gpu_last_shard_stats()->'shards') s ORDER BY 1" 2>&1)"
back_on_shard2 knn_range_join_received "$RANGE_ARGS"
# 15000 queries, about 6 MB: several 1 MB blocks to each shard, more than
# are encoded ahead of the slowest shard, so blocks are reused as they go
same_as_one_server "knn_join of 15000 queries, shipped in several blocks to each shard" 2 \
  "knn_join('SELECT id, v FROM bigq WHERE id % 20 = 0', 'SELECT id, v FROM big', 3)" \
  "knn_join('SELECT id, v FROM bigq WHERE id % 20 = 0', 'SELECT id, v FROM big_here', 3)"
same_as_one_server "knn_join with bound parameters (a custom plan: the values go to the shards)" 2 \
  "knn_join('SELECT id, v FROM q', 'SELECT id, v FROM items_h WHERE cat <> \$1::int AND id > \$2', 5, ARRAY['2', '40'])" \
  "knn_join('SELECT id, v FROM q', 'SELECT id, v FROM items_all WHERE cat <> 2 AND id > 40', 5)"
same_as_one_server "keyed knn_join: read here" 0 \
  "knn_join('SELECT id, v FROM q', 'SELECT id, v FROM items_h', 5, key => NULL::bigint)" \
  "knn_join('SELECT id, v FROM q', 'SELECT id, v FROM items_all', 5, key => NULL::bigint)"
same_as_one_server "knn_join with group keys: read here" 0 \
  "knn_join('SELECT id, v, cat FROM q', 'SELECT id, v, cat FROM items_h', 5)" \
  "knn_join('SELECT id, v, cat FROM q', 'SELECT id, v, cat FROM items_all', 5)"
check_has "a keyed knn_join falls back with a NOTICE" \
  'NOTICE:  knn_join reads the rows of foreign server "shard1" and others here: calls with a key argument are joined here' \
  "$(sql 0 -c "SELECT count(*) FROM knn_join('SELECT id, v FROM q', 'SELECT id, v FROM items_h', 5, key => NULL::bigint)" 2>&1)"
check_has "knn_join with group keys falls back with a NOTICE" \
  'NOTICE:  knn_join reads the rows of foreign server "shard1" and others here: query and target texts with group key columns are joined here' \
  "$(sql 0 -c "SELECT count(*) FROM knn_join('SELECT id, v, cat FROM q', 'SELECT id, v, cat FROM items_h', 5)" 2>&1)"

# ---- a shard that is down ----
stop_server 2
out=$(sql 0 -c "SELECT count(*) FROM knn_join('SELECT id, v FROM q', 'SELECT id, v FROM items_h', 3)" 2>&1)
case "$out" in
  *'ERROR:  could not connect to server "shard2"'*) pass "a stopped shard: ERROR naming the server" ;;
  *) fail "a stopped shard: ERROR naming the server: $out" ;;
esac
check_has "a stopped shard under the KNN Join node: ERROR naming the server" \
  'ERROR:  could not connect to server "shard2"' "$(sql 0 -c "$NODE_SQL" 2>&1)"
resume_server 2 || fail "restarting shard2"

# A shard that fails during the join: its error, and the server's name.
sql 1 -c "ALTER TABLE items_h_0 RENAME TO items_h_0_away" >/dev/null
out=$(sql 0 -c "SELECT count(*) FROM knn_join('SELECT id, v FROM q', 'SELECT id, v FROM items_h', 3)" 2>&1)
case "$out" in
  *ERROR*'knn_join on foreign server "shard1"'*) pass "a failing shard: its ERROR, naming the server" ;;
  *) fail "a failing shard: its ERROR, naming the server: $out" ;;
esac
sql 1 -c "ALTER TABLE items_h_0_away RENAME TO items_h_0" >/dev/null

# ---- the shards read their targets while the coordinator reads its queries ----
# (knn_shard_prefetch_targets there, held for the join: knn_shard_receive.h)
# targets_read_ahead QUERIES: per shard, whether it read its targets ahead
# (seconds_read, targets_read in the statistics), and whether the
# coordinator's query read time is there
targets_read_ahead() {
  sql 0 -c "SET client_min_messages = warning" \
    -c "SELECT count(*) > 0 FROM knn_join('$1', 'SELECT id, v FROM items_h', 5)" \
    -c "SELECT s->>'server', s->>'seconds_read' IS NOT NULL, coalesce((s->>'targets_read')::int > 0, false)
        FROM json_array_elements(knn_gpu_last_shard_stats()->'shards') s ORDER BY 1" \
    -c "SELECT knn_gpu_last_shard_stats()->'seconds'->>'queries' IS NOT NULL" 2>&1
}
check "both shards read their targets while the queries were read here" \
  "$(printf 't\nshard1|t|t\nshard2|t|t\nt')" "$(targets_read_ahead "$V")"
# prefetched CALL: the call's rows with the targets read ahead and without
# (knn_gpu.shard_prefetch = off), compared both ways; and how many shards read ahead
prefetched() {
  sql 0 2>&1 <<EOF
SET client_min_messages = warning;
CREATE TEMP TABLE a AS SELECT * FROM $1;
CREATE TEMP TABLE n AS SELECT count(*) FILTER (WHERE s->>'seconds_read' IS NOT NULL) AS ahead
  FROM json_array_elements(knn_gpu_last_shard_stats()->'shards') s;
SET knn_gpu.shard_prefetch = off;
CREATE TEMP TABLE b AS SELECT * FROM $1;
SELECT (SELECT count(*) FROM (SELECT * FROM a EXCEPT ALL SELECT * FROM b) x)
     + (SELECT count(*) FROM (SELECT * FROM b EXCEPT ALL SELECT * FROM a) y)
     || ' differences, ' || ((SELECT count(*) FROM a) > 0) || ', ' || (SELECT ahead FROM n) || ' read ahead';
EOF
}
for call in "knn_join('SELECT id, v FROM q', 'SELECT id, v FROM items_h', 7, 'cosine', true)" \
            "knn_join('SELECT id, h FROM q', 'SELECT id, h FROM items_h WHERE cat = 1', 4, 'ip', false)" \
            "knn_join('SELECT id, v FROM q', 'SELECT id, h FROM items_h', 3, 'l1', false)" \
            "knn_join('SELECT id, b FROM q', 'SELECT id, b FROM items_h', 6, 'hamming', true)" \
            "knn_range_join('SELECT id, v FROM q', 'SELECT id, v FROM items_h', 1.5, 'l2', true)" \
            "knn_join('SELECT id, v FROM q', 'SELECT id, v FROM items_r', 5, 'l2', false)"; do
  check "targets read ahead, the same rows as without: $call" "0 differences, true, 2 read ahead" \
    "$(prefetched "$call")"
done
check "knn_gpu.shard_prefetch = off: the old order, nothing read ahead" \
  "$(printf 't\nshard1|f|f\nshard2|f|f\nf')" "$(PGOPTIONS='-c knn_gpu.shard_prefetch=off' targets_read_ahead "$V")"
# a shard whose knn_gpu has no knn_shard_prefetch_targets reads its targets in its join, as before
away_on_shard2 knn_shard_prefetch_targets "bigint, regtype, text, text"
check "a shard without knn_shard_prefetch_targets: only the other reads ahead" \
  "$(printf 't\nshard1|t|t\nshard2|f|f\nt')" "$(targets_read_ahead "$V")"
check "... the same rows as without reading ahead" "0 differences, true, 1 read ahead" \
  "$(prefetched "knn_join('SELECT id, v FROM q', 'SELECT id, v FROM items_h', 5, 'l2', true)")"
compare "... and as one server" "$V" "SELECT id, v FROM items_h" "SELECT id, v FROM items_all" 5 l2 true 2
back_on_shard2 knn_shard_prefetch_targets "bigint, regtype, text, text"
# queries read through the shards' connections (a foreign table, a function
# that runs SQL) are read first, as before: nothing read ahead
check "queries of a foreign table: read first, no target read ahead" \
  "$(printf 't\nshard1|f|f\nshard2|f|f\nt')" "$(targets_read_ahead "SELECT id, v FROM items_h WHERE id % 7 = 0")"
check "queries through a SQL function: read first, no target read ahead" \
  "$(printf 't\nshard1|f|f\nshard2|f|f\nt')" "$(targets_read_ahead "SELECT id, v FROM q WHERE odd_cat(id::int)")"
compare "queries of a foreign table: the same rows as one server" "SELECT id, v FROM items_h WHERE id % 7 = 0" \
  "SELECT id, v FROM items_h" "SELECT id, v FROM items_all" 4 l2 true 2
# calls that join here after all (query ids repeat; no query): the shards'
# targets read ahead are dropped at once, not at the end of the transaction
for queries in "SELECT id, v FROM q UNION ALL SELECT id, v FROM q WHERE id < 100" "SELECT id, v FROM q WHERE id < 0"; do
  out=$(sql 0 2>&1 <<EOF
BEGIN;
SET LOCAL client_min_messages = warning;
CREATE TEMP TABLE a AS SELECT * FROM knn_join('$queries', 'SELECT id, v FROM items_h', 3);
SELECT 'held:' || count(*) FROM shard1_contexts WHERE name = 'knn_gpu prefetched targets';
SELECT 'held:' || count(*) FROM shard2_contexts WHERE name = 'knn_gpu prefetched targets';
CREATE TEMP TABLE b AS SELECT * FROM knn_join('$queries', 'SELECT id, v FROM items_all', 3);
SELECT 'same:' || ((SELECT count(*) FROM (SELECT * FROM a EXCEPT ALL SELECT * FROM b) x)
     + (SELECT count(*) FROM (SELECT * FROM b EXCEPT ALL SELECT * FROM a) y));
COMMIT;
EOF
)
  check "joined here after the shards read ahead ($queries): nothing held on them, the right rows" \
    "$(printf 'held:0\nheld:0\nsame:0')" "$(echo "$out" | grep -E '^(held|same):')"
done
check_has "... query ids repeating: said" "query ids repeat" \
  "$(sql 0 -c "SELECT count(*) FROM knn_join('SELECT id, v FROM q UNION ALL SELECT id, v FROM q', 'SELECT id, v FROM items_h', 3)" 2>&1)"
# the shard's side: held for the join of its set and text, taken by it, gone with the transaction
check "knn_shard_prefetch_targets: held for its set's join, taken by it, gone at the end" \
  "$(printf '%s\n' "$(sql 1 -c "SELECT count(v) FROM items_h_0")" t t -1 -1 "$(sql 1 -c "SELECT count(v) FROM items_h_0 WHERE id < 3")" dropped -1)" \
  "$(sql 1 2>&1 <<'EOF'
BEGIN;
SELECT targets_read FROM knn_shard_prefetch_targets(9, 'vector', 'SELECT id, v FROM items_h_0', 'l2');
SELECT knn_shard_receive_queries(9, 'vector', (SELECT string_agg(int4send(8) || int8send(id) || int4send(length(knn_vector_send(v))) || knn_vector_send(v), ''::bytea) FROM items_h_0 WHERE id < 50)) > 0;
SELECT count(*) > 0 FROM knn_join_received_packed(9, 'SELECT id, v FROM items_h_0', 3, 'l2', false, 'auto') p;
SELECT knn_shard_held_targets();
COMMIT;
SELECT knn_shard_held_targets();
BEGIN;
SELECT targets_read FROM knn_shard_prefetch_targets(10, 'vector', 'SELECT id, v FROM items_h_0 WHERE id < 3', 'l2');
SELECT 'dropped' FROM (SELECT knn_shard_drop_targets(10)) d;
SELECT knn_shard_held_targets();
COMMIT;
EOF
)"
# another text than the one read ahead: the join reads its own (3 neighbours each, not the 2 or fewer read ahead)
check "knn_shard_prefetch_targets: a join of another text reads that text" "$(printf 't\nt\nt')" "$(sql 1 2>&1 <<'EOF'
BEGIN;
SELECT knn_shard_prefetch_targets(11, 'vector', 'SELECT id, v FROM items_h_0 WHERE id < 3', 'l2') IS NOT NULL;
SELECT knn_shard_receive_queries(11, 'vector', (SELECT string_agg(int4send(8) || int8send(id) || int4send(length(knn_vector_send(v))) || knn_vector_send(v), ''::bytea) FROM items_h_0 WHERE id < 50)) IS NOT NULL;
SELECT sum(length(p)) / 24 = 3 * (SELECT count(v) FROM items_h_0 WHERE id < 50) FROM knn_join_received_packed(11, 'SELECT id, v FROM items_h_0', 3, 'l2', false, 'auto') p;
COMMIT;
EOF
)"

# ---- statement_timeout and cancel in the middle of the shards' work ----
BIG="SELECT count(*) FROM knn_join('SELECT id, v FROM big', 'SELECT id, v FROM big', 10, 'l2', false, 'brute')"
# (a join read in batches runs in its cursor's FETCH: knn_shard_remote_send)
active_on_shards() {
  local n=0 c
  for i in 1 2; do
    c=$(sql "$i" -c "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND pid <> pg_backend_pid() AND (query LIKE '%pg_temp.knn_shard_queries%' OR query LIKE '%knn_join_received_packed(%' OR query LIKE '%knn_range_join_received(%' OR query LIKE '%knn_join_received_held_packed(%' OR query LIKE '%knn_shard_receive_queries(%' OR query LIKE '%knn_shard_prefetch_targets(%' OR query LIKE '%knn_shard_prefetch_self_join(%' OR query LIKE '%knn_shard_held_target_blocks(%' OR query LIKE '%FETCH % FROM knn_gpu_join_%')")
    n=$((n + c))
  done
  echo "$n"
}
start=$(date +%s%N)
out=$(sql 0 <<EOF 2>&1
SET statement_timeout = '1500ms';
\set ON_ERROR_STOP 0
$BIG;
RESET statement_timeout;
SELECT 'after:' || count(*) FROM shard1_pg_class WHERE relname LIKE 'knn_shard_queries%';
SELECT 'after:' || count(*) FROM shard2_pg_class WHERE relname LIKE 'knn_shard_queries%';
SELECT 'after:' || count(*) FROM shard1_contexts WHERE name IN ('knn_gpu received queries', 'knn_gpu prefetched targets');
SELECT 'after:' || count(*) FROM shard2_contexts WHERE name IN ('knn_gpu received queries', 'knn_gpu prefetched targets');
SELECT 'again:' || (count(*) > 0) FROM knn_join('SELECT id, v FROM q', 'SELECT id, v FROM items_h', 3);
EOF
)
ms=$(( ($(date +%s%N) - start) / 1000000 ))
case "$out" in
  *'canceling statement due to statement timeout'*) pass "statement_timeout ends a sharded join" ;;
  *) fail "statement_timeout ends a sharded join: $out" ;;
esac
check "after the timeout: no temporary table, no received rows on the shards, the session works" \
  "$(printf 'after:0\nafter:0\nafter:0\nafter:0\nagain:true')" "$(echo "$out" | grep -E '^(after|again):')"
check "the shards stopped working" 0 "$(active_on_shards)"

# statement_timeout at many points of a join: reading the queries, shipping
# them, the shards' work; each must end at once, leave nothing behind, and
# leave a session that works.
# timeouts_at NAME SQL TIMES...: SQL under statement_timeout at each of TIMES (ms)
# ends within 3 s of it, leaves no temporary table, no rows held and no prepared
# statement on the shards, and a session that works.
timeouts_at() {
  local name=$1 query=$2 t ok=0 points=0 start ms out
  shift 2
  for t in "$@"; do
    points=$((points + 1))
    start=$(date +%s%N)
    out=$(sql 0 2>&1 <<EOF
SET client_min_messages = warning;
SET statement_timeout = '${t}ms';
\\set ON_ERROR_STOP 0
$query;
RESET statement_timeout;
SELECT 'after:' || count(*) FROM shard1_pg_class WHERE relname LIKE 'knn_shard_queries%';
SELECT 'after:' || count(*) FROM shard2_pg_class WHERE relname LIKE 'knn_shard_queries%';
SELECT 'after:' || count(*) FROM shard1_contexts WHERE name IN ('knn_gpu received queries', 'knn_gpu prefetched targets');
SELECT 'after:' || count(*) FROM shard2_contexts WHERE name IN ('knn_gpu received queries', 'knn_gpu prefetched targets');
SELECT 'after:' || count(*) FROM shard1_prepared WHERE name LIKE 'knn_gpu_receive_queries_%';
SELECT 'after:' || count(*) FROM shard2_prepared WHERE name LIKE 'knn_gpu_receive_queries_%';
SELECT 'again:' || (count(*) > 0) FROM knn_join('SELECT id, v FROM q', 'SELECT id, v FROM items_h', 3);
EOF
)
    ms=$(( ($(date +%s%N) - start) / 1000000 ))
    if [ "$(echo "$out" | grep -E '^(after|again):' | tr '\n' ' ')" = "after:0 after:0 after:0 after:0 after:0 after:0 again:true " ] &&
       ! echo "$out" | grep -q WARNING && [ "$ms" -lt $((t + 3000)) ]; then
      ok=$((ok + 1))
    else
      echo "$name: statement_timeout = ${t}ms (${ms} ms in all): $out"
    fi
  done
  check "$name: statement_timeout at $points points: ends at once, nothing left behind (no prepared statement either), the session works" "$points" "$ok"
}
BIGQ="SELECT count(*) FROM knn_join('SELECT id, v FROM bigq', 'SELECT id, v FROM big', 1, 'l2', false, 'brute')"
timeouts_at "many queries" "$BIGQ" $(seq 100 30 1000) 1300 1800
check "the shards stopped working" 0 "$(active_on_shards)"

# A cancel once a shard's closing pipeline sync is sent, before its answer
# (the test hook stands for it: a real timeout lands there rarely): the
# shipping's cleanup reads up to that sync instead of sending another, so the
# connection leaves pipeline mode and postgres_fdw's abort raises no WARNING.
out=$(sql 0 2>&1 <<EOF
SET client_min_messages = warning;
SET knn_gpu.fault_injection = ship_cancel_at_sync;
\\set ON_ERROR_STOP 0
$BIGQ;
RESET knn_gpu.fault_injection;
SELECT 'after:' || count(*) FROM shard1_pg_class WHERE relname LIKE 'knn_shard_queries%';
SELECT 'after:' || count(*) FROM shard2_pg_class WHERE relname LIKE 'knn_shard_queries%';
SELECT 'after:' || count(*) FROM shard1_prepared WHERE name LIKE 'knn_gpu_receive_queries_%';
SELECT 'after:' || count(*) FROM shard2_prepared WHERE name LIKE 'knn_gpu_receive_queries_%';
SELECT 'again:' || (count(*) > 0) FROM knn_join('SELECT id, v FROM q', 'SELECT id, v FROM items_h', 3);
EOF
)
check "a cancel at the shipping's closing sync: the cancel's error, no WARNING, nothing left, the session works" \
  "$(printf 'ERROR:  canceling statement due to user request\nafter:0\nafter:0\nafter:0\nafter:0\nagain:true')" \
  "$(echo "$out" | grep -E '^(after|again):|WARNING|ERROR:' | sed 's/^.*ERROR:/ERROR:/')"

# cancel_and_wait PID: cancels the coordinator's backend named knn_shard_cancel
# and waits for its psql (PID, started in the background); sets ms to the
# milliseconds from the cancel to psql's end.
cancel_and_wait() {
  local start
  sql 0 -c "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE application_name = 'knn_shard_cancel'" >/dev/null
  start=$(date +%s%N)
  wait "$1"
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
}

# cancel_in_the_middle WHAT SQL: SQL runs until both shards work on it, is
# cancelled, and ends at once, stopping the shards' work and leaving nothing.
cancel_in_the_middle() {
  local what=$1 bg seen=0 ms leftovers=0
  sql 0 -c "SET application_name = 'knn_shard_cancel'" -c "$2" >"${DIRS[0]}/cancel.out" 2>&1 &
  bg=$!
  for _ in $(seq 1 100); do
    [ "$(active_on_shards)" -ge 2 ] && { seen=1; break; }
    sleep 0.1
  done
  check "$what runs on both shards" 1 "$seen"
  cancel_and_wait "$bg"
  check_has "a cancel ends $what (${ms} ms)" 'canceling statement due to user request' \
    "$(cat "${DIRS[0]}/cancel.out")"
  check "the cancel stopped the shards' work on $what" 0 "$(active_on_shards)"
  for i in 1 2; do
    leftovers=$((leftovers + $(sql "$i" -c "SELECT count(*) FROM pg_class WHERE relname LIKE 'knn_shard_queries%'")))
  done
  check "no temporary table left on the shards after $what" 0 "$leftovers"
}
cancel_in_the_middle "knn_join's big join" "$BIG"
# a range join's pairs are read as they arrive (knn_shard_spill.h): a cancel ends it too
cancel_in_the_middle "a big knn_range_join" \
  "SELECT count(*) FROM knn_range_join('SELECT id, v FROM big WHERE id <= 3000', 'SELECT id, v FROM big', 1000)"

# A cancel, a statement_timeout, and shard 1's backend ending while the
# shards read their targets ahead (shard 1 waits for a lock on big_1
# meanwhile): the coordinator ends at once (the lost shard: an ERROR naming
# it), the shards stop reading, nothing stays held there.
BIG_AHEAD="SELECT count(*) FROM knn_join('SELECT id, v FROM bigq', 'SELECT id, v FROM big', 1, 'l2', false, 'brute')"
reading_ahead_on_shard1() {
  sql 1 -c "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND wait_event_type = 'Lock' AND query LIKE '%knn_shard_prefetch_targets(%'"
}
for how in cancel timeout "shard lost"; do
  sql 1 -c "SET application_name = 'knn_locker'" -c "BEGIN" -c "LOCK TABLE big_1 IN ACCESS EXCLUSIVE MODE" \
    -c "SELECT pg_sleep(6)" -c "COMMIT" >/dev/null 2>&1 &
  locker=$!
  sleep 0.3
  if [ "$how" = timeout ]; then
    sql 0 -c "SET statement_timeout = '1500ms'" -c "$BIG_AHEAD" >"${DIRS[0]}/cancel.out" 2>&1 &
  else
    sql 0 -c "SET application_name = 'knn_shard_cancel'" -c "$BIG_AHEAD" >"${DIRS[0]}/cancel.out" 2>&1 &
  fi
  bg=$!
  seen=0
  for _ in $(seq 1 50); do
    [ "$(reading_ahead_on_shard1)" -ge 1 ] && { seen=1; break; }
    sleep 0.1
  done
  check "shard 1 reads its targets ahead, waiting for the lock ($how)" 1 "$seen"
  [ "$how" = cancel ] &&
    sql 0 -c "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE application_name = 'knn_shard_cancel'" >/dev/null
  # the shard's backend ends in the middle of its read (as if the server went away)
  [ "$how" = "shard lost" ] &&
    sql 1 -c "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE '%knn_shard_prefetch_targets(%' AND pid <> pg_backend_pid()" >/dev/null
  start=$(date +%s%N)
  wait "$bg"
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  case "$how" in
    cancel) expected='canceling statement due to user request' ;;
    timeout) expected='canceling statement due to statement timeout' ;;
    *) expected='knn_join on foreign server "shard1"' ;;
  esac
  check_has "a $how while the shards read ahead ends the join (${ms} ms, shard 1 still locked)" "$expected" \
    "$(cat "${DIRS[0]}/cancel.out")"
  [ "$ms" -lt 3000 ] || fail "the $how took ${ms} ms"
  check "the $how stopped the shards' reading ahead" 0 "$(reading_ahead_on_shard1)"
  check "... and every other work of the join on the shards" 0 "$(active_on_shards)"
  sql 1 -c "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'knn_locker'" >/dev/null
  wait "$locker" 2>/dev/null
  out=$(sql 0 2>&1 <<'EOF'
SET client_min_messages = warning;
SELECT 'held:' || count(*) FROM shard1_contexts WHERE name IN ('knn_gpu prefetched targets', 'knn_gpu received queries');
SELECT 'held:' || count(*) FROM shard2_contexts WHERE name IN ('knn_gpu prefetched targets', 'knn_gpu received queries');
SELECT 'again:' || (count(*) > 0) FROM knn_join('SELECT id, v FROM q', 'SELECT id, v FROM items_h', 3);
EOF
)
  check "after the $how: nothing held on the shards, the session works" \
    "$(printf 'held:0\nheld:0\nagain:true')" "$(echo "$out" | grep -E '^(held|again):')"
done

# The KNN Join node: a timeout and a cancel while the shards join.
BIG_NODE="SELECT count(*) FROM big q CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS d FROM big t WHERE t.id <> q.id ORDER BY t.v <-> q.v LIMIT 10) n"
out=$(sql 0 <<EOF 2>&1
SET statement_timeout = '1500ms';
\set ON_ERROR_STOP 0
$BIG_NODE;
RESET statement_timeout;
SELECT 'after:' || count(*) FROM shard1_pg_class WHERE relname LIKE 'knn_shard_queries%';
SELECT 'after:' || count(*) FROM shard2_pg_class WHERE relname LIKE 'knn_shard_queries%';
SET client_min_messages = warning;
SELECT 'again:' || count(*) FROM ($NODE_SQL) x;
EOF
)
check_has "statement_timeout ends the KNN Join node's sharded join" \
  'canceling statement due to statement timeout' "$out"
check "after the node's timeout: no temporary table on the shards, the session works" \
  "$(printf 'after:0\nafter:0\nagain:171')" "$(echo "$out" | grep -E '^(after|again):')"
check "the shards stopped the node's work" 0 "$(active_on_shards)"
cancel_in_the_middle "the KNN Join node's big join" "$BIG_NODE"

# ---- the query rows shipped while they are read (knn_shard_queries_added) ----
# OVQ: 40000 rows of 96 dimensions (some 15 blocks), read slowly enough
# (pg_sleep now and then) that the shards' reads ahead end first and the
# blocks go out during the read; the shards' targets: 2000 rows of big.
OVQ="SELECT id, v FROM bigq WHERE id < 40000 AND (id % 4000 <> 0 OR pg_sleep(0.02) IS NOT NULL)"
OVT="SELECT id, v FROM big WHERE id <= 2000"
OVT_HERE="SELECT id, v FROM big_here WHERE id <= 2000"
# overlapped QUERIES: debug lines of the shipping, then the differences to one server both ways, rows
overlapped() {
  sql 0 -v "qs=$1" -v "ts=$OVT" -v "tr=$OVT_HERE" 2>&1 <<'EOF'
SET client_min_messages = debug1;
CREATE TEMP TABLE s AS SELECT * FROM knn_join(:'qs', :'ts', 3, 'l2', true);
SET client_min_messages = warning;
CREATE TEMP TABLE o AS SELECT * FROM knn_join(:'qs', :'tr', 3, 'l2', true);
SELECT 'diff:' || ((SELECT count(*) FROM (SELECT * FROM s EXCEPT ALL SELECT * FROM o) x)
     + (SELECT count(*) FROM (SELECT * FROM o EXCEPT ALL SELECT * FROM s) y));
SELECT 'rows:' || count(*) FROM s;
EOF
}
out=$(overlapped "$OVQ")
check_has "query rows shipped while they are read: begun during the read" "while they are read" "$out"
held=$(echo "$out" | sed -n 's/.*query rows shipped to 2 shards in .* (\([0-9]*\) held there before the finish).*/\1/p' | head -1)
check "... most rows held by the shards before the read ended (${held:-?} of 40000)" t \
  "$([ "${held:-0}" -gt 0 ] && echo t || echo f)"
check "... the same rows as one server" "$(printf 'diff:0\nrows:%s' "$(sql 0 -c "SELECT 3 * count(*) FROM bigq WHERE id < 40000")")" \
  "$(echo "$out" | grep -E '^(diff|rows):')"
# halfvec rows, shipped the same way
out=$(overlapped "SELECT id, v::halfvec FROM bigq WHERE id < 40000 AND (id % 4000 <> 0 OR pg_sleep(0.02) IS NOT NULL)")
check_has "halfvec query rows shipped while they are read" "while they are read" "$out"
check "... the same rows as one server" "diff:0" "$(echo "$out" | grep -E '^diff:')"

# ids that repeat, found after the read: the blocks shipped are taken back
# (rolled back to their savepoint there), the call joins here, said
REPEAT="$OVQ UNION ALL SELECT id, v FROM bigq WHERE id < 100"
out=$(sql 0 -v "qs=$REPEAT" -v "ts=$OVT" -v "tr=$OVT_HERE" 2>&1 <<'EOF'
BEGIN;
SET LOCAL client_min_messages = debug1;
CREATE TEMP TABLE a AS SELECT * FROM knn_join(:'qs', :'ts', 3);
SET LOCAL client_min_messages = warning;
SELECT 'held:' || count(*) FROM shard1_contexts WHERE name IN ('knn_gpu received queries', 'knn_gpu prefetched targets');
SELECT 'held:' || count(*) FROM shard2_contexts WHERE name IN ('knn_gpu received queries', 'knn_gpu prefetched targets');
SELECT 'held:' || count(*) FROM shard1_prepared WHERE name LIKE 'knn_gpu_receive_queries_%';
SELECT 'held:' || count(*) FROM shard2_prepared WHERE name LIKE 'knn_gpu_receive_queries_%';
CREATE TEMP TABLE b AS SELECT * FROM knn_join(:'qs', :'tr', 3);
SELECT 'same:' || ((SELECT count(*) FROM (SELECT * FROM a EXCEPT ALL SELECT * FROM b) x)
     + (SELECT count(*) FROM (SELECT * FROM b EXCEPT ALL SELECT * FROM a) y));
SELECT 'again:' || (count(*) > 0) FROM knn_join('SELECT id, v FROM q', 'SELECT id, v FROM items_h', 3);
COMMIT;
EOF
)
check_has "ids repeating after blocks were shipped: said" "query ids repeat" "$out"
check_has "... the blocks had gone out during the read" "while they are read" "$out"
check "... nothing held on the shards (in the same transaction), the right rows, the session goes on" \
  "$(printf 'held:0\nheld:0\nheld:0\nheld:0\nsame:0\nagain:true')" "$(echo "$out" | grep -E '^(held|same|again):')"

# an error far into the query rows (a vector of 2 dimensions at the end),
# at the top level and in a subtransaction rolled back: nothing left on the
# shards, the session (and the transaction) goes on. (The shipping's
# prepared statement on a shard goes at the end of the coordinator's
# transaction, with postgres_fdw's DEALLOCATE ALL after an error.)
BAD="SELECT id, CASE WHEN id = 39999 THEN '[1,2]'::vector ELSE v END FROM bigq WHERE id < 40000 AND (id % 4000 <> 0 OR pg_sleep(0.02) IS NOT NULL) ORDER BY id"
LEFT_HELD="SELECT 'left:' || count(*) FROM shard1_contexts WHERE name IN ('knn_gpu received queries', 'knn_gpu prefetched targets');
SELECT 'left:' || count(*) FROM shard2_contexts WHERE name IN ('knn_gpu received queries', 'knn_gpu prefetched targets');
SELECT 'again:' || (count(*) > 0) FROM knn_join('SELECT id, v FROM q', 'SELECT id, v FROM items_h', 3);"
LEFT_PREPARED="SELECT 'left:' || count(*) FROM shard1_prepared WHERE name LIKE 'knn_gpu_receive_queries_%';
SELECT 'left:' || count(*) FROM shard2_prepared WHERE name LIKE 'knn_gpu_receive_queries_%';"
LEFT="$LEFT_HELD
$LEFT_PREPARED"
LEFT_NONE="$(printf 'left:0\nleft:0\nagain:true\nleft:0\nleft:0')"
for how in top subtransaction; do
  if [ "$how" = top ]; then pre="" post=""; else pre="BEGIN; SAVEPOINT x;" post="ROLLBACK TO SAVEPOINT x;"; fi
  out=$(sql 0 -v "qs=$BAD" -v "ts=$OVT" 2>&1 <<EOF
\\set ON_ERROR_STOP 0
$pre
SET client_min_messages = debug1;
SELECT count(*) FROM knn_join(:'qs', :'ts', 3);
$post
SET client_min_messages = warning;
$LEFT_HELD
$([ "$how" = top ] || echo "COMMIT;")
$LEFT_PREPARED
EOF
)
  check_has "an error far into the query rows ($how): its message" "dimension mismatch: query id 39999" "$out"
  check_has "... after blocks had gone out" "while they are read" "$out"
  check "... nothing left on the shards, the session goes on ($how)" \
    "$LEFT_NONE" "$(echo "$out" | grep -E '^(left|again):')"
done

# statement_timeout and a cancel in the middle of a slow query read whose
# blocks are going out (300 pauses of 10 ms): ends at once, the shards stop,
# nothing left there
SLOW="SELECT count(*) FROM knn_join('SELECT id, v FROM bigq WHERE id % 1000 <> 0 OR pg_sleep(0.01) IS NOT NULL', '$OVT', 1)"
start=$(date +%s%N)
out=$(sql 0 2>&1 <<EOF
\\set ON_ERROR_STOP 0
SET client_min_messages = debug1;
SET statement_timeout = '1500ms';
$SLOW;
RESET statement_timeout;
SET client_min_messages = warning;
$LEFT
EOF
)
ms=$(( ($(date +%s%N) - start) / 1000000 ))
check_has "statement_timeout during the query read: ends the join" "canceling statement due to statement timeout" "$out"
check_has "... with blocks gone out" "while they are read" "$out"
check "... nothing left on the shards, the session works (${ms} ms in all)" \
  "$LEFT_NONE" "$(echo "$out" | grep -E '^(left|again):')"
check "... the shards stopped" 0 "$(active_on_shards)"
sql 0 -c "SET application_name = 'knn_shard_cancel'" -c "SET client_min_messages = debug1" -c "$SLOW" >"${DIRS[0]}/cancel.out" 2>&1 &
bg=$!
sleep 1.5
cancel_and_wait "$bg"
check_has "a cancel during the query read ends the join (${ms} ms)" 'canceling statement due to user request' \
  "$(cat "${DIRS[0]}/cancel.out")"
check_has "... with blocks gone out" "while they are read" "$(cat "${DIRS[0]}/cancel.out")"
[ "$ms" -lt 3000 ] || fail "the cancel took ${ms} ms"
check "... the shards stopped" 0 "$(active_on_shards)"
check "... nothing left on the shards, the session works" \
  "$LEFT_NONE" "$(sql 0 -c "SET client_min_messages = warning" -c "$LEFT" 2>&1 | grep -E '^(left|again):')"

# ---- sharded knn_join's rows without a tuplestore (knn_gpu.direct_return) ----
# A knn_join in FROM over sharded targets hands its merged rows to the KNN
# Join Function node as lists (knn_join_function_scan.h): the same rows in
# the same order as through the tuplestore (direct_return off) and as the
# one-server join, with quals, LIMIT, rescans (LATERAL calls, a nested
# loop's inner side) and an error in the middle of the rows; the rows are
# not spilled by work_mem, the merge is still reported, and nothing of the
# join stays held, neither here nor on the shards.
sql 0 <<'EOF'
-- three_ways(SHARDED, ONE_SERVER): "N rows, S shards, direct = tuplestore, direct = one server"
-- (S: the shards of the direct call's own statistics; = / <>: the same rows in the same order)
CREATE FUNCTION three_ways(sharded text, single text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  before text := knn_gpu_last_shard_stats()::text;
  shards int;
  n int;
  direct_count int;
  rows_text text;
  got text[];  -- per way (sharded direct, sharded through the tuplestore, one server): its rows, in order
BEGIN
  FOR way IN 1..3 LOOP
    PERFORM set_config('knn_gpu.direct_return', (way <> 2)::text, true);
    EXECUTE format('SELECT count(*), array_agg(r::text)::text FROM (%s) r', CASE way WHEN 3 THEN single ELSE sharded END)
      INTO n, rows_text;
    got[way] := rows_text;
    IF way = 1 THEN
      shards := CASE WHEN knn_gpu_last_shard_stats()::text IS DISTINCT FROM before
                     THEN json_array_length(knn_gpu_last_shard_stats()::json->'shards') ELSE 0 END;
      direct_count := n;
    END IF;
  END LOOP;
  RETURN format('%s rows, %s shards, direct %s tuplestore, direct %s one server', direct_count, shards,
                CASE WHEN got[1] IS NOT DISTINCT FROM got[2] THEN '=' ELSE '<>' END,
                CASE WHEN got[1] IS NOT DISTINCT FROM got[3] THEN '=' ELSE '<>' END);
END $$;
EOF
[ $? -eq 0 ] || fail "direct: three_ways() created"
# three_ways NAME SHARDED ONE_SERVER ROWS [SETTINGS]: ROWS rows ("some": at least one),
# both shards joined, the three ways equal
three_ways() {
  local out
  out=$(sql 0 -v "s=$2" -v "o=$3" 2>&1 <<EOF
SET client_min_messages = warning;
${5:-}
SELECT three_ways(:'s', :'o');
EOF
)
  [ "$4" = some ] && out=$(echo "$out" | sed -E 's/^[1-9][0-9]* rows/some rows/')
  check "$1" "$4 rows, 2 shards, direct = tuplestore, direct = one server" "$out"
}
KJ="SELECT * FROM knn_join"
three_ways "direct: items_h l2" "$KJ('SELECT id, v FROM q', 'SELECT id, v FROM items_h', 5)" \
  "$KJ('SELECT id, v FROM q', 'SELECT id, v FROM items_all', 5)" some
three_ways "direct: items_r cosine exclude_self, quals and expressions" \
  "SELECT query_id, target_id * 2, rank FROM knn_join('SELECT id, v FROM q', 'SELECT id, v FROM items_r', 6, 'cosine', true) WHERE rank % 2 = 1" \
  "SELECT query_id, target_id * 2, rank FROM knn_join('SELECT id, v FROM q', 'SELECT id, v FROM items_all', 6, 'cosine', true) WHERE rank % 2 = 1" some
three_ways "direct: NaN distances, ties by target id" "$KJ('$ZERO', 'SELECT id, v FROM items_h', 6, 'cosine')" \
  "$KJ('$ZERO', 'SELECT id, v FROM items_all', 6, 'cosine')" some
three_ways "direct: bit hamming, k past the row count" "$KJ('SELECT id, b FROM q', 'SELECT id, b FROM items_h WHERE cat = 4', 300, 'hamming')" \
  "$KJ('SELECT id, b FROM q', 'SELECT id, b FROM items_all WHERE cat = 4', 300, 'hamming')" some
three_ways "direct: LIMIT" "$KJ('SELECT id, h FROM q', 'SELECT id, h FROM items_h', 5) LIMIT 7" \
  "$KJ('SELECT id, h FROM q', 'SELECT id, h FROM items_all', 5) LIMIT 7" 7
three_ways "direct: OFFSET and LIMIT across queries" "$KJ('SELECT id, v FROM q', 'SELECT id, v FROM items_r', 4, 'l1') OFFSET 37 LIMIT 10" \
  "$KJ('SELECT id, v FROM q', 'SELECT id, v FROM items_all', 4, 'l1') OFFSET 37 LIMIT 10" 10
three_ways "direct: LATERAL calls (a rescan with new parameters calls again)" \
  "SELECT d.x, j.* FROM (VALUES (0), (1), (2)) d(x), LATERAL knn_join(format('SELECT id, v FROM q WHERE mod(id, 3) = %s', d.x), 'SELECT id, v FROM items_h', 2 + d.x) j" \
  "SELECT d.x, j.* FROM (VALUES (0), (1), (2)) d(x), LATERAL knn_join(format('SELECT id, v FROM q WHERE mod(id, 3) = %s', d.x), 'SELECT id, v FROM items_all', 2 + d.x) j" some
three_ways "direct: a nested loop's inner side, rescanned (its rows read again)" \
  "SELECT a.x, j.target_id, j.rank FROM (VALUES (23), (5003), (46), (7)) a(x) LEFT JOIN knn_join('SELECT id, v FROM q', 'SELECT id, v FROM items_h', 3) j ON j.query_id = a.x" \
  "SELECT a.x, j.target_id, j.rank FROM (VALUES (23), (5003), (46), (7)) a(x) LEFT JOIN knn_join('SELECT id, v FROM q', 'SELECT id, v FROM items_all', 3) j ON j.query_id = a.x" 10 \
  "SET enable_hashjoin = off; SET enable_mergejoin = off; SET enable_material = off;"
BIGJ="knn_join('SELECT id, v FROM big WHERE id <= 2000', 'SELECT id, v FROM big', 10)"
three_ways "direct: 20000 rows of big" "$KJ('SELECT id, v FROM big WHERE id <= 2000', 'SELECT id, v FROM big', 10)" \
  "$KJ('SELECT id, v FROM big WHERE id <= 2000', 'SELECT id, v FROM big_here', 10)" 20000

# The direct path is the one taken: its rows are not spilled to disk by
# work_mem (the tuplestore's are), and the statistics and EXPLAIN ANALYZE
# still report the merge.
spills() {
  sql 0 -c "SET client_min_messages = warning" -c "SET work_mem = '64kB'" -c "SET knn_gpu.direct_return = $1" \
    -c "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF, SUMMARY OFF) SELECT * FROM $BIGJ" 2>&1 |
    grep -c 'temp read\|temp written'
}
check "direct: the sharded rows are not spilled to disk (work_mem 64kB)" 0 "$(spills on)"
check "... through the tuplestore they are" 1 "$([ "$(spills off)" -ge 1 ] && echo 1 || echo 0)"
out=$(sql 0 -c "SET client_min_messages = warning" -c "SELECT count(*) FROM $BIGJ" \
  -c "SELECT (s->>'rows') || ',' || ((s->'seconds'->>'merge')::float8 > 0) FROM (SELECT knn_gpu_last_shard_stats()::json s) x" 2>&1)
check "direct: knn_gpu_last_shard_stats() has the merge's rows and seconds" "$(printf '20000\n20000,true')" "$out"
out=$(sql 0 -c "SET client_min_messages = warning" \
  -c "EXPLAIN (ANALYZE, COSTS OFF, SUMMARY OFF) SELECT * FROM $BIGJ" 2>&1 | grep -E 'Shard Merge (Rows|Time)|KNN Join Function' |
  sed -E 's/actual time=[0-9.]+ /actual /; s/[0-9.]+ ms/N ms/; s/ +/ /g; s/^ //')
check "direct: EXPLAIN ANALYZE shows the merge" "$(printf 'Custom Scan (KNN Join Function) (actual rows=20000 loops=1)\nShard Merge Rows: 20000\nShard Merge Time: N ms')" "$out"

# An error in the middle of the rows (rank 3 of the first query), on both
# paths, caught or not; LIMITs and whole reads: the session's memory does
# not grow (the merged rows, 320 kB a call, go with the statement), nothing
# is held on the shards, and the session goes on.
out=$(sql 0 2>&1 <<EOF
\set ON_ERROR_STOP 0
SET client_min_messages = warning;
SELECT count(*) FROM $BIGJ;
SELECT query_id, 1 / (rank - 3) FROM $BIGJ;
DO \$\$ BEGIN PERFORM count(*) FROM $BIGJ; END \$\$;
CREATE TEMP TABLE mem AS SELECT sum(total_bytes) AS before FROM pg_backend_memory_contexts;
SELECT query_id, 1 / (rank - 3) FROM $BIGJ;
SET knn_gpu.direct_return = off;
SELECT query_id, 1 / (rank - 3) FROM $BIGJ;
RESET knn_gpu.direct_return;
DO \$\$
DECLARE
  n bigint;
BEGIN
  FOR i IN 1..3 LOOP
    BEGIN
      SELECT sum(1 / (rank - 3)) INTO n FROM $BIGJ;
    EXCEPTION WHEN division_by_zero THEN
      NULL;
    END;
    SELECT count(*) INTO n FROM (SELECT * FROM $BIGJ LIMIT 5) l;
    SELECT count(*) INTO n FROM $BIGJ;
  END LOOP;
END \$\$;
SELECT 'grown:' || (sum(total_bytes) - (SELECT before FROM mem) < 262144) FROM pg_backend_memory_contexts;
SELECT 'result contexts:' || count(*) FROM pg_backend_memory_contexts WHERE name = 'knn_join direct result';
SELECT 'held:' || count(*) FROM shard1_contexts WHERE name IN ('knn_gpu received queries', 'knn_gpu prefetched targets');
SELECT 'held:' || count(*) FROM shard2_contexts WHERE name IN ('knn_gpu received queries', 'knn_gpu prefetched targets');
SELECT 'again:' || count(*) FROM $BIGJ;
EOF
)
check_has "direct: an error in the middle of the sharded rows" "ERROR:  division by zero" "$out"
check "... the memory does not grow, nothing is held here or on the shards, the session works" \
  "$(printf 'grown:true\nresult contexts:0\nheld:0\nheld:0\nagain:20000')" "$(echo "$out" | grep -E '^(grown|result contexts|held|again):')"

# ---- results past knn_gpu.max_result_memory ----
# A sharded knn_join whose lists would pass the limit reads the shards'
# rows as they arrive into temporary files per batch of queries and merges
# one batch at a time: the same rows in the same order as the whole join
# and as one server, through the tuplestore (direct return too), no
# temporary file left. The KNN Join node holds its whole result: past the
# limit it ends with ERROR 54000 as what it holds passes it (the rows that
# came: a LIMIT past the table asks for the table).
sql 0 <<'EOF'
-- peak_mb(): this backend's peak memory (VmHWM), in MB
CREATE FUNCTION peak_mb() RETURNS bigint LANGUAGE sql AS
  $$ SELECT (regexp_match(pg_read_file('/proc/self/status'), 'VmHWM:\s+(\d+) kB'))[1]::bigint / 1024 $$;
-- batched(SHARDED, ONE_SERVER): "N rows, B batches, batched = whole, whole = one server"
CREATE FUNCTION batched(sharded text, single text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  got text[];  -- per way (sharded within 1 GB, sharded within 1 MB, one server): its rows, in order
  n int;
  batches text;
  rows_text text;
BEGIN
  FOR way IN 1..3 LOOP
    PERFORM set_config('knn_gpu.max_result_memory', CASE way WHEN 2 THEN '1' ELSE '1024' END, true);
    EXECUTE format('SELECT count(*), array_agg(r::text)::text FROM (%s) r', CASE way WHEN 3 THEN single ELSE sharded END)
      INTO n, rows_text;
    got[way] := rows_text;
    IF way = 2 THEN
      batches := coalesce(knn_gpu_last_shard_stats()::json->>'merge_batches', 'no');
    END IF;
  END LOOP;
  RETURN format('%s rows, %s batches, batched %s whole, whole %s one server', n,
                CASE WHEN batches <> 'no' AND batches::int > 1 THEN 'several' ELSE batches END,
                CASE WHEN got[1] IS NOT DISTINCT FROM got[2] THEN '=' ELSE '<>' END,
                CASE WHEN got[1] IS NOT DISTINCT FROM got[3] THEN '=' ELSE '<>' END);
END $$;
EOF
[ $? -eq 0 ] || fail "max_result_memory: batched() created"
# batched NAME SHARDED ONE_SERVER ROWS
batched() {
  local out
  out=$(sql 0 -v "s=$2" -v "o=$3" 2>&1 <<'EOF'
SET client_min_messages = warning;
SELECT batched(:'s', :'o');
EOF
)
  check "$1" "$4 rows, several batches, batched = whole, whole = one server" "$out"
}
batched "max_result_memory: knn_join of 5000 queries, 1 MB" \
  "$KJ('SELECT id, v FROM big WHERE id <= 5000', 'SELECT id, v FROM big', 10)" \
  "$KJ('SELECT id, v FROM big WHERE id <= 5000', 'SELECT id, v FROM big_here', 10)" 50000
batched "max_result_memory: a local partition, ties, k = 300, exclude_self, l1" \
  "$KJ('SELECT id, v FROM items_all', 'SELECT id, v FROM items_h', 300, 'l1', true)" \
  "$KJ('SELECT id, v FROM items_all', 'SELECT id, v FROM items_all', 300, 'l1', true)" 330000
batched "max_result_memory: a self-join's queries from the shards" \
  "$KJ('SELECT id, v FROM big WHERE id <= 4000', 'SELECT id, v FROM big WHERE id <= 4000', 10, 'cosine', true)" \
  "$KJ('SELECT id, v FROM big_here WHERE id <= 4000', 'SELECT id, v FROM big_here WHERE id <= 4000', 10, 'cosine', true)" 40000
batched "max_result_memory: halfvec, in a target list" \
  "SELECT knn_join('SELECT id, h FROM items_all', 'SELECT id, h FROM items_h', 200)" \
  "SELECT knn_join('SELECT id, h FROM items_all', 'SELECT id, h FROM items_all', 200)" 220000
batched "max_result_memory: the packed form called value per call" \
  "SELECT knn_join_packed('SELECT id, v FROM items_all', 'SELECT id, v FROM items_r', 300, 'l2', false, 'auto')" \
  "SELECT knn_join_packed('SELECT id, v FROM items_all', 'SELECT id, v FROM items_all', 300, 'l2', false, 'auto')" 6
# knn_range_join has no bound but the limit: the shards' pairs are read as
# they arrive, held while they fit, then in temporary files per batch
batched "max_result_memory: knn_range_join, no cap" \
  "SELECT * FROM knn_range_join('SELECT id, v FROM items_all', 'SELECT id, v FROM items_h', 5.0)" \
  "SELECT * FROM knn_range_join('SELECT id, v FROM items_all', 'SELECT id, v FROM items_all', 5.0)" 265774
batched "max_result_memory: knn_range_join, k = 300, l1, exclude_self, a partition read here" \
  "SELECT * FROM knn_range_join('SELECT id, v FROM items_all', 'SELECT id, v FROM items_r', 9.0, 'l1', true, 300)" \
  "SELECT * FROM knn_range_join('SELECT id, v FROM items_all', 'SELECT id, v FROM items_all', 9.0, 'l1', true, 300)" 89862
out=$(sql 0 2>&1 <<'EOF'
SELECT count(*) FROM knn_range_join('SELECT id, v FROM big_here WHERE id <= 1', 'SELECT id, v FROM big', 1000);
SELECT peak_mb() AS before \gset
SET knn_gpu.max_result_memory = 1;
SELECT 'pairs:' || count(*) FROM knn_range_join('SELECT id, v FROM big_here WHERE id <= 50', 'SELECT id, v FROM big', 1000);
SELECT 'batches:' || (knn_gpu_last_shard_stats()->>'merge_batches');
SELECT 'grew less than 32 MB:' || (peak_mb() - :before < 32);
EOF
)
check "max_result_memory: knn_range_join of 1500000 pairs within 1 MB: the shards' pairs not held" \
  "$(printf 'pairs:1500000\nbatches:50\ngrew less than 32 MB:true')" "$(echo "$out" | grep -E '^(ERROR|pairs|batches|grew)')"
out=$(sql 0 -c "SELECT 'temporary files:' || count(*) FROM pg_ls_tmpdir()" 2>&1)
check "max_result_memory: no temporary file left" "temporary files:0" "$out"
out=$(sql 0 2>&1 <<'EOF'
\set ON_ERROR_STOP 0
SET knn_gpu.max_result_memory = 1;
\set VERBOSITY sqlstate
SELECT count(*) FROM (SELECT id, v FROM big_here WHERE id <= 2000) q
  CROSS JOIN LATERAL (SELECT t.id FROM big t ORDER BY t.v <-> q.v LIMIT 100) n;
SELECT count(*) FROM q CROSS JOIN LATERAL (SELECT t.id FROM items_h t WHERE t.v <-> q.v < 100 ORDER BY t.v <-> q.v) n;
\set VERBOSITY default
SELECT 'within:' || count(*) FROM (SELECT id, v FROM big_here WHERE id <= 500) q
  CROSS JOIN LATERAL (SELECT t.id FROM big t ORDER BY t.v <-> q.v LIMIT 5) n;
SELECT 'shipped:' || (knn_gpu_last_shard_stats()::json->'shards'->0->>'rows');
EOF
)
# (what is held counts: a row kept, 40 bytes, its row read back, about 50,
# an outer row's array; 500 x 5 rows take about 0.5 MB at their peak, and
# 2000 x 5, which passed when a row counted 16 bytes, about 2 MB)
check "max_result_memory: the KNN Join node past the limit: ERROR 54000, within it the join" \
  "$(printf 'ERROR:  54000\nERROR:  54000\nwithin:2500\nshipped:2500')" "$(echo "$out" | grep -E '^(ERROR|within|shipped)')"

# What the node holds with the candidates counts too: the local part's
# engine arrays (its LIMIT's neighbours and distances per outer row, held
# through the shards' rows and the merge), the inner rows' pointers and the
# batch of a shard's cursor being read. 1101 outer rows x LIMIT 300 with a
# local partition (5 MB of arrays) passed 85 MB when the arrays were
# checked on their own (from 83 MB); counted, they need 88 MB, and within
# 90 MB the rows are one server's.
NODE_300="SELECT q.id AS qid, n.id, n.d FROM items_all q CROSS JOIN LATERAL
  (SELECT t.id, t.v <-> q.v AS d FROM TBL t ORDER BY t.v <-> q.v, t.id LIMIT 300) n"
out=$(sql 0 -v "s=${NODE_300//TBL/items_h}" -v "r=${NODE_300//TBL/items_all}" 2>&1 <<'EOF'
\set ON_ERROR_STOP 0
SET client_min_messages = warning;
SET knn_gpu.max_result_memory = 85;
\set VERBOSITY sqlstate
SELECT count(*) FROM (:s) j;
\set VERBOSITY default
SET knn_gpu.max_result_memory = 90;
CREATE TEMP TABLE s AS :s;
SELECT 'shards:' || json_array_length(knn_gpu_last_shard_stats()->'shards') || ', local targets:' || (knn_gpu_last_shard_stats()->'local'->>'targets');
RESET knn_gpu.max_result_memory;
CREATE TEMP TABLE r AS :r;
SELECT 'rows:' || (SELECT count(*) FROM s) || ', differences:' || ((SELECT count(*) FROM (SELECT * FROM s EXCEPT ALL SELECT * FROM r) a)
     + (SELECT count(*) FROM (SELECT * FROM r EXCEPT ALL SELECT * FROM s) b));
EOF
)
check "max_result_memory: the KNN Join node counts the local part's arrays with the shards' rows: ERROR 54000, within the limit one server's rows" \
  "$(printf 'ERROR:  54000\nshards:2, local targets:374\nrows:330300, differences:0')" "$(echo "$out" | grep -E '^(ERROR|shards|rows)')"

# Each partition returns OFFSET + LIMIT rows per outer row: the node keeps
# of an outer row's shard rows only those that can still be among its
# first OFFSET + LIMIT (cut back to them when half as many again have
# come; WITH TIES, and those tied with the last), and counts what it
# holds, with the rows read back and the merge's copy. 3000 queries x
# LIMIT 10 over 8 partitions (240000 rows come) within 8 MB: the same
# rows as one server, and the coordinator's peak memory (VmHWM) grows by
# less than 16 MB (the limit, the cursors' batches, the allocator's
# blocks; it held every row that came, about 34 MB, counting 480 kB).
# WITH TIES, an OFFSET and a radius with a LIMIT: the same rows as one
# server (the vectors' small integers tie often).
for i in 1 2; do
  sql "$i" -c "$(for p in $i $((i + 2)) $((i + 4)) $((i + 6)); do echo "CREATE TABLE eight_$p (id bigint, v vector(2));"; done)"
done
sql 0 <<'EOF' || fail "max_result_memory: the 8 partitions' tables"
CREATE TABLE eight (id bigint, v vector(2)) PARTITION BY HASH (id);
DO $$ BEGIN
  FOR p IN 1..8 LOOP
    EXECUTE format('CREATE FOREIGN TABLE eight_%s PARTITION OF eight FOR VALUES WITH (MODULUS 8, REMAINDER %s) SERVER shard%s OPTIONS (table_name %L)',
                   p, p - 1, 2 - p % 2, 'eight_' || p);
  END LOOP;
END $$;
INSERT INTO eight SELECT i, format('[%s,%s]', hashint8(i) & 63, hashint8(i + 7) & 63)::vector
  FROM generate_series(1, 16000) i;
CREATE TABLE eight_here AS SELECT * FROM eight;
CREATE TABLE eight_q AS SELECT i AS id, format('[%s,%s]', hashint8(-i) & 63, hashint8(-i - 7) & 63)::vector AS v
  FROM generate_series(1, 3000) i;
EOF
# eight_rows TABLE FORM: the LATERAL join of eight_q's rows, counted and hashed in a canonical order
eight_rows() {
  echo "SELECT count(*) || ' rows ' || md5(string_agg(format('%s:%s:%s', qid, id, d), ' ' ORDER BY qid, d, id))
    FROM (SELECT q.id AS qid, n.id, n.d FROM eight_q q CROSS JOIN LATERAL
          (SELECT t.id, t.v <-> q.v AS d FROM $1 t $2) n) r"
}
out=$(sql 0 -v "s=$(eight_rows eight 'ORDER BY t.v <-> q.v, t.id LIMIT 10')" \
        -v "o=$(eight_rows eight_here 'ORDER BY t.v <-> q.v, t.id LIMIT 10')" 2>&1 <<'EOF'
SET client_min_messages = warning;
SELECT count(*) FROM (SELECT * FROM eight_q WHERE id <= 10) q
  CROSS JOIN LATERAL (SELECT t.id FROM eight t ORDER BY t.v <-> q.v, t.id LIMIT 10) n;
SELECT peak_mb() AS before \gset
SET knn_gpu.max_result_memory = 8;
SELECT (:s) AS sharded \gset
SELECT 'grew less than 16 MB:' || (peak_mb() - :before < 16);
SELECT 'came:' || (SELECT sum((s->>'rows')::int) FROM json_array_elements(knn_gpu_last_shard_stats()::json->'shards') s);
RESET knn_gpu.max_result_memory;
SELECT (:o) AS single \gset
SELECT 'rows:' || :'sharded';
SELECT 'sharded = one server:' || (:'sharded' = :'single');
EOF
)
check "max_result_memory: the node over 8 partitions holds what it counts: within the limit, = one server" \
  "$(printf 'grew less than 16 MB:true\ncame:240000\nrows:30000 rows\nsharded = one server:true')" \
  "$(echo "$out" | sed 's/^\(rows:[0-9]* rows\) .*/\1/' | grep -E '^(ERROR|grew|came|rows|sharded)')"
for form in "ORDER BY t.v <-> q.v FETCH FIRST 10 ROWS WITH TIES" "ORDER BY t.v <-> q.v, t.id LIMIT 5 OFFSET 5" \
            "ORDER BY t.v <-> q.v, t.id FETCH FIRST 3 ROWS WITH TIES" "WHERE t.v <-> q.v < 3 ORDER BY t.v <-> q.v, t.id LIMIT 4"; do
  out=$(sql 0 -v "s=$(eight_rows eight "$form")" -v "o=$(eight_rows eight_here "$form")" 2>&1 <<'EOF'
SET client_min_messages = warning;
SET knn_gpu.max_result_memory = 32;
SELECT (:s) AS sharded \gset
SELECT 'shards:' || json_array_length(knn_gpu_last_shard_stats()::json->'shards');
SELECT (:o) AS single \gset
SELECT 'sharded = one server:' || (:'sharded' = :'single');
EOF
)
  check "... $form: = one server" "$(printf 'shards:2\nsharded = one server:true')" \
    "$(echo "$out" | grep -E '^(ERROR|shards|sharded)')"
done

# A text ORDER BY key after the distance, of collation "C", goes to the
# shards (it sorts there as here) as "column COLLATE "C" DESC NULLS ...":
# the COLLATE before the direction (after it, each shard's SQL was a
# syntax error). ASC and DESC, NULLS FIRST and LAST, WITH TIES with an
# OFFSET (the rows compared by their values: which of the tied rows the
# OFFSET skips is the plan's choice), over 3 partitions on 2 shards and a
# local one: the same rows as one server, joined on both shards.
for i in 1 2; do
  sql "$i" -c "CREATE TABLE named_$i (id bigint, v vector(2), name text COLLATE \"C\")" || fail "the named tables"
done
sql 1 -c "CREATE TABLE named_3 (id bigint, v vector(2), name text COLLATE \"C\")" || fail "the named tables"
sql 0 <<'EOF' || fail "the named tables"
CREATE TABLE named (id bigint, v vector(2), name text COLLATE "C") PARTITION BY RANGE (id);
CREATE FOREIGN TABLE named_1 PARTITION OF named FOR VALUES FROM (MINVALUE) TO (200) SERVER shard1;
CREATE FOREIGN TABLE named_2 PARTITION OF named FOR VALUES FROM (200) TO (400) SERVER shard2;
CREATE FOREIGN TABLE named_3 PARTITION OF named FOR VALUES FROM (400) TO (600) SERVER shard1;
CREATE TABLE named_0 PARTITION OF named FOR VALUES FROM (600) TO (MAXVALUE);
INSERT INTO named SELECT i, format('[%s,%s]', hashint8(i) & 3, hashint8(i + 7) & 3)::vector,
  CASE WHEN i % 7 = 0 THEN NULL ELSE (ARRAY['a', 'B', 'b', '_'])[1 + (hashint8(i + 3) & 3)] END
  FROM generate_series(1, 800) i;
CREATE TABLE named_here AS SELECT * FROM named;
CREATE TABLE named_q AS SELECT i AS id, format('[%s,%s]', hashint8(-i) & 3, hashint8(-i - 7) & 3)::vector AS v
  FROM generate_series(1, 40) i;
EOF
# named_rows TABLE FORM: the LATERAL join of named_q's rows (id, name and distance), counted and hashed
named_rows() {
  echo "SELECT count(*) || ' rows ' || md5(string_agg(format('%s:%s:%s', qid, name, d), ' ' ORDER BY qid, d, name))
    FROM (SELECT q.id AS qid, n.name, n.d FROM named_q q CROSS JOIN LATERAL
          (SELECT t.name, t.v <-> q.v AS d FROM $1 t $2) n) r"
}
for form in "ORDER BY t.v <-> q.v, t.name DESC NULLS FIRST, t.id LIMIT 3" "ORDER BY t.v <-> q.v, t.name FETCH FIRST 2 ROWS WITH TIES" \
            "ORDER BY t.v <-> q.v, t.name DESC NULLS LAST OFFSET 5 FETCH FIRST 2 ROWS WITH TIES"; do
  out=$(sql 0 -v "s=$(named_rows named "$form")" -v "o=$(named_rows named_here "$form")" 2>&1 <<'EOF'
SET client_min_messages = warning;
SELECT (:s) AS sharded \gset
SELECT 'shards:' || json_array_length(knn_gpu_last_shard_stats()::json->'shards');
SET knn_gpu.enable_knn_join = off;
SELECT (:o) AS single \gset
SELECT 'sharded = one server:' || (:'sharded' = :'single');
EOF
)
  check "a text ORDER BY key of collation \"C\" on the shards: $form: = one server" \
    "$(printf 'shards:2\nsharded = one server:true')" "$(echo "$out" | grep -E '^(ERROR|shards|sharded)')"
done

# A cancel while the local part of a batched join writes its pairs into the
# temporary files (40000 queries x k = 1000 local targets: 1.3 GB, seconds
# of writing in one batch; the shards hold 10 rows each) ends it at once.
for i in 1 2; do sql "$i" -c "CREATE TABLE spill_w_$i (id bigint, v vector(2))"; done
sql 0 <<'EOF' || fail "max_result_memory: the spill cancel's tables"
CREATE TABLE spill_w (id bigint, v vector(2)) PARTITION BY RANGE (id);
CREATE FOREIGN TABLE spill_w_1 PARTITION OF spill_w FOR VALUES FROM (MINVALUE) TO (11)
  SERVER shard1 OPTIONS (table_name 'spill_w_1');
CREATE FOREIGN TABLE spill_w_2 PARTITION OF spill_w FOR VALUES FROM (11) TO (21)
  SERVER shard2 OPTIONS (table_name 'spill_w_2');
CREATE TABLE spill_w_0 PARTITION OF spill_w FOR VALUES FROM (21) TO (MAXVALUE);
INSERT INTO spill_w SELECT i, format('[%s,%s]', hashint8(i) & 1023, hashint8(i + 7) & 1023)::vector
  FROM generate_series(1, 1020) i;
CREATE TABLE spill_q AS SELECT i AS id, format('[%s,%s]', hashint8(-i) & 1023, hashint8(-i - 7) & 1023)::vector AS v
  FROM generate_series(1, 40000) i;
EOF
sql 0 -c "SET application_name = 'knn_shard_cancel'" -c "SET knn_gpu.max_result_memory = 700" \
  -c "SELECT count(*) FROM knn_join('SELECT id, v FROM spill_q', 'SELECT id, v FROM spill_w', 1000)" \
  >"${DIRS[0]}/cancel.out" 2>&1 &
bg=$!
seen=0
for _ in $(seq 1 600); do
  [ "$(sql 0 -c "SELECT coalesce(sum(size), 0) > 100000000 FROM pg_ls_tmpdir()")" = t ] && { seen=1; break; }
  sleep 0.05
done
check "max_result_memory: the local part writes its pairs into the temporary files" 1 "$seen"
cancel_and_wait "$bg"
check_has "max_result_memory: a cancel ends the local part's writing at once (${ms} ms)" \
  'canceling statement due to user request' "$(cat "${DIRS[0]}/cancel.out")"
check "... within a second" 1 "$([ "$ms" -lt 1000 ] && echo 1 || echo 0)"
out=$(sql 0 -c "SELECT 'temporary files:' || count(*) FROM pg_ls_tmpdir()" 2>&1)
check "... no temporary file left" "temporary files:0" "$out"

# The node's bound is what it holds, counted as the rows arrive: a LIMIT
# past the table (a way to say "all"), with an OFFSET, returns within 4 MB
# the same rows in the same order as without the limit and as one server
# (21 x 1099 rows, about 120 bytes each with their rows read back and the
# merge's copy; 21 x 1000002 x 16 bytes were it the LIMIT's).
ALL_ROWS="SELECT count(*) || ' rows ' || md5(string_agg(format('%s:%s:%s', qid, id, d), ' ')) FROM
  (SELECT q.id AS qid, n.id, n.d FROM (SELECT * FROM q WHERE id < 500) q CROSS JOIN LATERAL
   (SELECT t.id, t.v <-> q.v AS d FROM TBL t ORDER BY t.v <-> q.v, t.id LIMIT 1000000 OFFSET 2) n) r"
out=$(sql 0 -v "s=${ALL_ROWS//TBL/items_h}" -v "r=${ALL_ROWS//TBL/items_all}" 2>&1 <<'EOF'
SET client_min_messages = warning;
SET knn_gpu.max_result_memory = 4;
SELECT (:s) AS limited \gset
SELECT 'shards:' || json_array_length(knn_gpu_last_shard_stats()->'shards');
RESET knn_gpu.max_result_memory;
SELECT (:s) AS whole \gset
SELECT (:r) AS single \gset
SELECT 'rows:' || :'limited';
SELECT 'limited = whole:' || (:'limited' = :'whole') || ', whole = one server:' || (:'whole' = :'single');
EOF
)
check "max_result_memory: the KNN Join node, a LIMIT past the table: its rows within 4 MB, = without the limit, = one server" \
  "$(printf 'shards:2\nrows:23079 rows\nlimited = whole:true, whole = one server:true')" \
  "$(echo "$out" | sed 's/^\(rows:[0-9]* rows\) .*/\1/' | grep -E '^(ERROR|shards|rows|limited)')"

# The node reads the shards' rows as they arrive, never a shard's whole
# answer at once: a radius or WITH TIES answer past the limit (100 x 30000
# rows) ends with ERROR 54000 while the coordinator's peak memory (VmHWM)
# stays small, and the shards' work stops.
for name in radius "WITH TIES"; do
  form="WHERE t.v <-> q.v < 1000 ORDER BY t.v <-> q.v"
  [ "$name" = radius ] || form="ORDER BY t.v <-> q.v FETCH FIRST 100000 ROWS WITH TIES"
  out=$(sql 0 2>&1 <<EOF
\set ON_ERROR_STOP 0
SELECT count(*) FROM (SELECT id, v FROM big_here WHERE id <= 1) q
  CROSS JOIN LATERAL (SELECT t.id FROM big t $form) n;
SELECT peak_mb() AS before \gset
SET knn_gpu.max_result_memory = 1;
\set VERBOSITY sqlstate
SELECT count(*) FROM (SELECT id, v FROM big_here WHERE id <= 100) q
  CROSS JOIN LATERAL (SELECT t.id FROM big t $form) n;
\set VERBOSITY default
SELECT 'grew less than 32 MB:' || (peak_mb() - :before < 32);
EOF
)
  check "max_result_memory: the node's answer past the limit, $name: ERROR 54000, the shards' rows not held" \
    "$(printf 'ERROR:  54000\ngrew less than 32 MB:true')" "$(echo "$out" | grep -E '^(ERROR|grew)')"
  check "... the shards stopped" 0 "$(active_on_shards)"
done

# A cursor's DECLARE opens the node's connections; a FETCH in a savepoint
# made after it runs the join there. Its ERROR (the limit passed while the
# shards' rows arrive, their answers still coming) rolled back to the
# savepoint stops the shards' work and drops the run's tables there, and
# the transaction goes on with the same connections (it used to end with
# "another command is already in progress"); a FETCH in a savepoint
# released after it leaves the cursor going on.
out=$(sql 0 2>&1 <<'EOF'
\set ON_ERROR_STOP 0
SET client_min_messages = warning;
BEGIN;
DECLARE c CURSOR FOR SELECT q.id, n.id FROM (SELECT id, v FROM big_here WHERE id <= 100) q
  CROSS JOIN LATERAL (SELECT t.id FROM big t WHERE t.v <-> q.v < 1000 ORDER BY t.v <-> q.v) n;
SAVEPOINT a;
SET LOCAL knn_gpu.max_result_memory = 1;
\set VERBOSITY sqlstate
FETCH 1 FROM c;
\set VERBOSITY default
ROLLBACK TO SAVEPOINT a;
SELECT 'tables:' || count(*) FROM shard1_pg_class WHERE relname LIKE 'knn_shard_queries%';
SELECT 'tables:' || count(*) FROM shard2_pg_class WHERE relname LIKE 'knn_shard_queries%';
DECLARE d CURSOR FOR SELECT 'row:' || q.id || ':' || n.id FROM (SELECT id, v FROM big_here WHERE id <= 2) q
  CROSS JOIN LATERAL (SELECT t.id FROM big t ORDER BY t.v <-> q.v, t.id LIMIT 2) n;
SAVEPOINT b;
FETCH 2 FROM d;
RELEASE SAVEPOINT b;
FETCH 2 FROM d;
COMMIT;
EOF
)
check "the node in a cursor, its FETCH failing in a savepoint made after DECLARE: rolled back there, the transaction goes on" \
  "$(printf 'ERROR:  54000\ntables:0\ntables:0\n%s' "$(sql 0 -c "SELECT 'row:' || q.id || ':' || n.id FROM (SELECT id, v FROM big_here WHERE id <= 2) q
  CROSS JOIN LATERAL (SELECT t.id FROM big_here t ORDER BY t.v <-> q.v, t.id LIMIT 2) n")")" \
  "$(echo "$out" | grep -E '^(ERROR|tables|row)')"
check "... the shards stopped" 0 "$(active_on_shards)"

# The node's and knn_range_join's rows are read from a cursor there in
# batches (about 1 MB: libpq made a result of its own for each row in
# single-row mode, a quarter of a range join's time), the join planned for
# all its rows (DECLARE plans for cursor_tuple_fraction of them) and that
# setting as it was afterwards, in and after a transaction.
sql 1 -c "CREATE VIEW cursor_fraction AS SELECT current_setting('cursor_tuple_fraction') AS f"
sql 0 -c "CREATE FOREIGN TABLE shard1_cursor_fraction (f text) SERVER shard1 OPTIONS (table_name 'cursor_fraction')"
out=$(sql 0 2>&1 <<'EOF'
SET client_min_messages = debug1;
BEGIN;
SELECT 'node:' || count(*) FROM (SELECT id, v FROM big_here WHERE id <= 3) q
  CROSS JOIN LATERAL (SELECT t.id FROM big t WHERE t.v <-> q.v < 1000 ORDER BY t.v <-> q.v) n;
SELECT 'range:' || count(*) FROM knn_range_join('SELECT id, v FROM big_here WHERE id <= 3', 'SELECT id, v FROM big', 1000);
SELECT 'fraction:' || f FROM shard1_cursor_fraction;
COMMIT;
SELECT 'fraction:' || f FROM shard1_cursor_fraction;
EOF
)
check "the node and knn_range_join read the shards' rows from a cursor in batches; cursor_tuple_fraction as it was" \
  "$(printf 'declared:4\nnode:90000\nrange:90000\nfraction:0.1\nfraction:0.1')" \
  "$(echo "$out" | grep -c 'joins: DECLARE knn_gpu_join_[0-9]* NO SCROLL' | sed 's/^/declared:/'; echo "$out" | grep -E '^(ERROR|node|range|fraction)')"

# A run of the KNN Join node waits for each shard's answer 6 times: its
# table's statements (CREATE TEMPORARY TABLE, ALTER ... STORAGE, the
# statistics call that loads knn_gpu there, set_config) queued together in
# pipeline mode, each its own extended-protocol message; COPY's start; its
# end; the cursor's SET LOCAL, DECLARE and RESET queued together; the
# FETCH; and CLOSE, DROP TABLE and the statistics queued together (it was
# 11: each statement waited for).
out=$(sql 0 2>&1 <<'EOF'
SET client_min_messages = debug1;
SELECT 'node:' || count(*) FROM (SELECT id, v FROM big_here WHERE id <= 3) q
  CROSS JOIN LATERAL (SELECT t.id FROM big t ORDER BY t.v <-> q.v LIMIT 5) n;
EOF
)
check "the node's run: 6 round trips per shard (statements that need no answer of each other sent together)" \
  "$(printf 'KNN Join: foreign server "shard1": 6 round trips\nKNN Join: foreign server "shard2": 6 round trips\nnode:15')" \
  "$(echo "$out" | grep -oE '(KNN Join: foreign server "[a-z0-9]*": [0-9]+ round trips|^node:.*)' | sort)"

# A statement queued together with others fails as it did alone: a shard
# whose mapped user may not create temporary tables answers the first of
# the run's table statements with its ERROR (SQLSTATE and the statement as
# the remote SQL), the statements after it skipped; the connection is out
# of pipeline mode for postgres_fdw's cleanup, so the session (and a
# transaction rolled back to a savepoint) uses it again at once.
sql 2 -c "CREATE ROLE knn_no_temp LOGIN" -c "GRANT SELECT ON big_2 TO knn_no_temp" \
  -c "REVOKE TEMPORARY ON DATABASE postgres FROM PUBLIC"
NODE3="SELECT 'node:' || count(*) FROM (SELECT id, v FROM big_here WHERE id <= 3) q
  CROSS JOIN LATERAL (SELECT t.id FROM big t ORDER BY t.v <-> q.v LIMIT 5) n"
out=$(sql 0 -v "node=$NODE3" 2>&1 <<'EOF'
\set VERBOSITY verbose
\set ON_ERROR_STOP 0
ALTER USER MAPPING FOR postgres SERVER shard2 OPTIONS (SET user 'knn_no_temp');
:node;
SELECT 'read:' || count(*) FROM big;
BEGIN;
SAVEPOINT a;
:node;
ROLLBACK TO SAVEPOINT a;
SELECT 'read:' || count(*) FROM big;
COMMIT;
ALTER USER MAPPING FOR postgres SERVER shard2 OPTIONS (SET user 'postgres');
:node;
EOF
)
sql 2 -c "GRANT TEMPORARY ON DATABASE postgres TO PUBLIC" -c "DROP OWNED BY knn_no_temp" -c "DROP ROLE knn_no_temp"
check "a shard refusing the run's temporary table: its ERROR as the statement's own, the connection used again" \
  "$(printf 'ERROR:  42501: permission denied to create temporary tables in database "postgres"\nremote SQL command: CREATE TEMPORARY TABLE\nread:30000\nERROR:  42501: permission denied to create temporary tables in database "postgres"\nremote SQL command: CREATE TEMPORARY TABLE\nread:30000\nnode:15')" \
  "$(echo "$out" | sed -n 's/^\(CONTEXT:  \)\{0,1\}\(remote SQL command: CREATE TEMPORARY TABLE\).*/\2/p; /^\(ERROR\|WARNING\|read\|node\)/p')"
check "... nothing left running on the shards" 0 "$(active_on_shards)"

# A batch of queries whose pairs pass a chunk of the limit (300 queries in
# 150 batches of 2, 60000 pairs each, in chunks of 32768 within 1 MB) is
# split into a file per chunk and each read once (it was read again for
# every chunk of its batch: near quadratic in the pairs): the same rows in
# the same order as one server.
RANGE_SUM="SELECT count(*) || ' rows ' || sum(((hashint8(query_id) # hashint8(target_id * 7) # hashint8(rank)
  # hashtext(distance::text))::numeric) * o) FROM knn_range_join('SELECT id, v FROM big_here WHERE id <= 300',
  'SELECT id, v FROM TBL', 1000) WITH ORDINALITY AS r(query_id, target_id, rank, distance, o)"
out=$(sql 0 -v "s=${RANGE_SUM//TBL/big}" -v "o=${RANGE_SUM//TBL/big_here}" 2>&1 <<'EOF'
SET client_min_messages = warning;
SET knn_gpu.max_result_memory = 1;
SELECT (:s) AS sharded \gset
SELECT 'batches:' || (knn_gpu_last_shard_stats()->>'merge_batches');
RESET knn_gpu.max_result_memory;
SELECT (:o) AS single \gset
SELECT 'rows:' || :'sharded';
SELECT 'sharded = one server:' || (:'sharded' = :'single');
EOF
)
check "max_result_memory: knn_range_join of 9000000 pairs, batches of several chunks: = one server" \
  "$(printf 'batches:150\nrows:9000000 rows\nsharded = one server:true')" \
  "$(echo "$out" | sed 's/^\(rows:[0-9]* rows\) .*/\1/' | grep -E '^(ERROR|batches|rows|sharded)')"
check "... no temporary file left" "temporary files:0" "$(sql 0 -c "SELECT 'temporary files:' || count(*) FROM pg_ls_tmpdir()" 2>&1)"

# ---- a shard's hostile answers ----
# A shard is a server the user mapping reaches, not a trusted one: every
# answer that is not a join's (a value cut short, a NULL, a query id not
# sent, more than k pairs for a query, a query's pairs in two places) is
# an ERROR naming the server, never rows. A database of shard 2 whose
# knn_join_received_packed() returns what its table `answer` holds plays
# the shard; lists out of order and NaN distances are a shard's right and
# are merged as one server would.
sql 2 -c "CREATE DATABASE evil"
sql 2 evil <<EOF || fail "hostile: the hostile shard set up"
CREATE EXTENSION knn_gpu;
CREATE TABLE items_e ($COLUMNS);
CREATE TABLE answer (ord int, b bytea);
ALTER EXTENSION knn_gpu DROP FUNCTION knn_join_received_packed(bigint, text, integer, text, boolean, text);
DROP FUNCTION knn_join_received_packed(bigint, text, integer, text, boolean, text);
CREATE FUNCTION knn_join_received_packed(bigint, text, integer, text, boolean, text) RETURNS SETOF bytea
  LANGUAGE sql AS 'SELECT b FROM public.answer ORDER BY ord';
-- p(query, target, distance): one packed pair
CREATE FUNCTION p(bigint, bigint, float8) RETURNS bytea LANGUAGE sql AS 'SELECT int8send(\$1) || int8send(\$2) || float8send(\$3)';
EOF
sql 0 <<EOF || fail "hostile: the hostile shard's foreign table"
CREATE SERVER shard2_evil FOREIGN DATA WRAPPER postgres_fdw OPTIONS (host '${DIRS[2]}', port '${PORTS[2]}', dbname 'evil');
CREATE USER MAPPING FOR postgres SERVER shard2_evil OPTIONS (user 'postgres');
CREATE FOREIGN TABLE items_e ($COLUMNS) SERVER shard2_evil OPTIONS (table_name 'items_e');
EOF
# hostile NAME ANSWER EXPECTED [K [SETTINGS]]: the shard answers ANSWER (bytea values, in order) to
# knn_join of q's ids 23, 46, 69, 92; EXPECTED: the ERROR, or the rows "query:target:rank:distance"
hostile() {
  sql 2 evil -c "TRUNCATE answer" -c "INSERT INTO answer SELECT ordinality, b FROM unnest(ARRAY[$2]::bytea[]) WITH ORDINALITY b" \
    || { fail "$1 (answer)"; return; }
  local out
  out=$(sql 0 2>&1 <<EOF
SET client_min_messages = warning;
${5:-}
SELECT string_agg(format('%s:%s:%s:%s', query_id, target_id, rank, distance), ' ')
  FROM knn_join('SELECT id, v FROM q WHERE id < 100', 'SELECT id, v FROM items_e', ${4:-3});
EOF
)
  check "$1" "$3" "$(echo "$out" | grep -v '^CONTEXT' | head -1)"
}
WRONG="ERROR:  knn_join on foreign server \"shard2_evil\" returned"
hostile "hostile: a value cut short" "substr(p(23, 1, 1), 1, 20)" "$WRONG a NULL or a packed value of the wrong size"
hostile "hostile: a NULL" "NULL" "$WRONG a NULL or a packed value of the wrong size"
hostile "hostile: a query id not sent" "p(23, 1, 1), p(24, 1, 1)" "$WRONG a query id that was not sent"
hostile "hostile: more than k pairs for a query" "p(23, 1, 1) || p(23, 2, 2) || p(23, 3, 3) || p(23, 4, 4)" \
  "$WRONG more than k pairs for a query"
hostile "hostile: a query's pairs in two places" "p(23, 1, 1) || p(46, 2, 1), p(23, 1, 1)" \
  "$WRONG a query's pairs in two places"
hostile "hostile: a query's pairs in two places, merged in batches" "p(23, 1, 1) || p(46, 2, 1), p(23, 1, 1)" \
  "$WRONG a query's pairs in two places" 100000 "SET knn_gpu.max_result_memory = 1;"
hostile "hostile: a list out of order, NaN distances: merged as one server would" \
  "p(23, 5, 'NaN') || p(23, 6, 2) || p(23, 7, 1) || p(46, 9, 0), p(92, 8, 'NaN') || p(92, 3, 'NaN')" \
  "23:7:1:1 23:6:2:2 23:5:3:NaN 46:9:1:0 92:3:1:NaN 92:8:2:NaN"
hostile "hostile: ... and merged in batches" \
  "p(23, 5, 'NaN') || p(23, 6, 2) || p(23, 7, 1) || p(46, 9, 0), p(92, 8, 'NaN') || p(92, 3, 'NaN')" \
  "23:7:1:1 23:6:2:2 23:5:3:NaN 46:9:1:0 92:3:1:NaN 92:8:2:NaN" 100000 "SET knn_gpu.max_result_memory = 1;"
# A range join's rows (three binary 8-byte columns each, read from a
# cursor, each field checked as it is read): its knn_range_join_received()
# there returns the rows of table range_answer, its target ids as
# TARGET_TYPE. A value of another size, a NULL in any column: an ERROR.
sql 2 evil <<'EOF' || fail "hostile: the hostile range shard set up"
CREATE TABLE range_answer (ord int, query_id bigint, target_id bigint, distance float8);
ALTER EXTENSION knn_gpu DROP FUNCTION knn_range_join_received(bigint, text, double precision, text, boolean, integer, boolean, text);
EOF
# hostile_range NAME TARGET_TYPE ROWS EXPECTED: ROWS (ord, query, target, distance) are the
# shard's answer to knn_range_join of q's ids 23, 46, 69, 92 within 100; EXPECTED as hostile's
hostile_range() {
  sql 2 evil -c "DROP FUNCTION knn_range_join_received(bigint, text, double precision, text, boolean, integer, boolean, text)" \
    -c "CREATE FUNCTION knn_range_join_received(bigint, text, double precision, text, boolean, integer, boolean, text)
          RETURNS TABLE (query_id bigint, target_id $2, rank integer, distance double precision)
          LANGUAGE sql AS 'SELECT query_id, target_id::$2, 0, distance FROM public.range_answer ORDER BY ord'" \
    -c "TRUNCATE range_answer" -c "INSERT INTO range_answer VALUES $3" || { fail "$1 (answer)"; return; }
  local out
  out=$(sql 0 2>&1 <<EOF
SET client_min_messages = warning;
SELECT string_agg(format('%s:%s:%s:%s', query_id, target_id, rank, distance), ' ')
  FROM knn_range_join('SELECT id, v FROM q WHERE id < 100', 'SELECT id, v FROM items_e', 100);
EOF
)
  check "$1" "$4" "$(echo "$out" | grep -v '^CONTEXT' | head -1)"
}
hostile_range "hostile range: a target id of 4 bytes" integer "(1, 23, 1, 1), (2, 46, 2, 1)" \
  "$WRONG a NULL or a value of the wrong size"
hostile_range "hostile range: a NULL query id" bigint "(1, 23, 1, 1), (2, NULL, 2, 1)" \
  "$WRONG a NULL or a value of the wrong size"
hostile_range "hostile range: a NULL target id" bigint "(1, 23, 1, 1), (2, 46, NULL, 1)" \
  "$WRONG a NULL or a value of the wrong size"
hostile_range "hostile range: a NULL distance" bigint "(1, 23, 1, 1), (2, 46, 2, NULL)" \
  "$WRONG a NULL or a value of the wrong size"
hostile_range "hostile range: a query id not sent" bigint "(1, 23, 1, 1), (2, 24, 2, 1)" \
  "$WRONG a query id that was not sent"
hostile_range "hostile range: the right form: merged as one server would" bigint \
  "(1, 23, 7, 2), (2, 23, 5, 1), (3, 92, 3, 'NaN')" "23:5:1:1 23:7:2:2 92:3:1:NaN"
out=$(sql 0 -c "SELECT 'temporary files:' || count(*) FROM pg_ls_tmpdir()" -c "SELECT 'works:' || (count(*) > 0) FROM q" 2>&1)
check "hostile: nothing left, the session works" "$(printf 'temporary files:0\nworks:true')" "$out"

# The KNN Join node's shard: an event trigger there doubles every query
# row shipped into its temporary table, so each LATERAL subquery runs twice
# per query and the shard answers twice its LIMIT per query row: an ERROR,
# not each target twice in the result.
sql 2 evil <<'EOF' || fail "hostile: the node's hostile shard set up"
INSERT INTO items_e (id, v) SELECT i, format('[%s,0,0,0,0,0,0,0]', i)::vector FROM generate_series(1, 20) i;
CREATE FUNCTION public.dup_rows() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF pg_trigger_depth() = 1 THEN
    EXECUTE format('INSERT INTO %s SELECT ($1).*', TG_RELID::regclass) USING NEW;
  END IF;
  RETURN NULL;
END $$;
CREATE FUNCTION public.add_dup() RETURNS event_trigger LANGUAGE plpgsql AS $$
DECLARE r record;
BEGIN
  FOR r IN SELECT * FROM pg_event_trigger_ddl_commands() WHERE object_identity LIKE '%knn_shard_queries%' LOOP
    EXECUTE format('CREATE TRIGGER dup AFTER INSERT ON %s FOR EACH ROW EXECUTE FUNCTION public.dup_rows()', r.object_identity);
  END LOOP;
END $$;
CREATE EVENT TRIGGER add_dup ON ddl_command_end WHEN TAG IN ('CREATE TABLE') EXECUTE FUNCTION public.add_dup();
EOF
sql 0 <<'EOF' || fail "hostile: the node's hostile shard's partitioned table"
CREATE TABLE items_ep (id bigint, cat int, v vector(8), h halfvec(8), b bit(8)) PARTITION BY RANGE (id);
CREATE FOREIGN TABLE items_ep_1 PARTITION OF items_ep FOR VALUES FROM (MINVALUE) TO (MAXVALUE)
  SERVER shard2_evil OPTIONS (table_name 'items_e');
EOF
out=$(sql 0 2>&1 <<'EOF'
\set ON_ERROR_STOP 0
SET client_min_messages = warning;
SELECT count(*) || ' rows, ' || count(DISTINCT (q.id, n.id)) || ' distinct' FROM q
  CROSS JOIN LATERAL (SELECT t.id FROM items_ep t ORDER BY t.v <-> q.v, t.id LIMIT 2) n;
EOF
)
check "hostile: the node's shard answers more rows than its LIMIT" \
  'ERROR:  KNN Join on foreign server "shard2_evil" returned more rows for a query row than its LIMIT' \
  "$(echo "$out" | grep -v '^CONTEXT' | head -1)"

# ---- review fixes (issue 11) ----
# A queries text whose functions run SQL of their own (query_to_xml here, a
# domain's CHECK through a plpgsql function) reads through postgres_fdw's
# connections: the queries are read first, then shipped (nothing goes out
# during the read), with the same rows as one server.
XMLQ="$OVQ AND (id <> 30000 OR query_to_xml('SELECT count(*) FROM big_1', false, false, '') IS NOT NULL)"
out=$(overlapped "$XMLQ")
check "a queries text calling query_to_xml: the same rows as one server" \
  "$(printf 'diff:0\nrows:%s' "$(sql 0 -c "SELECT 3 * count(*) FROM bigq WHERE id < 40000")")" "$(echo "$out" | grep -E '^(diff|rows):')"
check "... read first (no rows shipped during the read)" 0 "$(echo "$out" | grep -c 'while they are read')"
sql 0 -c "CREATE FUNCTION big_1_seen(bigint) RETURNS boolean LANGUAGE plpgsql AS \$\$ BEGIN RETURN \$1 <> 30000 OR (SELECT count(*) FROM big_1) > 0; END \$\$" \
  -c "CREATE DOMAIN seen_id AS bigint CHECK (big_1_seen(VALUE))"
out=$(overlapped "$OVQ AND id::seen_id IS NOT NULL")
check "a queries text with a domain CHECK that reads a shard: the same rows as one server" "diff:0" "$(echo "$out" | grep -E '^diff:|ERROR')"
check "... read first" 0 "$(echo "$out" | grep -c 'while they are read')"
out=$(overlapped "SELECT id, v FROM (SELECT id, v, count(*) OVER () n FROM bigq WHERE id < 40000 AND (id % 4000 <> 0 OR pg_sleep(0.02) IS NOT NULL)) w")
check "a queries text with a window function: read first, the same rows" "$(printf '0\ndiff:0')" \
  "$(echo "$out" | grep -c 'while they are read'; echo "$out" | grep -E '^diff:')"

# Queries not in id order: the shards sort them in place, the same rows.
out=$(overlapped "$OVQ ORDER BY id DESC")
check "queries in descending id order: the same rows as one server" \
  "$(printf 'diff:0\nrows:%s' "$(sql 0 -c "SELECT 3 * count(*) FROM bigq WHERE id < 40000")")" "$(echo "$out" | grep -E '^(diff|rows):')"
out=$(overlapped "SELECT id, v FROM bigq WHERE id < 40000 ORDER BY md5(id::text)")
check "queries in random order: the same rows as one server" "diff:0" "$(echo "$out" | grep -E '^diff:')"

# A cursor over a sharded knn_join on the direct path: after the merge the
# query vectors are not held until the scan ends (as on one server).
direct_bytes() {
  sql 0 -c "SET client_min_messages = warning" -c "BEGIN" \
    -c "DECLARE c CURSOR FOR SELECT * FROM knn_join('SELECT id, v FROM bigq WHERE id < 20000', '$1', 3)" \
    -c "FETCH 1 FROM c" -c "SELECT sum(total_bytes) FROM pg_backend_memory_contexts WHERE name = 'knn_join direct result'" -c "COMMIT" | tail -1
}
sharded=$(direct_bytes "SELECT id, v FROM big")
single=$(direct_bytes "SELECT id, v FROM big_here")
check "a cursor over a sharded knn_join holds about what one server's does ($sharded vs $single bytes)" t \
  "$([ -n "$sharded" ] && [ -n "$single" ] && [ "$sharded" -lt $((2 * single)) ] && echo t || echo f)"

# ---- sharded joins inside sharded joins (issue 11) ----
# One connection per shard runs one statement at a time. A sharded join
# whose queries text, or whose part of the targets read here, runs another
# sharded join or reads a shard's table through postgres_fdw must run that
# part while the connections are free: the rows equal those with
# knn_gpu.shard_prefetch = off and those of one server, and the outer join
# still runs on its shards. (Before: "another command is already in
# progress" for the targets' parts.)
# nested NAME SELECT ONE_SERVER_SELECT [SHARDS]: the rows with prefetch on and off
# and on one server, compared both ways; S: the shards of the last sharded join
# recorded (the outermost)
nested() {
  local out
  out=$(sql 0 -v "s=$2" -v "o=$3" 2>&1 <<'EOF'
SET client_min_messages = warning;
CREATE TEMP TABLE a AS SELECT * FROM (:s) x;
CREATE TEMP TABLE n AS SELECT coalesce(json_array_length(knn_gpu_last_shard_stats()->'shards'), 0) AS shards;
SET knn_gpu.shard_prefetch = off;
CREATE TEMP TABLE b AS SELECT * FROM (:s) x;
RESET knn_gpu.shard_prefetch;
CREATE TEMP TABLE r AS SELECT * FROM (:o) x;
SELECT 'on = off: ' || ((SELECT count(*) FROM (SELECT * FROM a EXCEPT ALL SELECT * FROM b) x)
     + (SELECT count(*) FROM (SELECT * FROM b EXCEPT ALL SELECT * FROM a) y))
     || ' differences, on = one server: ' || ((SELECT count(*) FROM (SELECT * FROM a EXCEPT ALL SELECT * FROM r) x)
     + (SELECT count(*) FROM (SELECT * FROM r EXCEPT ALL SELECT * FROM a) y))
     || ' differences, rows: ' || ((SELECT count(*) FROM a) > 0) || ', ' || (SELECT shards FROM n) || ' shards';
EOF
)
  check "$1" "on = off: 0 differences, on = one server: 0 differences, rows: true, ${4:-2} shards" "$out"
}
# inner_rows TARGETS: the rows of the 3 nearest targets of the queries, as a queries text
inner_rows() {
  echo "SELECT a.id, a.v FROM items_all a WHERE a.id IN (SELECT target_id FROM knn_join('SELECT id, v FROM q', '$1', 3))"
}
# sqlq TEXT: TEXT with its quotes doubled, for a literal
sqlq() { printf '%s' "$1" | sed "s/'/''/g"; }
INNER_H=$(inner_rows "SELECT id, v FROM items_h")
INNER_ALL=$(inner_rows "SELECT id, v FROM items_all")
nested "queries text running a sharded knn_join on the same servers" \
  "SELECT * FROM knn_join('$(sqlq "$INNER_H")', 'SELECT id, v FROM items_h', 5, 'l2', true)" \
  "SELECT * FROM knn_join('$(sqlq "$INNER_ALL")', 'SELECT id, v FROM items_all', 5, 'l2', true)"
nested "... knn_range_join, queries of a sharded join over items_r" \
  "SELECT * FROM knn_range_join('$(sqlq "$(inner_rows "SELECT id, v FROM items_r")")', 'SELECT id, v FROM items_r', 1.5, 'cosine')" \
  "SELECT * FROM knn_range_join('$(sqlq "$INNER_ALL")', 'SELECT id, v FROM items_all', 1.5, 'cosine')"
# two levels: the queries of the queries are a sharded join's too
INNER2_H="SELECT a.id, a.v FROM items_all a WHERE a.id IN (SELECT target_id FROM knn_join('$(sqlq "$INNER_H")', 'SELECT id, v FROM items_h', 2))"
INNER2_ALL="SELECT a.id, a.v FROM items_all a WHERE a.id IN (SELECT target_id FROM knn_join('$(sqlq "$INNER_ALL")', 'SELECT id, v FROM items_all', 2))"
nested "... two levels of sharded joins in the queries text" \
  "SELECT * FROM knn_join('$(sqlq "$INNER2_H")', 'SELECT id, v FROM items_h', 4, 'l1')" \
  "SELECT * FROM knn_join('$(sqlq "$INNER2_ALL")', 'SELECT id, v FROM items_all', 4, 'l1')"

# The targets: a shard's table beside a part read here (UNION ALL) that runs a
# sharded knn_join, or reads a table of the same shard through postgres_fdw
# (its LIMIT pushed there, so not a partition that joins there).
H0_HERE="SELECT id, v FROM items_all WHERE satisfies_hash_partition('items_h'::regclass, 3, 0, id)"
LOCAL_H="SELECT id + 100000, v FROM ($INNER_H) n"
LOCAL_ALL="SELECT id + 100000, v FROM ($INNER_ALL) n"
nested "targets: a shard's table and a part read here that runs a sharded knn_join" \
  "SELECT * FROM knn_join('SELECT id, v FROM q', '$(sqlq "SELECT id, v FROM items_h_0 UNION ALL $LOCAL_H")', 5)" \
  "SELECT * FROM knn_join('SELECT id, v FROM q', '$(sqlq "$H0_HERE UNION ALL $LOCAL_ALL")', 5)" 1
nested "targets: a shard's table and a LIMIT on another table of that shard" \
  "SELECT * FROM knn_join('SELECT id, v FROM q', 'SELECT id, v FROM items_h_0 UNION ALL SELECT id + 100000, v FROM (SELECT * FROM items_r_a ORDER BY id LIMIT 200) x', 6, 'cosine', true)" \
  "SELECT * FROM knn_join('SELECT id, v FROM q', '$(sqlq "$H0_HERE UNION ALL SELECT id + 100000, v FROM (SELECT * FROM items_all WHERE id < 300 ORDER BY id LIMIT 200) x")', 6, 'cosine', true)" 1
# (a semi-join: the outer join is not sharded; the shard count is the inner join's)
nested "targets: a semi-join whose filter runs a sharded knn_join" \
  "SELECT * FROM knn_join('SELECT id, v FROM q', '$(sqlq "SELECT id, v FROM items_h WHERE id IN (SELECT target_id FROM knn_join('SELECT id, v FROM q', 'SELECT id, v FROM items_h', 3))")', 5)" \
  "SELECT * FROM knn_join('SELECT id, v FROM q', '$(sqlq "$INNER_ALL")', 5)"
nested "queries and targets both running sharded joins" \
  "SELECT * FROM knn_join('$(sqlq "$INNER_H")', '$(sqlq "SELECT id, v FROM items_h_0 UNION ALL $LOCAL_H")', 3)" \
  "SELECT * FROM knn_join('$(sqlq "$INNER_ALL")', '$(sqlq "$H0_HERE UNION ALL $LOCAL_ALL")', 3)" 1

# The KNN Join node (LATERAL top-k over items_h) whose outer rows come from a sharded knn_join
KJ_OUTER="SELECT j.query_id, a.id AS outer_id, x.id, x.d FROM knn_join('SELECT id, v FROM q', 'SELECT id, v FROM TARGETS', 2) j JOIN items_all a ON a.id = j.target_id, LATERAL (SELECT t.id, t.v <-> a.v AS d FROM TARGETS t ORDER BY t.v <-> a.v, t.id LIMIT 3) x"
nested "KNN Join over a sharded table, its outer side a sharded knn_join" \
  "${KJ_OUTER//TARGETS/items_h}" "${KJ_OUTER//TARGETS/items_all}"
check "... both nodes run on the shards" \
  "$(printf 'Custom Scan (KNN Join)\nShard: shard1\nShard: shard2\nCustom Scan (KNN Join Function)\nShard: shard1\nShard: shard2')" \
  "$(sql 0 -c "SET client_min_messages = warning" -c "EXPLAIN (COSTS OFF) ${KJ_OUTER//TARGETS/items_h}" 2>&1 |
     grep -oE 'Custom Scan \(KNN Join( Function)?\)|Shard: shard[12]')"
# local_after TARGETS: whether the part read here was read after the shards' results
# (knn_gpu_last_shard_stats: only where it may use their connections)
local_after() {
  sql 0 -c "SET client_min_messages = warning" -c "SELECT count(*) > 0 FROM knn_join('SELECT id, v FROM q', '$(sqlq "$1")', 5)" \
    -c "SELECT knn_gpu_last_shard_stats()->'local'->>'after_shards'" 2>&1
}
check "the part read here runs while the shards work: local partitions" "$(printf 't\nfalse')" \
  "$(local_after "SELECT id, v FROM items_h")"
check "... local partitions in id order (Merge Append, sorts)" "$(printf 't\nfalse')" \
  "$(local_after "SELECT id, v FROM items_h ORDER BY id")"
check "... a file_fdw partition" "$(printf 't\nfalse')" "$(local_after "SELECT id, v FROM items_f")"
check "... the KNN Join node's local partition" "$(printf 't\nfalse')" \
  "$(sql 0 -c "SET client_min_messages = warning" -c "SELECT count(*) > 0 FROM q a, LATERAL (SELECT t.id FROM items_h t ORDER BY t.v <-> a.v LIMIT 3) x" \
     -c "SELECT knn_gpu_last_shard_stats()->'local'->>'after_shards'" 2>&1)"
check "... after the shards: a part running a sharded knn_join" "$(printf 't\ntrue')" \
  "$(local_after "SELECT id, v FROM items_h_0 UNION ALL $LOCAL_H")"
check "... after the shards: a LIMIT pushed to a shard's server" "$(printf 't\ntrue')" \
  "$(local_after "SELECT id, v FROM items_h_0 UNION ALL SELECT id + 100000, v FROM (SELECT * FROM items_r_a ORDER BY id LIMIT 200) x")"
check "... after the shards: a part calling a PL function (it may run SQL)" "$(printf 't\ntrue')" \
  "$(local_after "SELECT id, v FROM items_h_0 UNION ALL SELECT id, v FROM items_all WHERE id > 1000 AND odd_cat(cat)")"
out=$(sql 0 -c "SET client_min_messages = warning" -c "SELECT count(*) > 0 FROM knn_join('SELECT id, v FROM q', '$(sqlq "SELECT id, v FROM items_h_0 UNION ALL $LOCAL_H")', 5)" \
  -c "SELECT 'left:' || count(*) FROM shard1_contexts WHERE name IN ('knn_gpu received queries', 'knn_gpu prefetched targets')" \
  -c "SELECT 'left:' || count(*) FROM shard2_contexts WHERE name IN ('knn_gpu received queries', 'knn_gpu prefetched targets')" 2>&1)
check "... nothing left held on the shards after nested joins" "$(printf 't\nleft:0\nleft:0')" "$out"

# async_capable shards: postgres_fdw's asynchronous Append keeps a FETCH pending on a shard's
# connection while a nested sharded knn_join (one per outer row) needs that connection;
# postgres_fdw finishes the pending request first, so the answer is the one without async.
ASYNC_Q="SELECT count(*) || ':' || sum(x.n) FROM items_r r CROSS JOIN LATERAL (SELECT count(*) AS n FROM knn_join('SELECT id, v FROM q ORDER BY id LIMIT ' || (1 + r.id % 2), 'SELECT id, v FROM items_h', 5)) x WHERE r.id % 50 = 0"
plain=$(sql 0 -c "SET client_min_messages = warning" -c "$ASYNC_Q" 2>&1)
# (fetch_size 1: each shard's rows come one FETCH at a time, so one is pending between them)
async=$(sql 0 -c "ALTER SERVER shard1 OPTIONS (ADD async_capable 'true', ADD fetch_size '1')" \
  -c "ALTER SERVER shard2 OPTIONS (ADD async_capable 'true', ADD fetch_size '1')" \
  -c "SET client_min_messages = warning" -c "$ASYNC_Q" 2>&1)
sql 0 -c "ALTER SERVER shard1 OPTIONS (DROP async_capable, DROP fetch_size)" \
  -c "ALTER SERVER shard2 OPTIONS (DROP async_capable, DROP fetch_size)" >/dev/null 2>&1
check "async_capable shards: a nested sharded join while a FETCH is pending ($plain)" "$plain" "$async"

# ---- a sharded self-join's queries from the shards (knn_shard_read_queries) ----
# Where the queries text is the targets text (stable) and every partition
# joins on a shard, the shards read the rows once (knn_shard_prefetch_self_join)
# and send them back in binary as the queries (knn_shard_held_target_blocks),
# instead of the coordinator reading them through postgres_fdw as text.
# items_s: two foreign partitions only, with duplicate vectors and NULL vectors.
sql 1 -c "CREATE TABLE items_s_0 ($COLUMNS)"
sql 2 -c "CREATE TABLE items_s_1 ($COLUMNS)"
sql 0 >/dev/null <<EOF || fail "items_s set-up"
CREATE TABLE items_s ($COLUMNS) PARTITION BY HASH (id);
CREATE FOREIGN TABLE items_s_0 PARTITION OF items_s FOR VALUES WITH (MODULUS 2, REMAINDER 0)
  SERVER shard1 OPTIONS (table_name 'items_s_0');
CREATE FOREIGN TABLE items_s_1 PARTITION OF items_s FOR VALUES WITH (MODULUS 2, REMAINDER 1)
  SERVER shard2 OPTIONS (table_name 'items_s_1');
CREATE TABLE items_s_all AS SELECT * FROM items_all;
-- duplicate vectors (of rows on either shard) and more NULL vectors
INSERT INTO items_s_all SELECT id + 3000, cat, v, h, b FROM items_all WHERE id <= 40;
INSERT INTO items_s_all SELECT 4000 + i, i % 5, NULL, NULL, NULL FROM generate_series(1, 6) i;
INSERT INTO items_s SELECT * FROM items_s_all;
ANALYZE items_s_all;
EOF
sql 1 -c "ANALYZE items_s_0" && sql 2 -c "ANALYZE items_s_1"
check "items_s: rows on both shards, none here, NULL vectors and duplicates among them" "t" \
  "$(sql 0 -c "SELECT (SELECT count(*) FROM items_s_0) > 0 AND (SELECT count(*) FROM items_s_1) > 0 AND (SELECT count(*) FROM items_s WHERE v IS NULL) = 7 AND (SELECT count(*) FROM items_s s JOIN items_s t ON s.v = t.v AND s.id < t.id) >= 40")"
# self_from_shards NAME CALL_OVER_ITEMS_S EXPECTED_FROM_SHARDS [SHARDS]: the call, and the
# same over items_s_all (every items_s replaced) on one server, as same_as_one_server
self_from_shards() {
  same_as_one_server "$1" "${4:-2}" "$2" "${2//items_s/items_s_all}" "$3"
}
SV="SELECT id, v FROM items_s"
for metric in l2 cosine ip l1; do
  self_from_shards "self-join from the shards' rows: $metric" "knn_join('$SV', '$SV', 5, '$metric')" true
done
self_from_shards "... exclude_self" "knn_join('$SV', '$SV', 7, 'l2', true)" true
self_from_shards "... halfvec l2" "knn_join('SELECT id, h FROM items_s', 'SELECT id, h FROM items_s', 5, 'l2')" true
self_from_shards "... halfvec cosine, exclude_self" "knn_join('SELECT id, h FROM items_s', 'SELECT id, h FROM items_s', 4, 'cosine', true)" true
self_from_shards "... bit hamming, exclude_self" "knn_join('SELECT id, b FROM items_s', 'SELECT id, b FROM items_s', 6, 'hamming', true)" true
self_from_shards "... bit jaccard" "knn_join('SELECT id, b FROM items_s', 'SELECT id, b FROM items_s', 6, 'jaccard')" true
FS="SELECT id, v FROM items_s WHERE cat <> 2 AND id > 40"
self_from_shards "... a filter in the text (pushed to the shards)" "knn_join('$FS', '$FS', 5, 'cosine')" true
K3="SELECT id, v FROM items_s WHERE cat = 3"
self_from_shards "... k above a shard's rows" "knn_join('$K3', '$K3', 1000, 'l1', true)" true
self_from_shards "... knn_range_join" "knn_range_join('$SV', '$SV', 2.5, 'l2', true, 4)" true
self_from_shards "... bound parameters, the same for both texts" \
  "knn_join('SELECT id, v FROM items_s WHERE cat <> \$1::int', 'SELECT id, v FROM items_s WHERE cat <> \$1::int', 5, ARRAY['2'])" true
self_from_shards "... one partition after pruning" \
  "knn_join('SELECT id, v FROM items_s WHERE id = 5', 'SELECT id, v FROM items_s WHERE id = 5', 3)" true 1
# otherwise the queries are read here, as before (and the rows are the same)
self_from_shards "texts that differ: the queries read here" "knn_join('$SV WHERE id > 0', '$SV', 5)" false
self_from_shards "partitions read here with a NOTICE: nothing on the shards" \
  "knn_join('SELECT id, v FROM items_s WHERE odd_cat(cat)', 'SELECT id, v FROM items_s WHERE odd_cat(cat)', 5)" none 0
check "a local partition (items_h): the queries read here" "$(printf 't\nfalse')" \
  "$(sql 0 -c "SET client_min_messages = warning" -c "SELECT count(*) > 0 FROM knn_join('SELECT id, v FROM items_h', 'SELECT id, v FROM items_h', 4, 'l2', true)" \
     -c "SELECT knn_gpu_last_shard_stats()->>'queries_from_shards'" 2>&1)"
check "a partition read here with a NOTICE, beside a shard's: the queries read here" "$(printf 't\nfalse')" \
  "$(sql 0 -c "SET client_min_messages = warning" -c "SELECT count(*) > 0 FROM knn_join('SELECT id, v FROM items_f', 'SELECT id, v FROM items_f', 4)" \
     -c "SELECT knn_gpu_last_shard_stats()->>'queries_from_shards'" 2>&1)"
check "items_s with knn_gpu.shard_prefetch = off: the queries read here" "$(printf 't\nfalse')" \
  "$(sql 0 -c "SET client_min_messages = warning" -c "SET knn_gpu.shard_prefetch = off" -c "SELECT count(*) > 0 FROM knn_join('$SV', '$SV', 4)" \
     -c "SELECT knn_gpu_last_shard_stats()->>'queries_from_shards'" 2>&1)"
away_on_shard2 knn_shard_held_target_blocks "bigint"
self_from_shards "a shard without knn_shard_held_target_blocks: the queries read here" "knn_join('$SV', '$SV', 5, 'l2', true)" false
back_on_shard2 knn_shard_held_target_blocks "bigint"
# a shard sending other blocks than the rows it read: an ERROR naming it, not another answer
# forged_blocks_on_shard2 SQL_OVER_REAL_BLOCKS [CALL]: shard 2's knn_shard_held_target_blocks sends
# those instead, to the self-join CALL (over items_s's v by default); without
# knn_shard_read_held_blocks there, so that the rows are read ahead, then fetched
STREAM_ARGS="bigint, regtype, text, text, text, text, integer, integer"
forged_blocks_on_shard2() {
  away_on_shard2 knn_shard_read_held_blocks "$STREAM_ARGS"
  sql 2 -q -c "ALTER FUNCTION knn_shard_held_target_blocks(bigint) RENAME TO knn_shard_held_target_blocks_real" \
    -c "CREATE FUNCTION knn_shard_held_target_blocks(s bigint) RETURNS SETOF bytea LANGUAGE sql SET search_path FROM CURRENT AS \$\$ $1 \$\$"
  sql 0 -c "SELECT count(*) FROM ${2:-knn_join('$SV', '$SV', 3)}" 2>&1
  sql 2 -q -c "DROP FUNCTION knn_shard_held_target_blocks(bigint)" \
    -c "ALTER FUNCTION knn_shard_held_target_blocks_real(bigint) RENAME TO knn_shard_held_target_blocks"
  back_on_shard2 knn_shard_read_held_blocks "$STREAM_ARGS"
}
out=$(forged_blocks_on_shard2 "SELECT b FROM knn_shard_held_target_blocks_real(s) b LIMIT 0")
check_has "a shard sending none of its rows: an ERROR" 'sent 0 held rows, not the' "$out"
check_has "... naming it" 'foreign server "shard2"' "$out"
check_has "a shard sending a block cut short: an ERROR" 'sent a malformed block of held rows: a length that is not its rows' \
  "$(forged_blocks_on_shard2 "SELECT substr(b, 1, length(b) - 1) FROM knn_shard_held_target_blocks_real(s) b")"
check_has "a shard sending another element type: an ERROR" 'sent a malformed block of held rows: another element type' \
  "$(forged_blocks_on_shard2 "SELECT overlay(b placing '\\x00000009'::bytea from 1) FROM knn_shard_held_target_blocks_real(s) b")"
# (relayed, the blocks' values are checked by the shards they go to; decoded here, here)
INF_BLOCKS="SELECT overlay(b placing '\\x7f800000'::bytea from length(b) - 3) FROM knn_shard_held_target_blocks_real(s) b"
check_has "a shard sending a non-finite value, not relayed: an ERROR" 'sent a malformed block of held rows: a value the type does not allow' \
  "$(PGOPTIONS="-c knn_gpu.shard_relay=off" forged_blocks_on_shard2 "$INF_BLOCKS")"
out=$(forged_blocks_on_shard2 "$INF_BLOCKS")
check_has "a shard sending a non-finite value, relayed: the ERROR of the shard it went to" 'foreign server "shard1"' "$out"
check_has "... naming the shard that sent it" 'rows sent by foreign server "shard2", relayed to it unchanged' "$out"
same_as_one_server "... and with the real function back: the same rows as one server" 2 \
  "knn_join('$SV', '$SV', 3)" "knn_join('SELECT id, v FROM items_s_all', 'SELECT id, v FROM items_s_all', 3)" true
check "... nothing held on the shards after the joins" "$(printf 'left:0\nleft:0')" \
  "$(sql 0 -c "SELECT 'left:' || count(*) FROM shard1_contexts WHERE name IN ('knn_gpu received queries', 'knn_gpu prefetched targets')" \
     -c "SELECT 'left:' || count(*) FROM shard2_contexts WHERE name IN ('knn_gpu received queries', 'knn_gpu prefetched targets')" 2>&1)"
check "EXPLAIN ANALYZE says the queries came from the shards" "Queries From Shards: true" \
  "$(sql 0 -c "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) SELECT * FROM knn_join('$SV', '$SV', 3)" 2>&1 | grep -o 'Queries From Shards: .*')"
check "... and nothing where they did not" "" \
  "$(sql 0 -c "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) SELECT * FROM knn_join('$SV WHERE id > 0', '$SV', 3)" 2>&1 | grep -o 'Queries From Shards: .*')"
# each shard is shipped only the other shards' rows and joins its own with them
# (knn_join_received_held_packed); a shard without that function: every row to every shard
shipped_to_shards() {
  sql 0 -c "SET client_min_messages = warning" -c "SELECT count(*) > 0 FROM knn_join('$SV', '$SV', 3)" \
    -c "SELECT s->>'server', s->>'remote_sql' LIKE '%knn_join_received_held_packed(%',
          (s->>'queries_shipped')::bigint = (knn_gpu_last_shard_stats()->>'queries')::bigint - (s->>'targets_read')::bigint,
          (s->>'queries_shipped')::bigint = (knn_gpu_last_shard_stats()->>'queries')::bigint
        FROM json_array_elements(knn_gpu_last_shard_stats()->'shards') s ORDER BY 1" 2>&1
}
check "a self-join from the shards: each shard is shipped only the other shards' rows, and joins its own with them" \
  "$(printf 't\nshard1|t|t|f\nshard2|t|t|f')" "$(shipped_to_shards)"
# the same with several blocks of rows per shard (big: 96 dimensions, 12000 rows)
BS="SELECT id, v FROM big WHERE id <= 12000"
same_as_one_server "a self-join from the shards over several blocks a shard: the same rows as one server's" 2 \
  "knn_join('$BS', '$BS', 4, 'l2', true)" "knn_join('${BS//big/big_here}', '${BS//big/big_here}', 4, 'l2', true)" true
check "... each shard shipped only the other shard's rows" "$(printf 'shard1|t\nshard2|t')" \
  "$(sql 0 -c "SET client_min_messages = warning" -c "SELECT count(*) > 0 FROM knn_join('$BS', '$BS', 4, 'l2', true)" -c "SELECT s->>'server',
       (s->>'queries_shipped')::bigint = 12000 - (s->>'targets_read')::bigint
     FROM json_array_elements(knn_gpu_last_shard_stats()->'shards') s ORDER BY 1" 2>&1 | tail -2)"
HELD_JOIN_ARGS="bigint, text, integer, text, boolean, text"
away_on_shard2 knn_join_received_held_packed "$HELD_JOIN_ARGS"
check "... a shard without knn_join_received_held_packed: every shard is shipped every row" \
  "$(printf 't\nshard1|f|f|t\nshard2|f|f|t')" "$(shipped_to_shards)"
self_from_shards "... and the rows are the same as one server's" "knn_join('$SV', '$SV', 5, 'l2', true)" true
back_on_shard2 knn_join_received_held_packed "$HELD_JOIN_ARGS"
# the shards' rows relayed to the other shards as they came (knn_shard_receive_held_rows there),
# or, with knn_gpu.shard_relay off or a shard without that function, decoded here and encoded again
relayed() {
  sql 0 -c "SET client_min_messages = warning" -c "SELECT count(*) > 0 FROM $1" \
    -c "SELECT knn_gpu_last_shard_stats()->>'queries_from_shards', knn_gpu_last_shard_stats()->>'queries_relayed'" 2>&1
}
check "a self-join from the shards: their rows relayed" "$(printf 't\ntrue|true')" "$(relayed "knn_join('$SV', '$SV', 3)")"
check "... over several blocks a shard" "$(printf 't\ntrue|true')" "$(relayed "knn_join('$BS', '$BS', 4, 'l2', true)")"
check "... EXPLAIN ANALYZE says so" "Queries Relayed: true" \
  "$(sql 0 -c "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) SELECT * FROM knn_join('$SV', '$SV', 3)" 2>&1 | grep -o 'Queries Relayed: .*')"
check "... with knn_gpu.shard_relay off: not relayed" "$(printf 't\ntrue|false')" \
  "$(PGOPTIONS="-c knn_gpu.shard_relay=off" relayed "knn_join('$SV', '$SV', 3)")"
export PGOPTIONS="-c knn_gpu.shard_relay=off"
self_from_shards "... and the rows are the same as one server's, l2" "knn_join('$SV', '$SV', 5, 'l2', true)" true
self_from_shards "... halfvec cosine" "knn_join('SELECT id, h FROM items_s', 'SELECT id, h FROM items_s', 4, 'cosine', true)" true
self_from_shards "... bit hamming" "knn_join('SELECT id, b FROM items_s', 'SELECT id, b FROM items_s', 6, 'hamming', true)" true
same_as_one_server "... over several blocks a shard" 2 \
  "knn_join('$BS', '$BS', 4, 'l2', true)" "knn_join('${BS//big/big_here}', '${BS//big/big_here}', 4, 'l2', true)" true
unset PGOPTIONS
RELAY_ARGS="bigint, regtype, bytea"
away_on_shard2 knn_shard_receive_held_rows "$RELAY_ARGS"
check "a shard without knn_shard_receive_held_rows: the rows from the shards, not relayed" "$(printf 't\ntrue|false')" \
  "$(relayed "knn_join('$SV', '$SV', 3)")"
self_from_shards "... and the rows are the same as one server's" "knn_join('$SV', '$SV', 5, 'l2', true)" true
back_on_shard2 knn_shard_receive_held_rows "$RELAY_ARGS"
# a shard that says it read more rows than it did: an ERROR naming it, nothing written past the rows
# claimed_on_shard2 CLAIM: shard 2's read ahead answers CLAIM rows (an expression over the real count n)
claimed_on_shard2() {
  away_on_shard2 knn_shard_read_held_blocks "$STREAM_ARGS"
  sql 2 -q -c "ALTER FUNCTION knn_shard_prefetch_self_join(bigint, regtype, text, text) RENAME TO knn_shard_prefetch_self_join_real" \
    -c "CREATE FUNCTION knn_shard_prefetch_self_join(set bigint, query_type regtype, targets text, metric text,
          OUT targets_read bigint, OUT seconds double precision, OUT id_type text, OUT vector_type text, OUT dim integer)
        LANGUAGE sql SET search_path FROM CURRENT AS \$\$ SELECT $1, r.seconds, r.id_type, r.vector_type, r.dim
          FROM knn_shard_prefetch_self_join_real(set, query_type, targets, metric) r(n, seconds, id_type, vector_type, dim) \$\$"
  sql 0 -c "SELECT count(*) FROM knn_join('$SV', '$SV', 3)" 2>&1
  sql 2 -q -c "DROP FUNCTION knn_shard_prefetch_self_join(bigint, regtype, text, text)" \
    -c "ALTER FUNCTION knn_shard_prefetch_self_join_real(bigint, regtype, text, text) RENAME TO knn_shard_prefetch_self_join"
  back_on_shard2 knn_shard_read_held_blocks "$STREAM_ARGS"
}
check_has "a shard claiming 2^63 - 1 rows read: an ERROR naming it" \
  'foreign server "shard2" says it read 9223372036854775807 rows, more than this server could hold' \
  "$(claimed_on_shard2 9223372036854775807)"
check_has "a shard claiming more rows than it sends: an ERROR naming it" 'foreign server "shard2" sent' \
  "$(claimed_on_shard2 "r.n + 1000000")"
check "... the coordinator goes on" "$(printf 'alive\nleft:0\nleft:0')" \
  "$(sql 0 -c "SELECT 'alive'" \
     -c "SELECT 'left:' || count(*) FROM shard1_contexts WHERE name IN ('knn_gpu received queries', 'knn_gpu prefetched targets')" \
     -c "SELECT 'left:' || count(*) FROM shard2_contexts WHERE name IN ('knn_gpu received queries', 'knn_gpu prefetched targets')" 2>&1)"
# the shards send their rows as they read them (knn_shard_read_held_blocks), where every shard
# can and the rows are relayed; else they read ahead, then the rows are fetched (as above)
streamed() {
  sql 0 -c "SET client_min_messages = warning" -c "SELECT count(*) > 0 FROM $1" \
    -c "SELECT knn_gpu_last_shard_stats()->>'queries_streamed', knn_gpu_last_shard_stats()->>'queries_relayed',
          (SELECT bool_and((s->>'targets_read')::bigint > 0 AND (s->>'seconds_read')::float8 >= 0)
           FROM json_array_elements(knn_gpu_last_shard_stats()->'shards') s)" 2>&1
}
check "a self-join from the shards: their rows sent as they read them, relayed" "$(printf 't\ntrue|true|t')" \
  "$(streamed "knn_join('$SV', '$SV', 3)")"
check "... with knn_gpu.shard_relay off: read ahead, then fetched" "$(printf 't\nfalse|false|t')" \
  "$(PGOPTIONS="-c knn_gpu.shard_relay=off" streamed "knn_join('$SV', '$SV', 3)")"
away_on_shard2 knn_shard_read_held_blocks "$STREAM_ARGS"
check "a shard without knn_shard_read_held_blocks: read ahead, then fetched, relayed" "$(printf 't\nfalse|true|t')" \
  "$(streamed "knn_join('$SV', '$SV', 3)")"
self_from_shards "... and the rows are the same as one server's" "knn_join('$SV', '$SV', 5, 'cosine', true)" true
back_on_shard2 knn_shard_read_held_blocks "$STREAM_ARGS"
# forged_stream_on_shard2 SQL_OVER_REAL_BLOCKS [CALL]: shard 2's knn_shard_read_held_blocks sends those
# blocks instead (b, over the real ones), to the self-join CALL (over items_s's v by default)
forged_stream_on_shard2() {
  sql 2 -q -c "ALTER FUNCTION knn_shard_read_held_blocks($STREAM_ARGS) RENAME TO knn_shard_read_held_blocks_real" \
    -c "CREATE FUNCTION knn_shard_read_held_blocks(s bigint, t regtype, x text, m text, i text, v text, lo integer, hi integer)
          RETURNS SETOF bytea LANGUAGE sql SET search_path FROM CURRENT AS \$\$ $1 \$\$"
  sql 0 -c "SELECT count(*) FROM ${2:-knn_join('$SV', '$SV', 3)}" 2>&1
  sql 2 -q -c "DROP FUNCTION knn_shard_read_held_blocks($STREAM_ARGS)" \
    -c "ALTER FUNCTION knn_shard_read_held_blocks_real($STREAM_ARGS) RENAME TO knn_shard_read_held_blocks"
}
REAL_STREAM="knn_shard_read_held_blocks_real(s, t, x, m, i, v, lo, hi) b"
REFUSAL="'\\xffffffff0000000000000000'::bytea"
check "a shard's stream as it is (through a wrapper): the same rows as one server's" \
  "$(sql 0 -c "SELECT count(*) FROM knn_join('SELECT id, v FROM items_s_all', 'SELECT id, v FROM items_s_all', 3)" 2>&1)" \
  "$(forged_stream_on_shard2 "SELECT b FROM $REAL_STREAM")"
check_has "a shard streaming a block cut short: an ERROR naming it" 'foreign server "shard2" sent a malformed block of held rows: a length that is not its rows' \
  "$(forged_stream_on_shard2 "SELECT substr(b, 1, length(b) - 1) FROM $REAL_STREAM")"
check_has "a shard streaming another element type: an ERROR naming it" 'foreign server "shard2" sent a malformed block of held rows: another element type' \
  "$(forged_stream_on_shard2 "SELECT overlay(b placing '\\x00000009'::bytea from 1) FROM $REAL_STREAM")"
out=$(forged_stream_on_shard2 "SELECT overlay(b placing '\\x7f800000'::bytea from length(b) - 3) FROM $REAL_STREAM")
check_has "a shard streaming a non-finite value: the ERROR of the shard it is relayed to" 'foreign server "shard1"' "$out"
check_has "... naming the shard that sent it" 'rows sent by foreign server "shard2", relayed to it unchanged' "$out"
check_has "a shard streaming a refusal after its rows: an ERROR naming it" 'foreign server "shard2" sent a malformed block of held rows: a refusal that is not one' \
  "$(forged_stream_on_shard2 "SELECT b FROM $REAL_STREAM UNION ALL SELECT $REFUSAL")"
check_has "a shard streaming rows after its refusal: an ERROR naming it" "foreign server \"shard2\" sent a malformed block of held rows: rows after it said its rows are not the declared columns'" \
  "$(forged_stream_on_shard2 "SELECT $REFUSAL UNION ALL SELECT b FROM $REAL_STREAM")"
out=$(forged_stream_on_shard2 "SELECT $REFUSAL" \
  "(SELECT * FROM knn_join('$SV', '$SV', 3)) j; SELECT knn_gpu_last_shard_stats()->>'queries_from_shards'")
check "a shard refusing its rows (not the declared columns'): the queries read here" "false" "$(echo "$out" | tail -1)"
check "... nothing held on the shards after the streams" "$(printf 'left:0\nleft:0')" \
  "$(sql 0 -c "SELECT 'left:' || count(*) FROM shard1_contexts WHERE name IN ('knn_gpu received queries', 'knn_gpu prefetched targets')" \
     -c "SELECT 'left:' || count(*) FROM shard2_contexts WHERE name IN ('knn_gpu received queries', 'knn_gpu prefetched targets')" 2>&1)"
# a NULL id: today's message (the queries'), from the shard that read it
out=$(sql 0 2>&1 <<EOF
BEGIN;
INSERT INTO items_s VALUES (NULL, 1, gen_vec(7), gen_vec(7)::halfvec, binary_quantize(gen_vec(7))::bit(8));
SELECT count(*) FROM knn_join('$SV', '$SV', 3);
ROLLBACK;
EOF
)
check_has "a NULL id: the queries' error, as without the shards" 'ERROR:  queries returned a NULL id' "$out"
check "... as one server's" "ERROR:  queries returned a NULL id" \
  "$(sql 0 -c "SELECT count(*) FROM knn_join('SELECT NULL::bigint, v FROM items_s_all', 'SELECT NULL::bigint, v FROM items_s_all', 3)" 2>&1)"
check "... and as without reading from the shards (shard_prefetch off)" "ERROR:  queries returned a NULL id" \
  "$(sql 0 -c "SET knn_gpu.shard_prefetch = off" -c "BEGIN" -c "INSERT INTO items_s VALUES (NULL, 1, gen_vec(7), NULL, NULL)" \
     -c "SELECT count(*) FROM knn_join('$SV', '$SV', 3)" 2>&1 | grep ERROR)"
# the big self-join goes this way; a timeout at many points (the shards' reads, the
# fetch of their rows, the shipping, the joins) ends it at once and leaves nothing
check "the big self-join's queries come from the shards" "$(printf '3000\ntrue')" \
  "$(sql 0 -c "SELECT count(*) FROM knn_join('SELECT id, v FROM big WHERE id % 10 = 0', 'SELECT id, v FROM big WHERE id % 10 = 0', 1)" \
     -c "SELECT knn_gpu_last_shard_stats()->>'queries_from_shards'" 2>&1)"
BIGS="SELECT count(*) FROM knn_join('SELECT id, v FROM big', 'SELECT id, v FROM big', 1, 'l2', false, 'brute')"
timeouts_at "the self-join from the shards" "$BIGS" $(seq 20 20 400)
check "the shards stopped working" 0 "$(active_on_shards)"
cancel_in_the_middle "the big self-join from the shards" "$BIGS"
# in one transaction: the self-join stopped by a timeout under a savepoint, rolled back to
# it, leaves nothing held on the shards in that very transaction (their rows live there
# until its end), and the next self-join of the transaction works
out=$(sql 0 2>&1 <<EOF
\set ON_ERROR_STOP 0
SET client_min_messages = warning;
BEGIN;
SAVEPOINT before_join;
SET LOCAL statement_timeout = '300ms';
$BIGS;
ROLLBACK TO SAVEPOINT before_join;
SELECT 'held:' || count(*) FROM shard1_contexts WHERE name IN ('knn_gpu received queries', 'knn_gpu prefetched targets');
SELECT 'held:' || count(*) FROM shard2_contexts WHERE name IN ('knn_gpu received queries', 'knn_gpu prefetched targets');
SELECT 'again:' || (count(*) > 0) FROM knn_join('$SV', '$SV', 3);
SELECT 'from:' || (knn_gpu_last_shard_stats()->>'queries_from_shards');
COMMIT;
EOF
)
check_has "a self-join under a savepoint stopped by statement_timeout" 'canceling statement due to statement timeout' "$out"
check "... rolled back to the savepoint: nothing held on the shards in the same transaction, the next self-join works" \
  "$(printf 'held:0\nheld:0\nagain:true\nfrom:true')" "$(echo "$out" | grep -E '^(held|again|from):')"
# a cancel while shard 1 is held up before it can send its rows (a lock on big_1)
sql 1 -c "SET application_name = 'knn_locker'" -c "BEGIN" -c "LOCK TABLE big_1 IN ACCESS EXCLUSIVE MODE" \
  -c "SELECT pg_sleep(6)" -c "COMMIT" >/dev/null 2>&1 &
locker=$!
sleep 0.3
sql 0 -c "SET application_name = 'knn_shard_cancel'" -c "$BIGS" >"${DIRS[0]}/cancel.out" 2>&1 &
bg=$!
seen=0
for _ in $(seq 1 50); do
  [ "$(sql 1 -c "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND wait_event_type = 'Lock' AND (query LIKE '%knn_shard_prefetch_self_join(%' OR query LIKE '%knn_shard_read_held_blocks(%')")" -ge 1 ] && { seen=1; break; }
  sleep 0.1
done
check "shard 1 reads the self-join's rows, waiting for the lock" 1 "$seen"
cancel_and_wait "$bg"
check_has "a cancel there ends the self-join (${ms} ms, shard 1 still locked)" 'canceling statement due to user request' \
  "$(cat "${DIRS[0]}/cancel.out")"
[ "$ms" -lt 3000 ] || fail "the cancel took ${ms} ms"
check "... and stopped the shards' work" 0 "$(active_on_shards)"
sql 1 -c "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'knn_locker'" >/dev/null
wait "$locker" 2>/dev/null
check "... nothing held on the shards, the session works" "$(printf 'held:0\nheld:0\nagain:true')" \
  "$(sql 0 -c "SET client_min_messages = warning" \
     -c "SELECT 'held:' || count(*) FROM shard1_contexts WHERE name IN ('knn_gpu prefetched targets', 'knn_gpu received queries')" \
     -c "SELECT 'held:' || count(*) FROM shard2_contexts WHERE name IN ('knn_gpu prefetched targets', 'knn_gpu received queries')" \
     -c "SELECT 'again:' || (count(*) > 0) FROM knn_join('$SV', '$SV', 3)" 2>&1)"
# the shard's function: only the targets held for that set, in its transaction
check_has "knn_shard_held_target_blocks without a read ahead: an error" 'no targets held for query set 5' \
  "$(sql 1 -c "SELECT knn_shard_held_target_blocks(5)" 2>&1)"
check "knn_shard_held_target_blocks: the rows read ahead, still held for the join" "t" \
  "$(sql 1 2>&1 <<'EOF'
BEGIN;
CREATE TEMP TABLE r AS SELECT targets_read FROM knn_shard_prefetch_self_join(6, 'vector', 'SELECT id, v FROM items_s_0', 'l2');
SELECT (SELECT targets_read FROM r) = (SELECT count(v) FROM items_s_0)
   AND sum(length(b)) = 12 * count(*) + (SELECT count(v) * (8 + 4 * 8) FROM items_s_0)
   AND knn_shard_held_targets() = (SELECT count(v) FROM items_s_0)
  FROM (SELECT knn_shard_held_target_blocks(6) AS b) x;
COMMIT;
EOF
)"

# ---- the self-join's queries from the shards: robustness (issue 11) ----
# items_x: three foreign partitions, two of them on shard 1, with a bit(12)
# column; its remote tables also hold columns of other types than some
# coordinator tables declare over them (items_xm: vector over halfvec,
# items_xw: vector(8) over vector(16), items_xi: integer ids over bigint,
# items_xu: a vector column with rows of another dimension on shard 1).
XCOLS="id bigint, v vector(8), h halfvec(8), b bit(12)"
sql 1 -c "CREATE TABLE items_x_0 ($XCOLS, w vector(16), u vector)" -c "CREATE TABLE items_x_2 ($XCOLS, w vector(16), u vector)"
sql 2 -c "CREATE TABLE items_x_1 ($XCOLS, w vector(16), u vector)"
sql 0 >/dev/null <<EOF || fail "items_x set-up"
CREATE TABLE items_x ($XCOLS) PARTITION BY HASH (id);
CREATE TABLE items_xm (id bigint, h vector(8)) PARTITION BY HASH (id);
CREATE TABLE items_xw (id bigint, w vector(8)) PARTITION BY HASH (id);
CREATE TABLE items_xi (id integer, v vector(8)) PARTITION BY HASH (id);
CREATE TABLE items_xu (id bigint, u vector) PARTITION BY HASH (id);
-- items_<t>_0..2 of each items_<t>: foreign tables over items_x_0..2 (1 on shard 2)
CREATE FUNCTION items_x_partitions(tables text[]) RETURNS void LANGUAGE plpgsql AS \$\$
DECLARE
  t text;
  p int;
BEGIN
  FOREACH t IN ARRAY tables LOOP
    FOR p IN 0 .. 2 LOOP
      EXECUTE format('CREATE FOREIGN TABLE items_%s_%s PARTITION OF items_%s FOR VALUES WITH (MODULUS 3, REMAINDER %s) SERVER %s OPTIONS (table_name %L)',
                     t, p, t, p, CASE p WHEN 1 THEN 'shard2' ELSE 'shard1' END, 'items_x_' || p);
    END LOOP;
  END LOOP;
END
\$\$;
SELECT items_x_partitions(ARRAY['x', 'xm', 'xw', 'xi', 'xu']);
CREATE TABLE items_x_all ($XCOLS);
INSERT INTO items_x_all
  SELECT i, gen_vec(i), gen_vec(i)::halfvec, substr(binary_quantize(gen_vec(i, 16))::text, 1, 12)::bit(12)
  FROM generate_series(1, 600) i;
INSERT INTO items_x_all VALUES (3000000000, gen_vec(7), gen_vec(7)::halfvec, B'101010101010'), (601, NULL, NULL, NULL);
INSERT INTO items_x SELECT * FROM items_x_all;
ANALYZE items_x_all;
EOF
for t in 1:items_x_0 1:items_x_2 2:items_x_1; do
  sql "${t%%:*}" -c "UPDATE ${t#*:} SET w = (v::real[] || v::real[])::vector(16), u = v" -c "ANALYZE ${t#*:}"
done
check "items_x: rows on both shards (two partitions on shard 1), none here" "t" \
  "$(sql 0 -c "SELECT (SELECT count(*) FROM items_x_0) > 0 AND (SELECT count(*) FROM items_x_2) > 0 AND (SELECT count(*) FROM items_x_1) > 0 AND (SELECT count(*) FROM items_x) = 602")"
XV="SELECT id, v FROM items_x"
# x_from_shards NAME CALL_OVER_ITEMS_X EXPECTED_FROM_SHARDS: as self_from_shards, over items_x
x_from_shards() {
  same_as_one_server "$1" 2 "$2" "${2//items_x/items_x_all}" "$3"
}
x_from_shards "one shard holding two partitions: the self-join from the shards" "knn_join('$XV', '$XV', 6, 'l2', true)" true
x_from_shards "... bit(12) hamming" "knn_join('SELECT id, b FROM items_x', 'SELECT id, b FROM items_x', 5, 'hamming')" true
x_from_shards "... bit(12) jaccard, exclude_self" "knn_join('SELECT id, b FROM items_x', 'SELECT id, b FROM items_x', 5, 'jaccard', true)" true
x_from_shards "... halfvec" "knn_join('SELECT id, h FROM items_x', 'SELECT id, h FROM items_x', 4, 'cosine')" true
# as_today NAME CALL: the call equals itself with knn_gpu.shard_prefetch off (the
# queries read here through postgres_fdw, as before the self-join from the
# shards), and says whether its queries came from the shards; or both end in
# the same ERROR
as_today() {
  local out
  out=$(sql 0 -v "c=$2" 2>&1 <<'EOF'
\set ON_ERROR_STOP 0
SET client_min_messages = warning;
CREATE TEMP TABLE s AS SELECT * FROM :c;
SELECT 'from shards ' || (knn_gpu_last_shard_stats()->>'queries_from_shards');
SET knn_gpu.shard_prefetch = off;
CREATE TEMP TABLE r AS SELECT * FROM :c;
SELECT (SELECT count(*) FROM (SELECT * FROM s EXCEPT ALL SELECT * FROM r) a)
     + (SELECT count(*) FROM (SELECT * FROM r EXCEPT ALL SELECT * FROM s) b)
     || ' differences, ' || ((SELECT count(*) FROM s) > 0);
EOF
)
  echo "$out" | grep -E '^(ERROR|from shards|[0-9]+ differences)' | sed 's/^\(ERROR: .*\)$/\1/' | tr '\n' ';'
}
# declared types that are not the remote ones: the queries read here, as before
# (the targets too: "declared types that are not the shard's" below; no shard joins)
check "declared vector over a remote halfvec: the queries read here, the same rows as before" \
  "0 differences, true;" "$(as_today x "knn_join('SELECT id, h FROM items_xm', 'SELECT id, h FROM items_xm', 5, 'l2')")"
out=$(as_today x "knn_join('SELECT id, w FROM items_xw', 'SELECT id, w FROM items_xw', 5, 'l2')")
check_has "declared vector(8) over a remote vector(16): the ERROR of the read here" "ERROR:  expected 8 dimensions, not 16" "$out"
check "... as before (shard_prefetch off)" "2" "$(echo "$out" | grep -o 'ERROR:  expected 8 dimensions, not 16' | wc -l)"
out=$(as_today x "knn_join('SELECT id, v FROM items_xi', 'SELECT id, v FROM items_xi', 5, 'l2')")
check_has "declared integer ids over remote bigint ids: the ERROR of the read here" 'ERROR:  value "3000000000" is out of range for type integer' "$out"
check "... as before (shard_prefetch off)" "2" "$(echo "$out" | grep -o 'ERROR:  value "3000000000" is out of range for type integer' | wc -l)"
check "... and without the id out of range: the queries read here, the same rows as before" \
  "0 differences, true;" \
  "$(sql 0 -v "c=knn_join('SELECT id, v FROM items_xi', 'SELECT id, v FROM items_xi', 5, 'l2')" 2>&1 <<'EOF' | grep -E '^(from shards|[0-9]+ differences)' | tr '\n' ';'
SET client_min_messages = warning;
BEGIN;
DELETE FROM items_x WHERE id = 3000000000;
CREATE TEMP TABLE s AS SELECT * FROM :c;
SELECT 'from shards ' || (knn_gpu_last_shard_stats()->>'queries_from_shards');
SET LOCAL knn_gpu.shard_prefetch = off;
CREATE TEMP TABLE r AS SELECT * FROM :c;
SELECT (SELECT count(*) FROM (SELECT * FROM s EXCEPT ALL SELECT * FROM r) a)
     + (SELECT count(*) FROM (SELECT * FROM r EXCEPT ALL SELECT * FROM s) b)
     || ' differences, ' || ((SELECT count(*) FROM s) > 0);
ROLLBACK;
EOF
)"
# a declared domain (its CHECK runs in the read here): the queries read here, its ERROR
out=$(sql 0 -c "CREATE DOMAIN vector_none AS vector CHECK (VALUE IS NULL)" \
  -c "CREATE TABLE items_xd (id bigint, v vector_none) PARTITION BY HASH (id)" \
  -c "CREATE FOREIGN TABLE items_xd_0 PARTITION OF items_xd FOR VALUES WITH (MODULUS 3, REMAINDER 0) SERVER shard1 OPTIONS (table_name 'items_x_0')" \
  -c "CREATE FOREIGN TABLE items_xd_1 PARTITION OF items_xd FOR VALUES WITH (MODULUS 3, REMAINDER 1) SERVER shard2 OPTIONS (table_name 'items_x_1')" \
  -c "CREATE FOREIGN TABLE items_xd_2 PARTITION OF items_xd FOR VALUES WITH (MODULUS 3, REMAINDER 2) SERVER shard1 OPTIONS (table_name 'items_x_2')" 2>&1 >/dev/null;
  as_today x "knn_join('SELECT id, v FROM items_xd', 'SELECT id, v FROM items_xd', 5, 'l2')")
check "declared domain over vector: the ERROR of its CHECK, as before" "2" \
  "$(echo "$out" | grep -o 'ERROR:  value for domain vector_none violates check constraint "vector_none_check"' | wc -l)"

# ---- declared types that are not the shard's, for every join ----
# postgres_fdw reads a foreign table's values through the input function of
# the type declared here, so a plain scan computes with the declared type,
# whatever the shard's column is; a shard's own join would compute with its
# column's type (a halfvec column under a declared vector: halfvec
# distances). A partition whose columns there are not exactly the declared
# types (catalog identity, and the declared typmod) is read here, with a
# NOTICE: every join equals the same join with its targets read here (a
# filter only this server runs), or ends in the same ERROR.
sql 0 -q <<'EOF' || fail "declared types: set-up"
CREATE FUNCTION read_here(bigint) RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS 'BEGIN RETURN $1 IS NOT NULL; END';
CREATE TABLE items_xh (id bigint, v halfvec(8)) PARTITION BY HASH (id);
CREATE TABLE items_xmix (id bigint, v vector(8)) PARTITION BY HASH (id);
DO $$ BEGIN PERFORM items_x_partitions(ARRAY['xh', 'xmix']); END $$;
-- one partition of items_xmix reads the halfvec column there (postgres_fdw's column_name)
ALTER FOREIGN TABLE items_xmix_1 ALTER COLUMN v OPTIONS (column_name 'h');
EOF
# as_read_here NAME SHARDS SHARDED HERE: SHARDED's rows (knn_join's, or a
# LATERAL query's) equal HERE's, SHARDS shards joined; SHARDED's NOTICEs of
# partitions read here go to $read_here_notices
as_read_here() {
  local out
  out=$(sharded_against_reference notice | sql 0 -v "s=$3" -v "r=$4" 2>&1)
  check "$1" "0 differences, true, $2 shards" "$(echo "$out" | grep -E ' differences, |ERROR')"
  read_here_notices=$(echo "$out" | grep 'NOTICE:  .* here: its column')
}
QX="SELECT id, v FROM items_x_all WHERE id % 7 = 0"
HALF_THERE='its column "h" is public.halfvec(8) there, vector(8) here'
as_read_here "declared vector over a remote halfvec: knn_join l2 = its targets read here" 0 \
  "SELECT * FROM knn_join('$QX', 'SELECT id, h FROM items_xm', 5)" \
  "SELECT * FROM knn_join('$QX', 'SELECT id, h FROM items_xm WHERE read_here(id)', 5)"
check "... a NOTICE for each partition, naming the column and both types" 3 \
  "$(echo "$read_here_notices" | grep -c "knn_join reads the rows of foreign table \"items_xm_[012]\" of server \"shard[12]\" here: $HALF_THERE")"
as_read_here "... knn_join ip, exclude_self" 0 \
  "SELECT * FROM knn_join('$QX', 'SELECT id, h FROM items_xm', 4, 'ip', true)" \
  "SELECT * FROM knn_join('$QX', 'SELECT id, h FROM items_xm WHERE read_here(id)', 4, 'ip', true)"
as_read_here "... knn_range_join" 0 \
  "SELECT * FROM knn_range_join('$QX', 'SELECT id, h FROM items_xm', 2.0)" \
  "SELECT * FROM knn_range_join('$QX', 'SELECT id, h FROM items_xm WHERE read_here(id)', 2.0)"
XNODE="SELECT q.id AS qid, n.id, n.d FROM ($QX) q CROSS JOIN LATERAL (SELECT t.id, t.h <-> q.v AS d FROM items_xm t"
as_read_here "... the KNN Join node" 0 "$XNODE ORDER BY t.h <-> q.v, t.id LIMIT 3) n" \
  "$XNODE WHERE read_here(t.id) ORDER BY t.h <-> q.v, t.id LIMIT 3) n"
check "... its NOTICEs" 3 \
  "$(echo "$read_here_notices" | grep -c "KNN Join reads the rows of foreign table \"items_xm_[012]\" of server \"shard[12]\" here: $HALF_THERE")"
XNODE="SELECT q.id AS qid, n.id, n.d FROM ($QX) q CROSS JOIN LATERAL (SELECT t.id, t.h <=> q.v AS d FROM items_xm t"
as_read_here "... the node, self-exclusion" 0 "$XNODE WHERE t.id <> q.id ORDER BY t.h <=> q.v, t.id LIMIT 4) n" \
  "$XNODE WHERE t.id <> q.id AND read_here(t.id) ORDER BY t.h <=> q.v, t.id LIMIT 4) n"
# the reverse: a declared halfvec over a remote vector
as_read_here "declared halfvec over a remote vector: knn_join = its targets read here" 0 \
  "SELECT * FROM knn_join('$QX', 'SELECT id, v FROM items_xh', 5, 'cosine')" \
  "SELECT * FROM knn_join('$QX', 'SELECT id, v FROM items_xh WHERE read_here(id)', 5, 'cosine')"
XNODE="SELECT q.id AS qid, n.id, n.d FROM (SELECT id, h FROM items_x_all WHERE id % 7 = 0) q CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.h AS d FROM items_xh t"
as_read_here "... the KNN Join node" 0 "$XNODE ORDER BY t.v <-> q.h, t.id LIMIT 3) n" \
  "$XNODE WHERE read_here(t.id) ORDER BY t.v <-> q.h, t.id LIMIT 3) n"
# one partition of three: the others still join on their shard; EXPLAIN and the statistics say which
as_read_here "one partition's column of another type there: read here, the others on their shard" 1 \
  "SELECT * FROM knn_join('$QX', 'SELECT id, v FROM items_xmix', 5)" \
  "SELECT * FROM knn_join('$QX', 'SELECT id, v FROM items_xmix WHERE read_here(id)', 5)"
check "... its NOTICE" 1 \
  "$(echo "$read_here_notices" | grep -c 'knn_join reads the rows of foreign table "items_xmix_1" of server "shard2" here: its column "v" is public.halfvec(8) there, vector(8) here')"
# shards_named QUERY FIELDS: QUERY's EXPLAIN lines Shard: and Servers Read Here:, then,
# after it ran, FIELDS of each entry of its statistics' fallback (f)
shards_named() {
  sql 0 -c "SET client_min_messages = warning" -c "EXPLAIN (COSTS OFF) $1" -c "SELECT count(*) FROM ($1) c" \
    -c "SELECT $2 FROM json_array_elements(knn_gpu_last_shard_stats()->'fallback') f" 2>&1 |
    sed -n 's/^ *\(Shard: .*\|Servers Read Here: .*\)$/\1/p; /^shard/p'
}
check "... named in EXPLAIN and in the statistics' fallback" \
  "$(printf 'Shard: shard1 (items_xmix_0, items_xmix_2)\nServers Read Here: shard2 (items_xmix_1)\nshard2|items_xmix_1')" \
  "$(shards_named "SELECT * FROM knn_join('$QX', 'SELECT id, v FROM items_xmix', 5)" "f->>'server', f->>'partition'")"
XNODE="SELECT q.id AS qid, n.id, n.d FROM ($QX) q CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS d FROM items_xmix t"
as_read_here "... the KNN Join node" 1 "$XNODE ORDER BY t.v <-> q.v, t.id LIMIT 3) n" \
  "$XNODE WHERE read_here(t.id) ORDER BY t.v <-> q.v, t.id LIMIT 3) n"
# A server whose partitions the type check takes some of, and whose other partitions the
# node's operator check then sends here too (shard1 without knn_gpu's <#> for vector: its
# function taken out of the extension there, for this test): the server is named once, in
# EXPLAIN's Servers Read Here and in the fallback (it was named after its partition, then
# again).
sql 0 -q <<'EOF' || fail "the type check, then the operator check: set-up"
CREATE TABLE items_xop (id bigint, v vector(8)) PARTITION BY HASH (id);
CREATE FOREIGN TABLE items_xop_0 PARTITION OF items_xop FOR VALUES WITH (MODULUS 3, REMAINDER 0) SERVER shard1 OPTIONS (table_name 'items_x_0');
CREATE FOREIGN TABLE items_xop_1 PARTITION OF items_xop FOR VALUES WITH (MODULUS 3, REMAINDER 1) SERVER shard2 OPTIONS (table_name 'items_x_1');
CREATE FOREIGN TABLE items_xop_2 PARTITION OF items_xop FOR VALUES WITH (MODULUS 3, REMAINDER 2) SERVER shard1 OPTIONS (table_name 'items_x_2');
ALTER FOREIGN TABLE items_xop_2 ALTER COLUMN v OPTIONS (column_name 'h');
EOF
sql 1 -c "ALTER EXTENSION knn_gpu DROP FUNCTION negative_inner_product(vector, vector)"
XNODE="SELECT q.id AS qid, n.id, n.d FROM ($QX) q CROSS JOIN LATERAL (SELECT t.id, t.v <#> q.v AS d FROM items_xop t"
as_read_here "a partition read here for its type, then its server for the node's operator: one server's rows" 1 \
  "$XNODE ORDER BY t.v <#> q.v, t.id LIMIT 3) n" "$XNODE WHERE read_here(t.id) ORDER BY t.v <#> q.v, t.id LIMIT 3) n"
check "... the server named once, in EXPLAIN and in the statistics' fallback" \
  "$(printf 'Shard: shard2 (items_xop_1)\nServers Read Here: shard1\nshard1||it has no operator <#>')" \
  "$(shards_named "$XNODE ORDER BY t.v <#> q.v, t.id LIMIT 3) n" "f->>'server', f->>'partition', substr(f->>'reason', 1, 22)")"
sql 1 -c "ALTER EXTENSION knn_gpu ADD FUNCTION negative_inner_product(vector, vector)"
# a declared typmod the shard's column does not have: the read here's ERROR, as without the shards
QX16="SELECT id, (v::real[] || v::real[])::vector FROM items_x_all WHERE id % 7 = 0"
check "declared vector(8) over a remote vector(16): the ERROR of the read here" \
  "$(printf 'ERROR:  expected 8 dimensions, not 16\nERROR:  expected 8 dimensions, not 16')" \
  "$(sql 0 -c "SET client_min_messages = warning" -c "SELECT count(*) FROM knn_join('$QX16', 'SELECT id, w FROM items_xw', 5)" 2>&1 | grep ERROR
     sql 0 -c "SET client_min_messages = warning" -c "SELECT count(*) FROM knn_join('$QX16', 'SELECT id, w FROM items_xw WHERE read_here(id)', 5)" 2>&1 | grep ERROR)"
# a type there called vector that is not knn_gpu's (nor pgvector's): a base type of
# knn_gpu's C code outside the extension, in a schema of its own
sql 1 -q <<'EOF' || fail "declared types: a type called vector there"
SET client_min_messages = warning;
CREATE SCHEMA fake;
CREATE TYPE fake.vector;
CREATE FUNCTION fake.vector_in(cstring, oid, integer) RETURNS fake.vector AS '$libdir/knn_gpu', 'knn_vector_in' LANGUAGE C IMMUTABLE STRICT;
CREATE FUNCTION fake.vector_out(fake.vector) RETURNS cstring AS '$libdir/knn_gpu', 'knn_vector_out' LANGUAGE C IMMUTABLE STRICT;
CREATE TYPE fake.vector (INPUT = fake.vector_in, OUTPUT = fake.vector_out, INTERNALLENGTH = VARIABLE, STORAGE = external);
CREATE TABLE items_fake (id bigint, v fake.vector);
INSERT INTO items_fake SELECT id, h::text::fake.vector FROM items_x_0;
EOF
sql 0 -c "CREATE FOREIGN TABLE items_fake (id bigint, v vector(8)) SERVER shard1" >/dev/null
as_read_here "declared vector over a type called vector there that is not: read here" 0 \
  "SELECT * FROM knn_join('$QX', 'SELECT id, v FROM items_fake', 5)" \
  "SELECT * FROM knn_join('$QX', 'SELECT id, v FROM items_fake WHERE read_here(id)', 5)"
check_has "... its NOTICE" 'its column "v" is fake.vector there, vector(8) here' "$read_here_notices"
sql 1 -q -c "SET client_min_messages = warning" -c "DROP TABLE items_fake" -c "DROP FUNCTION fake.vector_in(cstring, oid, integer) CASCADE" -c "DROP SCHEMA fake"
# pgvector's vector there under knn_gpu's here (pgvector's operator values, not knn_gpu's)
if [ "$(sql 1 -c "SELECT count(*) FROM pg_available_extensions WHERE name = 'vector'")" = 1 ] &&
   sql 1 -q -c "CREATE SCHEMA pgv" -c "CREATE EXTENSION vector SCHEMA pgv" 2>/dev/null; then
  sql 1 -q -c "CREATE TABLE items_pgv (id bigint, v pgv.vector(8))" \
    -c "INSERT INTO items_pgv SELECT id, v::text::pgv.vector FROM items_x_0"
  sql 0 -c "CREATE FOREIGN TABLE items_pgv (id bigint, v vector(8)) SERVER shard1" >/dev/null
  as_read_here "declared knn_gpu's vector over pgvector's: knn_join = its targets read here" 0 \
    "SELECT * FROM knn_join('$QX', 'SELECT id, v FROM items_pgv', 5, 'cosine')" \
    "SELECT * FROM knn_join('$QX', 'SELECT id, v FROM items_pgv WHERE read_here(id)', 5, 'cosine')"
  check_has "... its NOTICE" 'its column "v" is pgv.vector(8) there, vector(8) here' "$read_here_notices"
  XNODE="SELECT q.id AS qid, n.id, n.d FROM ($QX) q CROSS JOIN LATERAL (SELECT t.id, t.v <-> q.v AS d FROM items_pgv t"
  as_read_here "... the KNN Join node" 0 "$XNODE ORDER BY t.v <-> q.v, t.id LIMIT 3) n" \
    "$XNODE WHERE read_here(t.id) ORDER BY t.v <-> q.v, t.id LIMIT 3) n"
  sql 1 -q -c "DROP TABLE items_pgv" -c "DROP EXTENSION vector" -c "DROP SCHEMA pgv"
else
  echo "skipped: pgvector's vector under knn_gpu's (pgvector is not installed here)"
fi
# a column_name naming a system column there (xmin: xid), read here by postgres_fdw as any
# other column: its type is asked too (it was taken for a column not there, and the shard's
# join failed on ids of type xid where the read here reads them as bigint)
sql 0 -c "CREATE FOREIGN TABLE items_xmin (id bigint OPTIONS (column_name 'xmin'), v vector(8)) SERVER shard1 OPTIONS (table_name 'items_x_0')" >/dev/null
as_read_here "a column_name naming a system column there (xmin): read here" 0 \
  "SELECT * FROM knn_join('$QX', 'SELECT id, v FROM items_xmin', 3)" \
  "SELECT * FROM knn_join('$QX', 'SELECT id, v FROM items_xmin WHERE read_here(id)', 3)"
check_has "... its NOTICE" 'its column "id" is xid there, bigint here' "$read_here_notices"
# odd names there (schema_name, table_name and column_name options with quotes, a backslash,
# capitals and a space): the table and column are found as postgres_fdw's SELECT names them
sql 1 -q <<'EOF' || fail "declared types: odd names there"
CREATE SCHEMA "Odd ""Sch";
CREATE TABLE "Odd ""Sch"."Ta""b'le\x" (id bigint, "Vec""X" halfvec(8));
INSERT INTO "Odd ""Sch"."Ta""b'le\x" SELECT id, h FROM items_x_0;
EOF
sql 0 -c "CREATE FOREIGN TABLE items_odd (id bigint, v vector(8) OPTIONS (column_name 'Vec\"X')) SERVER shard1 OPTIONS (schema_name 'Odd \"Sch', table_name 'Ta\"b''le\\x')" >/dev/null
as_read_here "odd schema, table and column names there: their column of another type found, read here" 0 \
  "SELECT * FROM knn_join('$QX', 'SELECT id, v FROM items_odd', 5)" \
  "SELECT * FROM knn_join('$QX', 'SELECT id, v FROM items_odd WHERE read_here(id)', 5)"
check_has "... its NOTICE" 'its column "v" is public.halfvec(8) there, vector(8) here' "$read_here_notices"

# The node's self-exclusion and group values are compared on the shard under "C": the shard's
# column may have a nondeterministic collation (case-insensitive here), which won over the
# query table's default one there, and matched 'a' with 'A' where this server does not.
if [ "$(sql 1 -c "SELECT count(*) > 0 FROM pg_collation WHERE collprovider = 'i'")" = t ]; then
  for i in 1 2; do
    sql "$i" -q -c "CREATE COLLATION case_blind (provider = icu, locale = 'und-u-ks-level2', deterministic = false)" \
      -c "CREATE TABLE items_ci_$i (id bigint, g text COLLATE case_blind, v vector(8))"
  done
  sql 0 -q <<'EOF' || fail "group keys under a nondeterministic collation there: set-up"
CREATE TABLE items_ci_all (id bigint, g text, v vector(8));
INSERT INTO items_ci_all SELECT i, CASE WHEN i % 2 = 0 THEN 'a' ELSE 'A' END, gen_vec(i) FROM generate_series(1, 400) i;
CREATE TABLE items_ci (id bigint, g text, v vector(8)) PARTITION BY HASH (id);
CREATE FOREIGN TABLE items_ci_1 PARTITION OF items_ci FOR VALUES WITH (MODULUS 2, REMAINDER 0) SERVER shard1 OPTIONS (table_name 'items_ci_1');
CREATE FOREIGN TABLE items_ci_2 PARTITION OF items_ci FOR VALUES WITH (MODULUS 2, REMAINDER 1) SERVER shard2 OPTIONS (table_name 'items_ci_2');
INSERT INTO items_ci SELECT * FROM items_ci_all;
ANALYZE items_ci_all;
EOF
  CNODE="SELECT q.id AS qid, n.id, n.g, n.d FROM items_ci_all q CROSS JOIN LATERAL (SELECT t.id, t.g, t.v <-> q.v AS d FROM"
  as_read_here "a group key of a case-insensitive column there: the shards match as this server does" 2 \
    "$CNODE items_ci t WHERE t.g = q.g ORDER BY t.v <-> q.v, t.id LIMIT 3) n" \
    "$CNODE items_ci_all t WHERE t.g = q.g ORDER BY t.v <-> q.v, t.id LIMIT 3) n"
  as_read_here "... a self-exclusion by it" 2 \
    "$CNODE items_ci t WHERE t.g <> q.g ORDER BY t.v <-> q.v, t.id LIMIT 3) n" \
    "$CNODE items_ci_all t WHERE t.g <> q.g ORDER BY t.v <-> q.v, t.id LIMIT 3) n"
else
  echo "skipped: a nondeterministic collation on the shards (no ICU)"
fi

# ---- pgvector's columns on the coordinator and the shards ----
# With pgvector's types knn_join's values are pgvector's operator's (knn_operator_values.h);
# the shard's join ranks by them exactly where its query type and target type are
# pgvector's. The query rows go there in pgvector's type where this join ranks by
# pgvector's operator, in knn_gpu's own type where it does not (they went in knn_gpu's
# whenever the shard had both, and the shard then returned the engine's values, which
# differ from pgvector's in the last bits; a shard whose knn_gpu uses pgvector's types was
# sent pgvector's for knn_gpu's queries). Every join equals one server's, distances bit
# for bit (float8send). pgvector in schema pgv everywhere, after knn_gpu; shard 2's
# database pgvfirst has pgvector first (knn_gpu uses its types there).
if [ "$(sql 1 -c "SELECT count(*) FROM pg_available_extensions WHERE name = 'vector'")" = 1 ]; then
  for i in 0 1 2; do
    sql "$i" -q -c "CREATE SCHEMA pgv" -c "CREATE EXTENSION vector SCHEMA pgv" || fail "pgvector's columns: set-up"
  done
  for i in 1 2; do
    sql "$i" -q -c "CREATE TABLE pv_$i (id bigint, v pgv.vector(32), h pgv.halfvec(32))"
  done
  sql 2 -q -c "CREATE DATABASE pgvfirst"
  sql 2 pgvfirst -q -c "SET client_min_messages = error" -c "CREATE EXTENSION vector" -c "CREATE EXTENSION knn_gpu" \
    -c "CREATE TABLE pv_2 (id bigint, v vector(32), h halfvec(32))"
  sql 0 -q <<EOF || fail "pgvector's columns: set-up here"
CREATE SERVER shard2_pgvfirst FOREIGN DATA WRAPPER postgres_fdw OPTIONS (host '${DIRS[2]}', port '${PORTS[2]}', dbname 'pgvfirst');
CREATE USER MAPPING FOR postgres SERVER shard2_pgvfirst OPTIONS (user 'postgres');
CREATE FUNCTION pgv_vec(i bigint) RETURNS pgv.vector IMMUTABLE LANGUAGE sql AS
\$\$ SELECT array_agg(((hashint8(i * 1000 + j) % 100003) / 100003.0)::real ORDER BY j)::pgv.vector FROM generate_series(1, 32) j \$\$;
CREATE TABLE pv_all (id bigint, v pgv.vector(32), h pgv.halfvec(32));
INSERT INTO pv_all SELECT i, pgv_vec(i), pgv_vec(i)::pgv.halfvec FROM generate_series(1, 600) i;
CREATE TABLE pvq AS SELECT * FROM pv_all WHERE id % 5 = 0;
CREATE TABLE pv (id bigint, v pgv.vector(32), h pgv.halfvec(32)) PARTITION BY HASH (id);
CREATE FOREIGN TABLE pv_1 PARTITION OF pv FOR VALUES WITH (MODULUS 2, REMAINDER 0) SERVER shard1 OPTIONS (table_name 'pv_1');
CREATE FOREIGN TABLE pv_2 PARTITION OF pv FOR VALUES WITH (MODULUS 2, REMAINDER 1) SERVER shard2 OPTIONS (table_name 'pv_2');
INSERT INTO pv SELECT * FROM pv_all;
-- the same rows, the second partition in pgvfirst
CREATE TABLE pvf (id bigint, v pgv.vector(32), h pgv.halfvec(32)) PARTITION BY HASH (id);
CREATE FOREIGN TABLE pvf_1 PARTITION OF pvf FOR VALUES WITH (MODULUS 2, REMAINDER 0) SERVER shard1 OPTIONS (table_name 'pv_1');
CREATE FOREIGN TABLE pvf_2 PARTITION OF pvf FOR VALUES WITH (MODULUS 2, REMAINDER 1) SERVER shard2_pgvfirst OPTIONS (table_name 'pv_2');
INSERT INTO pvf_2 SELECT * FROM pv_all WHERE satisfies_hash_partition('pvf'::regclass, 2, 1, id);
ANALYZE pv_all, pvq;
EOF
  # pgv_same NAME SHARDS SHARDED_CALL: its rows (distances as float8send) equal those of the
  # call over pv_all (FROM pv' and FROM pvf' in its texts become FROM pv_all')
  pgv_same() {
    as_read_here "$1" "$2" "SELECT query_id, target_id, float8send(distance) AS d FROM $3" \
      "SELECT query_id, target_id, float8send(distance) AS d FROM $(echo "$3" | sed "s/FROM pvf\?'/FROM pv_all'/g")"
  }
  pgv_same "pgvector's vector: knn_join l2 on the shards = one server, bit for bit" 2 \
    "knn_join('SELECT id, v FROM pvq', 'SELECT id, v FROM pv', 5, 'l2')"
  pgv_same "... ip" 2 "knn_join('SELECT id, v FROM pvq', 'SELECT id, v FROM pv', 5, 'ip')"
  pgv_same "... cosine, exclude_self" 2 "knn_join('SELECT id, v FROM pvq', 'SELECT id, v FROM pv', 5, 'cosine', true)"
  pgv_same "... knn_range_join cosine" 2 "knn_range_join('SELECT id, v FROM pvq', 'SELECT id, v FROM pv', 0.75, 'cosine')"
  pgv_same "... the self-join, its queries from the shards" 2 \
    "knn_join('SELECT id, v FROM pv', 'SELECT id, v FROM pv', 4, 'ip')"
  pgv_same "... real[] queries (arr::vector <-> v)" 2 "knn_join('SELECT id, v::real[] FROM pvq', 'SELECT id, v FROM pv', 5, 'l2')"
  pgv_same "... vector queries, halfvec targets (h <-> v)" 2 "knn_join('SELECT id, v FROM pvq', 'SELECT id, h FROM pv', 5, 'l2')"
  pgv_same "... knn_gpu's vector queries (the engine's values, here and there)" 2 \
    "knn_join('SELECT id, v::text::public.vector FROM pvq', 'SELECT id, v FROM pv', 5, 'l2')"
  PNODE="SELECT q.id AS query_id, n.id AS target_id, float8send(n.d) AS d FROM pvq q CROSS JOIN LATERAL (SELECT t.id, t.v OPERATOR(pgv.<=>) q.v AS d FROM"
  as_read_here "... the KNN Join node cosine on the shards = one server, bit for bit" 2 \
    "$PNODE pv t ORDER BY t.v OPERATOR(pgv.<=>) q.v, t.id LIMIT 5) n" \
    "$PNODE pv_all t ORDER BY t.v OPERATOR(pgv.<=>) q.v, t.id LIMIT 5) n"
  # a shard whose knn_gpu uses pgvector's types: pgvector's queries join there, knn_gpu's are read here
  pgv_same "a shard with pgvector's types only: pgvector's queries join there" 2 \
    "knn_join('SELECT id, v FROM pvq', 'SELECT id, v FROM pvf', 5, 'ip')"
  pgv_same "... knn_gpu's queries: that shard read here (the engine's values, not pgvector's operator's)" 1 \
    "knn_join('SELECT id, v::text::public.vector FROM pvq', 'SELECT id, v FROM pvf', 5, 'ip')"
  check_has "... its NOTICE" \
    'knn_join reads the rows of foreign server "shard2_pgvfirst" here: it has no vector type of extension "knn_gpu"' \
    "$(sql 0 -c "SELECT count(*) FROM knn_join('SELECT id, v::text::public.vector FROM pvq', 'SELECT id, v FROM pvf', 5, 'ip')" 2>&1)"
  # pgvector of another version on a shard: its distances may have other bits; read here
  sql 1 -q -c "UPDATE pg_extension SET extversion = '0.0.1' WHERE extname = 'vector'"
  pgv_same "pgvector of another version there: that shard read here" 1 \
    "knn_join('SELECT id, v FROM pvq', 'SELECT id, v FROM pv', 5, 'l2')"
  check_has "... its NOTICE" \
    "it has no vector type of extension \"vector\" version $(sql 0 -c "SELECT extversion FROM pg_extension WHERE extname = 'vector'")" \
    "$(sql 0 -c "SELECT count(*) FROM knn_join('SELECT id, v FROM pvq', 'SELECT id, v FROM pv', 5, 'l2')" 2>&1)"
  sql 1 -q -c "UPDATE pg_extension SET extversion = '$(sql 0 -c "SELECT extversion FROM pg_extension WHERE extname = 'vector'")' WHERE extname = 'vector'"
  sql 0 -q -c "SET client_min_messages = warning" -c "DROP TABLE pv, pvf, pv_all, pvq" -c "DROP SERVER shard2_pgvfirst CASCADE" -c "DROP FUNCTION pgv_vec(bigint)" \
    -c "DROP EXTENSION vector" -c "DROP SCHEMA pgv"
  for i in 1 2; do sql "$i" -q -c "DROP TABLE pv_$i" -c "DROP EXTENSION vector" -c "DROP SCHEMA pgv"; done
  sql 2 -q -c "DROP DATABASE pgvfirst"
else
  echo "skipped: pgvector's columns on the coordinator and the shards (pgvector is not installed here)"
fi
# a shard's read of rows of another dimension: the message names a query, as the read here does
sql 1 -c "UPDATE items_x_0 SET u = '[1,2,3]' WHERE id = (SELECT max(id) FROM items_x_0 WHERE v IS NOT NULL AND id < 1000)"
out=$(as_today x "knn_join('SELECT id, u FROM items_xu', 'SELECT id, u FROM items_xu', 5, 'l2')")
check "rows of another dimension in a shard's read: the ERROR names the query id, as the read here does" \
  "2 1" "$(echo "$out" | grep -o 'ERROR:  dimension mismatch: query id [0-9]* has 3 dimensions, expected 8' | wc -l) $(echo "$out" | grep -o 'ERROR:  dimension mismatch: [a-z]* id [0-9]*' | sort -u | wc -l)"
sql 1 -c "UPDATE items_x_0 SET u = v"
# ... and shards whose rows have different dimensions: read here, today's ERROR
sql 2 -c "UPDATE items_x_1 SET u = w"
out=$(as_today x "knn_join('SELECT id, u FROM items_xu', 'SELECT id, u FROM items_xu', 5, 'l2')")
check "shards holding rows of different dimensions: the ERROR of the read here" \
  "2 1" "$(echo "$out" | grep -o 'ERROR:  dimension mismatch: query id [0-9]* has 16 dimensions, expected 8' | wc -l) $(echo "$out" | grep -o 'ERROR:  dimension mismatch: [a-z]* id [0-9]*' | sort -u | wc -l)"
sql 2 -c "UPDATE items_x_1 SET u = v"
# ids that repeat across the shards: joined here with a NOTICE, the same rows as before
dup=$(sql 1 -c "SELECT min(id) FROM items_x_0")
sql 2 -c "INSERT INTO items_x_1 VALUES ($dup, '[1,1,1,1,1,1,1,1]', '[1,1,1,1,1,1,1,1]', B'111111111111')"
out=$(as_today x "knn_join('$XV', '$XV', 5, 'l2')")
check "ids repeating across the shards: the same rows as before" "0 differences, true;" "$(echo "$out" | grep -o '[0-9]* differences, [a-z]*;')"
check_has "... joined here with a NOTICE" "query ids repeat" \
  "$(sql 0 -c "SELECT count(*) FROM knn_join('$XV', '$XV', 5, 'l2')" 2>&1)"
sql 2 -c "DELETE FROM items_x_1 WHERE id = $dup"
# ... the same rows in the same order as the coordinator's own read (in partition order: the
# row of items_x_1 before that of items_x_2; shard 1, which holds items_x_2, sends its rows first)
dup=$(sql 1 -c "SELECT min(id) FROM items_x_2")
sql 2 -c "INSERT INTO items_x_1 VALUES ($dup, '[1,1,1,1,1,1,1,1]', '[1,1,1,1,1,1,1,1]', B'111111111111')"
check "ids repeating across the shards: the rows in the order of the coordinator's own read" \
  "$(sql 0 -c "SET knn_gpu.shard_prefetch = off" -c "SELECT * FROM knn_join('$XV', '$XV', 3, 'l1')" 2>&1 | md5sum)" \
  "$(sql 0 -c "SELECT * FROM knn_join('$XV', '$XV', 3, 'l1')" 2>&1 | md5sum)"
sql 2 -c "DELETE FROM items_x_1 WHERE id = $dup"
# a forged halfvec block: an ERROR naming the shard
HALF_INF_BLOCKS="SELECT overlay(b placing '\\x7c00'::bytea from length(b) - 1) FROM knn_shard_held_target_blocks_real(s) b"
out=$(PGOPTIONS="-c knn_gpu.shard_relay=off" forged_blocks_on_shard2 "$HALF_INF_BLOCKS" \
  "knn_join('SELECT id, h FROM items_s', 'SELECT id, h FROM items_s', 3)")
check_has "a shard sending a non-finite halfvec, not relayed: an ERROR" 'sent a malformed block of held rows: a value the type does not allow' "$out"
check_has "... naming it" 'foreign server "shard2"' "$out"
out=$(forged_blocks_on_shard2 "$HALF_INF_BLOCKS" "knn_join('SELECT id, h FROM items_s', 'SELECT id, h FROM items_s', 3)")
check_has "... relayed: the ERROR of the shard it went to, naming the sender" 'rows sent by foreign server "shard2", relayed to it unchanged' "$out"
check_has "a shard sending more rows than it read: an ERROR naming it" 'foreign server "shard2" sent more held rows, not the' \
  "$(forged_blocks_on_shard2 "SELECT b FROM knn_shard_held_target_blocks_real(s) b UNION ALL SELECT b FROM knn_shard_held_target_blocks_real(s) b")"
# each block is read as it arrives, not after the shard's whole answer: a malformed first
# block is refused at once while the shard still sends (its real blocks, which push the first
# one's end out of its send buffer, then 5 s of sleep before its end)
start=$(date +%s%N)
out=$(forged_blocks_on_shard2 "SELECT x FROM (SELECT substr(b, 1, length(b) - 1) AS x FROM knn_shard_held_target_blocks_real(s) b LIMIT 1) f
  UNION ALL SELECT b FROM knn_shard_held_target_blocks_real(s) b UNION ALL SELECT NULL::bytea FROM pg_sleep(5)")
ms=$(( ($(date +%s%N) - start) / 1000000 ))
check_has "a malformed first block refused as it arrives, the shard still sending" 'sent a malformed block of held rows' "$out"
[ "$ms" -lt 3000 ] && pass "... at once (${ms} ms)" || fail "... only after the shard's whole answer (${ms} ms)"
check "... and the shard stopped" 0 "$(active_on_shards)"
# an error on the shard in the middle of its blocks: its ERROR, its server named, nothing left held
out=$(forged_blocks_on_shard2 "SELECT b FROM knn_shard_held_target_blocks_real(s) b UNION ALL SELECT b FROM knn_shard_held_target_blocks_real(s) b WHERE 1 / (length(b) - length(b)) = 1")
check_has "an error on the shard while it sends its blocks: its ERROR" 'ERROR:  division by zero' "$out"
check_has "... naming it" 'knn_join on foreign server "shard2"' "$out"
check "... nothing held on the shards, nothing running there, the session goes on" "$(printf 'left:0\nleft:0\nagain:true')" \
  "$(sql 0 -c "SELECT 'left:' || count(*) FROM shard1_contexts WHERE name IN ('knn_gpu received queries', 'knn_gpu prefetched targets')" \
     -c "SELECT 'left:' || count(*) FROM shard2_contexts WHERE name IN ('knn_gpu received queries', 'knn_gpu prefetched targets')" \
     -c "SELECT 'again:' || (count(*) > 0) FROM knn_join('$SV', '$SV', 3)" 2>&1)"
check "... and the shards stopped" 0 "$(active_on_shards)"
# the memory of the coordinator: the held rows are decoded as they arrive, not
# held whole in libpq first (that was half as much again as the query set)
for i in 1 2; do
  sql "$i" -c "CREATE TABLE wide_$i (id bigint, v vector(16000))" \
    -c "INSERT INTO wide_$i SELECT i, (SELECT array_agg(random()::real) FROM generate_series(1, 16000) WHERE i > 0)::vector FROM generate_series($i, 1000, 2) i"
done
sql 0 -c "CREATE TABLE wide (id bigint, v vector(16000)) PARTITION BY HASH (id)" \
  -c "CREATE FOREIGN TABLE wide_1 PARTITION OF wide FOR VALUES WITH (MODULUS 2, REMAINDER 0) SERVER shard1 OPTIONS (table_name 'wide_1')" \
  -c "CREATE FOREIGN TABLE wide_2 PARTITION OF wide FOR VALUES WITH (MODULUS 2, REMAINDER 1) SERVER shard2 OPTIONS (table_name 'wide_2')" >/dev/null
out=$(sql 0 2>&1 <<'EOF'
-- (the libraries loaded, the connections and their buffers made: only the rows count)
SELECT count(*) FROM knn_join('SELECT id, v FROM wide WHERE id <= 40', 'SELECT id, v FROM wide WHERE id <= 40', 1);
CREATE TEMP TABLE hwm AS SELECT (regexp_match(pg_read_file('/proc/self/status'), 'VmHWM:\s*(\d+) kB'))[1]::bigint AS kb;
SELECT 'rows:' || count(*) FROM knn_join('SELECT id, v FROM wide', 'SELECT id, v FROM wide', 1, 'l2', false, 'brute');
SELECT 'from:' || (knn_gpu_last_shard_stats()->>'queries_from_shards');
SELECT 'grew:' || ((regexp_match(pg_read_file('/proc/self/status'), 'VmHWM:\s*(\d+) kB'))[1]::bigint - kb) FROM hwm;
EOF
)
grew=$(echo "$out" | sed -n 's/^grew://p')
check "a 1000 x 16000 self-join from the shards" "$(printf 'rows:1000\nfrom:true')" "$(echo "$out" | grep -E '^(rows|from):')"
check "... the coordinator's peak memory grew by ${grew:-?} kB for 62500 kB of queries (less than 1.25 times)" t \
  "$([ -n "$grew" ] && [ "$grew" -lt 78125 ] && echo t || echo f)"
# a timeout while the shards read, send their rows back (decoded as they arrive) or take the queries
timeouts_at "the wide self-join from the shards" \
  "SELECT count(*) FROM knn_join('SELECT id, v FROM wide', 'SELECT id, v FROM wide', 1, 'l2', false, 'brute')" 40 80 120 160 200 240 280
check "the shards stopped working" 0 "$(active_on_shards)"

echo "shard tests: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
