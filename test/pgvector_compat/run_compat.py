#!/usr/bin/env python3
"""
run_compat.py -- pgvector's own regression files against knn_gpu alone.

Runs pgvector's test/sql/NAME.sql (from the source snapshot in
../shared/pgvector/) in a fresh database where only knn_gpu is installed,
as pg_regress would (psql -X -a -q, the file on standard input), and
compares the output with pgvector's test/expected/NAME.out statement by
statement: each statement's echo plus everything psql printed for it.
Prints, per file, "N of M statements match" and the statements that do
not; statements that build an index with pgvector's access methods (hnsw,
ivfflat) are not counted (knn_gpu is an index-free join engine) and are
listed on their own. A file passes when every counted statement matches;
the last line counts files: "pgvector compat: N files passed, M failed"
(scripts/test.sh reads it).

Each file runs in a database of its own (knn_pgvector_compat_NAME_PID, from
template0, knn_gpu the only extension), dropped afterwards even after an
error or SIGTERM; a database that could not be dropped fails its file.

Usage: run_compat.py [--verbose] [--strict] [NAME ...]
  (default NAMEs: the seven files of issue 14, vector_type cast copy btree
  halfvec bit sparsevec; any file of pgvector's test/sql works)
Connection: the usual PGHOST/PGPORT/PGUSER environment; psql is
$PG_BIN/psql when PG_BIN is set, else the one on PATH; PGVECTOR_DIR
overrides ../shared/pgvector. Exit status 0 when the run completed
(mismatches are reported, not failed; with --strict, 2 when a file does
not pass), 1 when the server cannot be reached; without
../shared/pgvector it prints why and exits 0 (skipped).
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import tarfile
import tempfile

DEFAULT_FILES = ["vector_type", "cast", "copy", "btree", "halfvec", "bit", "sparsevec"]
INDEX_STATEMENT = re.compile(r"\busing\s+(hnsw|ivfflat)\b", re.IGNORECASE)


PSQL = os.path.join(os.environ["PG_BIN"], "psql") if os.environ.get("PG_BIN") else "psql"


class SetupError(Exception):
    pass


def pgvector_dir():
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.normpath(os.path.join(here, "..", "..", "..", "shared", "pgvector"))


def source_tree(shared, workdir):
    """The snapshot's root directory (the tarball unpacked into workdir)."""
    tarball = os.path.join(shared, "pgvector-src.tar.gz")
    if os.path.isdir(os.path.join(shared, "test", "sql")):
        return shared
    if not os.path.isfile(tarball):
        return None
    with tarfile.open(tarball) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(workdir, filter="data")  # no links or paths out of workdir
        else:
            tar.extractall(workdir)
    for root, dirs, _ in os.walk(workdir):
        if os.path.isdir(os.path.join(root, "test", "sql")) and os.path.isdir(os.path.join(root, "test", "expected")):
            return root
    return None


def statements(sql_lines):
    """(first line, last line) index pairs of each statement: lines up to
    one ending in ';' outside a comment, or a psql meta-command line."""
    result, start = [], None
    for i, line in enumerate(sql_lines):
        text = line.strip()
        if start is None:
            if not text or text.startswith("--"):
                continue
            start = i
        if text.startswith("\\") and start == i:
            result.append((start, i))
            start = None
        elif re.sub(r"--.*$", "", text).rstrip().endswith(";"):
            result.append((start, i))
            start = None
    if start is not None:
        result.append((start, len(sql_lines) - 1))
    return result


def split_output(sql_lines, stmts, out_lines):
    """Each statement's output, from a psql -a transcript: the echoed input
    lines (blank ones excepted) delimit it. The output of a statement ends
    where the echo of the following input line begins."""
    chunks = []
    p = 0
    cursor = 0  # next sql line to be echoed
    for n, (first, last) in enumerate(stmts):
        # the echo of the lines before and of the statement itself
        for i in range(cursor, last + 1):
            if p < len(out_lines) and out_lines[p] == sql_lines[i]:
                p += 1
            else:
                return None  # transcript out of step with the file
        cursor = last + 1
        # where the next echo starts
        follow = sql_lines[cursor:cursor + 1]
        if not follow:
            end = len(out_lines)
        else:
            end = None
            for q in range(p, len(out_lines) - len(follow) + 1):
                if out_lines[q:q + len(follow)] == follow:
                    end = q
                    break
            if end is None:
                return None
        chunks.append(out_lines[p:end])
        p = end
    return chunks


def psql(args, stdin=None, check=True, cwd=None):
    """psql's standard output and error in one stream, as pg_regress has them."""
    env = dict(os.environ, LC_ALL="C", LC_MESSAGES="C", PGTZ="PST8PDT", PGDATESTYLE="Postgres, MDY")
    return subprocess.run([PSQL, "-X"] + args, input=stdin, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, env=env, check=check, cwd=cwd)


def drop_database(db):
    """Drops db (closing any session left in it); SetupError if it remains."""
    psql(["-d", "postgres", "-q", "-c", 'DROP DATABASE IF EXISTS "%s" WITH (FORCE)' % db], check=False)
    left = psql(["-d", "postgres", "-At", "-c", "SELECT count(*) FROM pg_database WHERE datname = '%s'" % db],
                check=False).stdout.strip()
    if left != "0":
        raise SetupError("database %s could not be dropped" % db)


def run_file(name, tree, workdir, verbose):
    """Runs and compares one file; True when every counted statement matched."""
    sql_path = os.path.join(tree, "test", "sql", name + ".sql")
    out_path = os.path.join(tree, "test", "expected", name + ".out")
    if not (os.path.isfile(sql_path) and os.path.isfile(out_path)):
        raise SetupError("not in the snapshot")
    with open(sql_path) as f:
        sql_text = f.read()
    with open(out_path) as f:
        expected = f.read().split("\n")
    # psql -a echoes every input line but blank ones
    numbered = [(n + 1, l) for n, l in enumerate(sql_text.split("\n")) if l.strip()]
    line_number = [n for n, _ in numbered]
    sql_lines = [l for _, l in numbered]

    db = "knn_pgvector_compat_%s_%d" % (name, os.getpid())
    psql(["-d", "postgres", "-q", "-c", 'CREATE DATABASE "%s" TEMPLATE template0' % db])
    try:
        # the settings pg_regress gives its databases
        psql(["-d", "postgres", "-q", "-c",
              'ALTER DATABASE "%s" SET lc_messages TO \'C\'; ALTER DATABASE "%s" SET lc_monetary TO \'C\'; '
              'ALTER DATABASE "%s" SET lc_numeric TO \'C\'; ALTER DATABASE "%s" SET lc_time TO \'C\'; '
              'ALTER DATABASE "%s" SET bytea_output TO \'hex\'; '
              'ALTER DATABASE "%s" SET timezone_abbreviations TO \'Default\'' % ((db,) * 6)])
        psql(["-d", db, "-q", "-v", "ON_ERROR_STOP=1", "-c", "SET client_min_messages = error", "-c", "CREATE EXTENSION knn_gpu"])
        others = psql(["-d", db, "-At", "-c",
                       "SELECT string_agg(extname, ', ') FROM pg_extension WHERE extname NOT IN ('plpgsql', 'knn_gpu')"]).stdout.strip()
        if others:
            raise SetupError("%s holds other extensions (%s); this test needs knn_gpu alone" % (db, others))
        # files the tests write (\copy ... TO 'results/...') go to a scratch directory
        scratch = os.path.join(workdir, "run_" + name)
        os.makedirs(os.path.join(scratch, "results"), exist_ok=True)
        actual = psql(["-d", db, "-a", "-q"], stdin=sql_text, check=False, cwd=scratch).stdout.split("\n")
    finally:
        drop_database(db)

    stmts = statements(sql_lines)
    want = split_output(sql_lines, stmts, expected)
    got = split_output(sql_lines, stmts, actual)
    if want is None:
        raise SetupError("cannot split pgvector's expected output by statement")
    if got is None:
        raise SetupError("cannot split knn_gpu's output by statement; psql said:\n" + "\n".join(actual[:40]))

    counted = matched = 0
    failing, index_statements = [], []
    for (first, last), w, g in zip(stmts, want, got):
        text = "\n".join(sql_lines[first:last + 1])
        if INDEX_STATEMENT.search(text):
            index_statements.append((line_number[first], text))
            continue
        counted += 1
        if w == g:
            matched += 1
        else:
            failing.append((line_number[first], text, w, g))

    print("%s: %d of %d statements match%s" % (name, matched, counted, "; %d index statements not counted" %
                                               len(index_statements) if index_statements else ""))
    for line, text, w, g in failing:
        print("  line %d: %s" % (line, text.replace("\n", " ")))
        if verbose:
            for l in w:
                print("      expected| " + l)
            for l in g:
                print("      knn_gpu | " + l)
    for line, text in index_statements:
        print("  index statement, not counted (line %d): %s" % (line, text.replace("\n", " ")))
    return not failing


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verbose", "-v", action="store_true", help="show expected and actual output of each mismatch")
    parser.add_argument("--strict", action="store_true", help="exit 2 when a file does not pass")
    parser.add_argument("files", nargs="*", default=DEFAULT_FILES)
    args = parser.parse_args()

    shared = os.environ.get("PGVECTOR_DIR", pgvector_dir())
    if not os.path.isdir(shared):
        print("pgvector compat: skipped, %s is absent (pgvector's source snapshot)" % shared)
        return 0
    # a SIGTERM (a CI timeout) unwinds like an exception, so the finally
    # blocks drop the databases and remove the scratch directory
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: sys.exit(128 + signum))
    reachable = psql(["-d", "postgres", "-At", "-c", "SELECT 1"], check=False)
    if reachable.returncode != 0:
        print("pgvector compat: cannot connect to the server: %s" % reachable.stdout.strip())
        return 1
    with tempfile.TemporaryDirectory() as workdir:
        tree = source_tree(shared, workdir)
        if tree is None:
            print("pgvector compat: skipped, no test/sql and test/expected in %s" % shared)
            return 0
        passed, failed = [], []
        for name in args.files:
            try:
                ok = run_file(name, tree, workdir, args.verbose)
            except subprocess.CalledProcessError as e:
                print("%s: FAILED, setup: %s\n%s" % (name, " ".join(e.cmd), e.stdout or ""))
                ok = False
            except SetupError as e:
                print("%s: FAILED, %s" % (name, e))
                ok = False
            (passed if ok else failed).append(name)
    print("pgvector compat: %d files passed, %d failed%s" %
          (len(passed), len(failed), " (%s)" % " ".join(failed) if failed else ""))
    return 2 if args.strict and failed else 0


if __name__ == "__main__":
    sys.exit(main())
