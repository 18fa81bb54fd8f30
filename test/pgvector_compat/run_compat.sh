#!/usr/bin/env bash
# pgvector's own regression files (by default the seven of issue 14)
# against a database with knn_gpu alone; see run_compat.py. Connects with
# PGHOST/PGPORT/PGUSER; skips with a message without ../shared/pgvector.
#   test/pgvector_compat/run_compat.sh [-v] [--strict] [vector_type cast ...]
exec python3 "$(dirname "$0")/run_compat.py" "$@"
