#!/usr/bin/env bash
# Golden SQL tests (tests/regress/{sql,expected}) with pg_regress against
# the running test cluster (scripts/pg-cluster.sh start), PostgreSQL 15's
# or ALKBLOBS_PG_MAJOR's (its pg_regress and psql). Prints an
# "N passed, N failed" line and exits non-zero on any failure.
#   ALKBLOBS_REGRESS_ACCEPT=1 scripts/regress.sh   rewrites expected/ from the run
set -euo pipefail
cd "$(dirname "$0")/.."
port=${ALKBLOBS_PG_PORT:-54329}
pg_config=$(scripts/postgres.sh pg-config "${ALKBLOBS_PG_MAJOR:-15}")
pg_regress="$("$pg_config" --pkglibdir)/pgxs/src/test/regress/pg_regress"
bindir=$("$pg_config" --bindir)
psql() { "$bindir/psql" "$@"; }
out=target/regress-${ALKBLOBS_PG_MAJOR:-15}
rm -rf "$out" && mkdir -p "$out"
tests=$(cd tests/regress/sql && ls *.sql | sed 's/\.sql$//' | sort)
mkdir -p tests/regress/expected
# A fresh database with the extension really created.
psql -X -q -h 127.0.0.1 -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1 \
    -c "DROP DATABASE IF EXISTS alkblobs_regress" -c "CREATE DATABASE alkblobs_regress"
psql -X -q -h 127.0.0.1 -p "$port" -U postgres -d alkblobs_regress -v ON_ERROR_STOP=1 -c "CREATE EXTENSION alkblobs"
set +e
"$pg_regress" --use-existing --bindir="$bindir" --host=127.0.0.1 --port="$port" --user=postgres \
    --dbname=alkblobs_regress \
    --inputdir=tests/regress --outputdir="$out" $tests > "$out/summary.txt" 2>&1
status=$?
set -e
if [ "${ALKBLOBS_REGRESS_ACCEPT:-0}" = 1 ]; then
    cp "$out"/results/*.out tests/regress/expected/
fi
passed=0; failed=0
for t in $tests; do
    if [ -s "$out/results/$t.out" ] && [ -f "tests/regress/expected/$t.out" ] && diff -q "tests/regress/expected/$t.out" "$out/results/$t.out" >/dev/null 2>&1; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        echo "FAILED: $t"
        diff -u "tests/regress/expected/$t.out" "$out/results/$t.out" 2>&1 | head -40 || true
    fi
done
echo "regress: $passed passed, $failed failed"
[ "$failed" = 0 ] && [ "$status" = 0 -o "${ALKBLOBS_REGRESS_ACCEPT:-0}" = 1 ]
