#!/usr/bin/env bash
# Golden tests against the running test cluster (scripts/pg-cluster.sh
# start), with the tools of its major:
#   scripts/golden.sh regress [TEST...]     tests/regress/{sql,expected} by
#       pg_regress: the SQL API's answers, errors and privileges
#   scripts/golden.sh isolation [SPEC...]   tests/isolation/{specs,expected}
#       by pg_isolation_regress: the GC protocol's races driven step by
#       step across real sessions by PostgreSQL's isolationtester, each
#       permutation a writer (at READ COMMITTED, REPEATABLE READ and
#       SERIALIZABLE) against a sweep, ending with a query that says
#       whether the protected key survived
# (scripts/regress.sh and scripts/isolation.sh are these two.) Each runs in
# a fresh database with the extension really created, prints a
# "KIND: N passed, N failed" line and exits non-zero on any failure.
#   ALKBLOBS_PG_PORT      the cluster's port (default 54329)
#   ALKBLOBS_PG_MAJOR     its major (default 15; scripts/postgres.sh finds
#                         that major's pg_config, pg_regress,
#                         pg_isolation_regress and psql)
#   ALKBLOBS_REGRESS_ACCEPT=1, ALKBLOBS_ISOLATION_ACCEPT=1
#                         rewrite expected/ from the run
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:-}
shift || true
case "$kind" in
regress)
    dir=tests/regress inputs=sql ext=sql tool=regress/pg_regress accept=${ALKBLOBS_REGRESS_ACCEPT:-0} ;;
isolation)
    dir=tests/isolation inputs=specs ext=spec tool=isolation/pg_isolation_regress accept=${ALKBLOBS_ISOLATION_ACCEPT:-0} ;;
*)
    echo "usage: $0 regress|isolation [NAME...]" >&2
    exit 2 ;;
esac
port=${ALKBLOBS_PG_PORT:-54329}
major=${ALKBLOBS_PG_MAJOR:-15}
pg_config=$(scripts/postgres.sh pg-config "$major")
bindir=$("$pg_config" --bindir)
runner="$("$pg_config" --pkglibdir)/pgxs/src/test/$tool"
if [ ! -x "$runner" ]; then
    echo "no $(basename "$runner") at $runner (Debian's postgresql-server-dev-$major ships it; scripts/postgres.sh builds it)" >&2
    exit 2
fi
psql="$bindir/psql"
out=target/$kind-$major
rm -rf "$out" && mkdir -p "$out" "$dir/expected"
if [ $# -gt 0 ]; then
    tests="$*"
else
    tests=$(cd "$dir/$inputs" && ls ./*."$ext" | sed "s|^\./||; s/\.$ext\$//" | sort)
fi
# A fresh database with the extension really created. (No scheduler
# serves it: alkblobs.scheduler_databases names other databases, so
# nothing sweeps behind a spec's back.)
db=alkblobs_$kind
"$psql" -X -q -h 127.0.0.1 -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1 \
    -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db"
"$psql" -X -q -h 127.0.0.1 -p "$port" -U postgres -d "$db" -v ON_ERROR_STOP=1 -c "CREATE EXTENSION alkblobs"
set +e
# (isolationtester is found beside pg_isolation_regress; --bindir is psql's.)
# shellcheck disable=SC2086
"$runner" --use-existing --bindir="$bindir" --host=127.0.0.1 --port="$port" --user=postgres \
    --dbname="$db" --inputdir="$dir" --outputdir="$out" $tests > "$out/summary.txt" 2>&1
status=$?
set -e
passed=0; failed=0
for t in $tests; do
    if [ "$accept" = 1 ] && [ -s "$out/results/$t.out" ]; then
        cp "$out/results/$t.out" "$dir/expected/"
    fi
    if [ -s "$out/results/$t.out" ] && [ -f "$dir/expected/$t.out" ] \
        && diff -q "$dir/expected/$t.out" "$out/results/$t.out" >/dev/null 2>&1; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        echo "FAILED: $t"
        if [ -s "$out/results/$t.out" ]; then
            diff -u "$dir/expected/$t.out" "$out/results/$t.out" 2>&1 | head -60 || true
        else
            echo "  (no output: see $out/summary.txt)"
            tail -n 20 "$out/summary.txt" || true
        fi
    fi
done
echo "$kind: $passed passed, $failed failed"
[ "$failed" = 0 ] && [ "$status" = 0 -o "$accept" = 1 ]
