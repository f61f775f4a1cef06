#!/usr/bin/env bash
# A transaction-mode pgbouncer in front of the private test cluster
# (scripts/pg-cluster.sh), for the suites that must work through a pooler.
#   scripts/pgbouncer.sh start   start it (installs Debian's pgbouncer if missing); prints the URL
#   scripts/pgbouncer.sh stop    stop it and delete its files
# Listens on 127.0.0.1:$ALKBLOBS_PGB_PORT (default 64329), trust auth for
# the postgres user only, pool_mode = transaction: a server connection is
# lent to a client for one transaction, so nothing that outlives a
# transaction on the server (session settings, named prepared statements,
# session advisory locks) may be relied on.
set -euo pipefail
pg_port=${ALKBLOBS_PG_PORT:-54329}
port=${ALKBLOBS_PGB_PORT:-64329}
dir=/tmp/alkblobs-pgb-$port
db=${ALKBLOBS_PG_DB:-alkblobs_test}

as_pg() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

case "${1:-}" in
start)
    if ! command -v pgbouncer >/dev/null 2>&1 && [ ! -x /usr/sbin/pgbouncer ]; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -q >/dev/null
        apt-get install -y -q pgbouncer >/dev/null
    fi
    bin=$(command -v pgbouncer || echo /usr/sbin/pgbouncer)
    mkdir -p "$dir"
    cat > "$dir/pgbouncer.ini" <<INI
[databases]
* = host=127.0.0.1 port=$pg_port

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = trust
auth_file = $dir/users.txt
pool_mode = transaction
max_client_conn = 400
default_pool_size = 20
ignore_startup_parameters = extra_float_digits,options
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
INI
    echo '"postgres" ""' > "$dir/users.txt"
    [ "$(id -u)" = 0 ] && chown -R postgres:postgres "$dir"
    if [ -f "$dir/pgbouncer.pid" ] && kill -0 "$(cat "$dir/pgbouncer.pid")" 2>/dev/null; then
        :
    else
        as_pg "$bin" -d "$dir/pgbouncer.ini"
        for _ in $(seq 50); do
            [ -f "$dir/pgbouncer.pid" ] && break
            sleep 0.1
        done
    fi
    echo "postgresql://postgres@127.0.0.1:$port/$db"
    ;;
stop)
    if [ -f "$dir/pgbouncer.pid" ]; then
        kill "$(cat "$dir/pgbouncer.pid")" 2>/dev/null || true
    fi
    rm -rf "$dir"
    ;;
*)
    echo "usage: $0 start|stop" >&2
    exit 2
    ;;
esac
