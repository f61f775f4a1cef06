#!/usr/bin/env bash
# Isolation specs (tests/isolation/{specs,expected}): the GC protocol's
# races driven step by step across real sessions by PostgreSQL's
# isolationtester (pg_isolation_regress), against the running test cluster
# (scripts/pg-cluster.sh start). Each spec's permutations interleave a
# writer (at READ COMMITTED, REPEATABLE READ and SERIALIZABLE) with a sweep
# and end with a query that says whether the protected key survived.
# Prints an "isolation: N passed, N failed" line and exits non-zero on any
# failure.
#   ALKBLOBS_PG_PORT      the cluster's port (default 54329)
#   ALKBLOBS_PG_MAJOR     its major (default 15; scripts/postgres.sh finds
#                         that major's pg_config, pg_isolation_regress, psql)
#   ALKBLOBS_ISOLATION_ACCEPT=1 scripts/isolation.sh   rewrites expected/ from the run
#   scripts/isolation.sh pin_vs_sweep ...              runs only the specs named
set -euo pipefail
cd "$(dirname "$0")/.."
port=${ALKBLOBS_PG_PORT:-54329}
pg_config=$(scripts/postgres.sh pg-config "${ALKBLOBS_PG_MAJOR:-15}")
bindir=$("$pg_config" --bindir)
pg_isolation_regress="$("$pg_config" --pkglibdir)/pgxs/src/test/isolation/pg_isolation_regress"
if [ ! -x "$pg_isolation_regress" ]; then
    echo "no pg_isolation_regress at $pg_isolation_regress (Debian's postgresql-server-dev-N ships it; scripts/postgres.sh builds it)" >&2
    exit 2
fi
psql="$bindir/psql"
out=target/isolation-${ALKBLOBS_PG_MAJOR:-15}
rm -rf "$out" && mkdir -p "$out"
if [ $# -gt 0 ]; then
    tests="$*"
else
    tests=$(cd tests/isolation/specs && ls *.spec | sed 's/\.spec$//' | sort)
fi
mkdir -p tests/isolation/expected
# A fresh database with the extension really created. The specs' sessions
# connect to it; no scheduler serves it (alkblobs.scheduler_databases names
# other databases), so nothing sweeps behind a spec's back.
"$psql" -X -q -h 127.0.0.1 -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1 \
    -c "DROP DATABASE IF EXISTS alkblobs_isolation" -c "CREATE DATABASE alkblobs_isolation"
"$psql" -X -q -h 127.0.0.1 -p "$port" -U postgres -d alkblobs_isolation -v ON_ERROR_STOP=1 \
    -c "CREATE EXTENSION alkblobs"
set +e
# (isolationtester is found beside pg_isolation_regress; --bindir is psql's.)
"$pg_isolation_regress" --use-existing --host=127.0.0.1 --port="$port" --user=postgres \
    --dbname=alkblobs_isolation --bindir="$bindir" \
    --inputdir=tests/isolation --outputdir="$out" $tests > "$out/summary.txt" 2>&1
status=$?
set -e
if [ "${ALKBLOBS_ISOLATION_ACCEPT:-0}" = 1 ]; then
    for t in $tests; do
        if [ -s "$out/results/$t.out" ]; then
            cp "$out/results/$t.out" tests/isolation/expected/
        fi
    done
fi
passed=0; failed=0
for t in $tests; do
    if [ -s "$out/results/$t.out" ] && [ -f "tests/isolation/expected/$t.out" ] \
        && diff -q "tests/isolation/expected/$t.out" "$out/results/$t.out" >/dev/null 2>&1; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        echo "FAILED: $t"
        if [ -s "$out/results/$t.out" ]; then
            diff -u "tests/isolation/expected/$t.out" "$out/results/$t.out" 2>&1 | head -60 || true
        else
            echo "  (no output: see $out/summary.txt)"
            tail -n 20 "$out/summary.txt" || true
        fi
    fi
done
echo "isolation: $passed passed, $failed failed"
[ "$failed" = 0 ] && [ "$status" = 0 -o "${ALKBLOBS_ISOLATION_ACCEPT:-0}" = 1 ]
