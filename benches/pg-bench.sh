#!/usr/bin/env bash
# Runs the PostgreSQL benchmarks on the private cluster: installs the
# extension, starts the cluster, runs benches/benches/pg.rs, stops it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-extension.sh >/dev/null
url=$(scripts/pg-cluster.sh start)
trap 'scripts/pg-cluster.sh stop >/dev/null 2>&1 || true' EXIT
psql -X -q "$url" -c "CREATE EXTENSION IF NOT EXISTS alkblobs"
# benches/pg-bench.sh            the extension's sweep and put (benches/pg.rs)
# benches/pg-bench.sh pg_engines the client's postgres and pg-lo engines
# benches/pg-bench.sh pg_fleet   fleet mode: put, renewal, 8 processes
# benches/pg-bench.sh pg_queue   the review queue: write path, 10M-entry audit vs one cycle
ALKBLOBS_PG_URL="$url" cargo bench -p alkblobs-benches --bench "${1:-pg}"
