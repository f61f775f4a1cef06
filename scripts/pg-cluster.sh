#!/usr/bin/env bash
# A private, throwaway PostgreSQL 15 cluster for the tests.
#   scripts/pg-cluster.sh start   initdb (if needed) + start; prints the URL
#   scripts/pg-cluster.sh stop    stop and delete it
#   scripts/pg-cluster.sh url     print the connection URL
# PostgreSQL refuses to run as root, so as root the cluster belongs to the
# `postgres` user. It listens on 127.0.0.1:$ALKBLOBS_PG_PORT (default 54329)
# and a private socket directory, with trust auth on loopback only.
set -euo pipefail
port=${ALKBLOBS_PG_PORT:-54329}
base=${ALKBLOBS_PG_DIR:-/tmp/alkblobs-pg-$port}
bindir=$(/usr/lib/postgresql/15/bin/pg_config --bindir 2>/dev/null || echo /usr/lib/postgresql/15/bin)
data="$base/data"
sock="$base/sock"
db=${ALKBLOBS_PG_DB:-alkblobs_test}
url="postgresql://postgres@127.0.0.1:$port/$db"

as_pg() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

case "${1:-}" in
start)
    mkdir -p "$base"
    [ "$(id -u)" = 0 ] && chown postgres:postgres "$base"
    if [ ! -f "$data/PG_VERSION" ]; then
        as_pg "$bindir/initdb" -D "$data" -U postgres --auth=trust --no-sync -E UTF8 --locale=C >/dev/null
        as_pg mkdir -p "$sock"
        cat >> "$data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$sock'
fsync = on
max_connections = 100
max_locks_per_transaction = 64
log_min_messages = warning
CONF
        # Trust on loopback and the private socket only.
        cat > "$data/pg_hba.conf" <<HBA
local all all trust
host all all 127.0.0.1/32 trust
HBA
    fi
    if ! as_pg "$bindir/pg_ctl" -D "$data" status >/dev/null 2>&1; then
        as_pg "$bindir/pg_ctl" -D "$data" -l "$base/server.log" -w -t 60 start >/dev/null
    fi
    "$bindir/psql" -h "$sock" -p "$port" -U postgres -d postgres -qtAc \
        "SELECT 1 FROM pg_database WHERE datname = '$db'" | grep -q 1 \
        || "$bindir/psql" -h "$sock" -p "$port" -U postgres -d postgres -qc "CREATE DATABASE $db"
    echo "$url"
    ;;
stop)
    if [ -f "$data/PG_VERSION" ]; then
        as_pg "$bindir/pg_ctl" -D "$data" -m fast -w stop >/dev/null 2>&1 || true
    fi
    rm -rf "$base"
    ;;
url)
    echo "$url"
    ;;
*)
    echo "usage: $0 start|stop|url" >&2
    exit 2
    ;;
esac
