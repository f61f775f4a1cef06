#!/usr/bin/env bash
# A cluster made like a managed PostgreSQL, with the SQL-only install in it.
#   scripts/sql-only-cluster.sh start   (re)creates it and prints the env
#                                       lines the SQL-only tests read
#   scripts/sql-only-cluster.sh stop
# The cluster is scripts/pg-cluster.sh's ALKBLOBS_PG_PRELOAD=cron one on
# port 54331: pg_cron preloaded, the alkblobs library never loaded. What a
# managed service gives its admin role is set up by a superuser (the
# provider's part): a LOGIN CREATEROLE role `alkblobs_installer` owning the
# database, pg_cron created, its schema usable. Then the script of
# `scripts/package.sh sql-only`, generated afresh from sql/, is run with
# psql as alkblobs_installer, as a user of such a service runs it.
# scripts/test.sh and scripts/mutants.py both start it so.
set -euo pipefail
cd "$(dirname "$0")/.."
# ALKBLOBS_PG_MAJOR (default 15) picks the major. Only 15 gets pg_cron:
# Debian 12 packages it for 15 alone (postgresql-15-cron), so a 17 or 18
# cluster preloads nothing and the one pg_cron test is not run there
# (scripts/test.sh; docs/operations.md, "PostgreSQL majors").
major=${ALKBLOBS_PG_MAJOR:-15}
if [ "$major" = 15 ]; then cron=cron; else cron=0; fi
# ALKBLOBS_SQL_ONLY_PORT moves it off 54331 (a second one beside a test run).
port=${ALKBLOBS_SQL_ONLY_PORT:-54331}
cron_pg() { ALKBLOBS_PG_MAJOR=$major ALKBLOBS_PG_PRELOAD=$cron ALKBLOBS_PG_PORT=$port scripts/pg-cluster.sh "$@"; }
case "${1:-}" in
start)
    cron_pg stop >/dev/null 2>&1 || true
    managed=$(cron_pg start)
    sql_only=$(scripts/package.sh sql-only)
    psql -X -q "$managed" -v ON_ERROR_STOP=1 >&2 <<'SQL'
CREATE ROLE alkblobs_installer LOGIN CREATEROLE;
ALTER DATABASE alkblobs_test OWNER TO alkblobs_installer;
GRANT CREATE ON SCHEMA public TO PUBLIC;
SQL
    if [ "$cron" = cron ]; then
        psql -X -q "$managed" -v ON_ERROR_STOP=1 >&2 <<'SQL'
CREATE EXTENSION pg_cron;
GRANT USAGE ON SCHEMA cron TO alkblobs_installer, PUBLIC;
SQL
    fi
    psql -X -q "${managed/postgres@/alkblobs_installer@}" -v ON_ERROR_STOP=1 -f "$sql_only" >&2
    echo "SQL-only install ($sql_only) made in $managed by alkblobs_installer" >&2
    echo "ALKBLOBS_PG_URL=$managed"
    echo "ALKBLOBS_PG_CA=$(cron_pg ca)"
    echo "ALKBLOBS_PG_FLAVOUR=sql-only"
    echo "ALKBLOBS_SQL_ONLY_SCRIPT=$sql_only"
    # The client programs of the cluster's major (scripts/sql-only-backup.py).
    echo "ALKBLOBS_PG_BIN=$(scripts/postgres.sh bindir "$major")"
    ;;
stop)
    cron_pg stop
    ;;
*)
    echo "usage: $0 start|stop" >&2
    exit 2
    ;;
esac
