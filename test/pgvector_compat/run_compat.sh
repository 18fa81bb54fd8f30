#!/usr/bin/env bash
# pgvector's own regression files (vector_type, cast, btree by default)
# against a database with knn_gpu alone; see run_compat.py. Connects with
# PGHOST/PGPORT/PGUSER; skips with a message without ../shared/pgvector.
#   test/pgvector_compat/run_compat.sh [-v] [vector_type cast btree ...]
exec python3 "$(dirname "$0")/run_compat.py" "$@"
