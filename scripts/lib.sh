# lib.sh -- shared by demo.sh and test.sh: install what the build needs,
# build and install the extension, and run a throw-away PostgreSQL cluster.
# Sourced, not run.

KNN_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# PostgreSQL 15 server + headers, a compiler, GoogleTest and OpenBLAS, from apt.
knn_install_prerequisites() {
  local missing=()
  [ -x "$PG_BIN/postgres" ] || missing+=(postgresql-15)
  [ -f /usr/include/postgresql/15/server/postgres.h ] || missing+=(postgresql-server-dev-15)
  command -v g++ >/dev/null || missing+=(g++)
  command -v make >/dev/null || missing+=(make)
  [ -f /usr/lib/x86_64-linux-gnu/libgtest.a ] || [ -f /usr/lib/aarch64-linux-gnu/libgtest.a ] || missing+=(libgtest-dev)
  command -v xz >/dev/null || missing+=(xz-utils)
  command -v python3 >/dev/null || missing+=(python3)   # test/pgvector_compat
  # The CPU engine's SGEMM brute force (loaded at run time; optional).
  ls /usr/lib/*/libopenblas.so.0 >/dev/null 2>&1 || missing+=(libopenblas0-pthread)
  if [ ${#missing[@]} -gt 0 ]; then
    echo "== installing ${missing[*]}"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

knn_build_and_install() {
  echo "== building (CUDA=${CUDA:-auto})"
  make -C "$KNN_ROOT" -j"$(nproc)" PG_CONFIG="$PG_BIN/pg_config" ${CUDA:+CUDA=$CUDA} >/dev/null
  echo "== installing into $("$PG_BIN/pg_config" --pkglibdir)"
  as_root make -C "$KNN_ROOT" install PG_CONFIG="$PG_BIN/pg_config" ${CUDA:+CUDA=$CUDA} >/dev/null
}

# Starts a throw-away cluster in $1 on port $2 and exports PGHOST/PGPORT/PGUSER.
# The server runs as the invoking user, or as 'postgres' when that is root.
KNN_CLUSTER_OWNER=$(id -un)
[ "$(id -u)" = 0 ] && KNN_CLUSTER_OWNER=postgres

# Runs a shell command line as the cluster's owner.
knn_as_owner() {
  if [ "$(id -u)" = 0 ]; then su "$KNN_CLUSTER_OWNER" -s /bin/bash -c "$1"; else bash -c "$1"; fi
}

knn_cluster_start() {
  local dir=$1 port=$2
  rm -rf "$dir"; mkdir -p "$dir"
  [ "$(id -u)" = 0 ] && chown "$KNN_CLUSTER_OWNER" "$dir"
  knn_as_owner "'$PG_BIN/initdb' -D '$dir/data' -U postgres -A trust >'$dir/initdb.log' 2>&1" \
    || { cat "$dir/initdb.log"; return 1; }
  knn_as_owner "'$PG_BIN/pg_ctl' -D '$dir/data' -l '$dir/server.log' -w -o \"-p $port -k '$dir' -c listen_addresses='' -c fsync=off ${PG_SETTINGS:-}\" start" >/dev/null \
    || { tail -20 "$dir/server.log"; return 1; }
  export PGHOST=$dir PGPORT=$port PGUSER=postgres PGDATABASE=postgres
  KNN_CLUSTER_DIR=$dir
  trap knn_cluster_stop EXIT
}

knn_cluster_stop() {
  [ -n "${KNN_CLUSTER_DIR:-}" ] || return 0
  knn_as_owner "'$PG_BIN/pg_ctl' -D '$KNN_CLUSTER_DIR/data' -m fast stop" >/dev/null 2>&1
  KNN_CLUSTER_DIR=
}
