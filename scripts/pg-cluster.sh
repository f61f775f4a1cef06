#!/usr/bin/env bash
# A private, throwaway PostgreSQL cluster for the tests: PostgreSQL 15, or
# ALKBLOBS_PG_MAJOR's (scripts/postgres.sh finds or builds it).
#   scripts/pg-cluster.sh start   initdb (if needed) + start; prints the URL
#   scripts/pg-cluster.sh stop    stop and delete it
#   scripts/pg-cluster.sh url     print the connection URL
#   scripts/pg-cluster.sh restart stop (fast: every session dropped) and start it again
#   scripts/pg-cluster.sh down-for N  stop it, N seconds down, start it again
#   scripts/pg-cluster.sh restart-immediate  kill it (immediate shutdown) and start it again
#   scripts/pg-cluster.sh log     print the path of the server log
#   scripts/pg-cluster.sh ca      print the CA certificate that signed the
#                                 server's (TLS is on: sslmode=verify-full
#                                 with sslrootcert=<that file> works)
# PostgreSQL refuses to run as root, so as root the cluster belongs to the
# `postgres` user. It listens on 127.0.0.1:$ALKBLOBS_PG_PORT (default 54329)
# and a private socket directory, with trust auth on loopback only.
# ALKBLOBS_PG_PRELOAD=0 makes a cluster configured as a server nobody
# reconfigured: no shared_preload_libraries, no alkblobs.* settings (the
# test command runs one beside the preloading cluster, on port 54330);
# ALKBLOBS_PG_PRELOAD=cron one that preloads pg_cron and not alkblobs, as
# a managed service does (the SQL-only flavour's, on port 54331).
set -euo pipefail
preload=${ALKBLOBS_PG_PRELOAD:-1}
port=${ALKBLOBS_PG_PORT:-54329}
base=${ALKBLOBS_PG_DIR:-/tmp/alkblobs-pg-$port}
major=${ALKBLOBS_PG_MAJOR:-15}
bindir=$("$(dirname "$0")/postgres.sh" bindir "$major" 2>/dev/null) \
    || bindir=/usr/lib/postgresql/$major/bin  # the server without its headers
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
        # TLS: a throwaway CA and a server certificate for localhost and
        # 127.0.0.1 signed by it (clients verify with sslrootcert=$base/tls/ca.crt),
        # and an unrelated CA (other-ca.crt) that must not verify it.
        tls="$base/tls"
        mkdir -p "$tls"
        (
            cd "$tls"
            openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=alkblobs test CA" \
                -keyout ca.key -out ca.crt 2>/dev/null
            openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=another CA" \
                -keyout other-ca.key -out other-ca.crt 2>/dev/null
            openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" -keyout server.key -out server.csr 2>/dev/null
            printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' > san.cnf
            openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 \
                -extfile san.cnf -out server.crt 2>/dev/null
            chmod 600 server.key
        )
        [ "$(id -u)" = 0 ] && chown -R postgres:postgres "$tls"
        cat >> "$data/postgresql.conf" <<CONF
ssl = on
ssl_cert_file = '$tls/server.crt'
ssl_key_file = '$tls/server.key'
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$sock'
fsync = on
max_connections = 100
max_locks_per_transaction = 64
log_min_messages = warning
CONF
        if [ "$preload" = cron ]; then
            cat >> "$data/postgresql.conf" <<CONF
# A managed-service-like server (the SQL-only flavour's tests): pg_cron
# preloaded, the alkblobs library not.
shared_preload_libraries = 'pg_cron'
cron.database_name = '$db'
cron.host = '$sock'
CONF
        elif [ "$preload" != 0 ]; then
            cat >> "$data/postgresql.conf" <<CONF
# The extension's sweep scheduler (issue 12): a background worker for the
# test database, looking for due pools every 250 ms, and one for a
# database without the extension (alkblobs_noext: it must never call into
# an alkblobs schema someone else made there).
shared_preload_libraries = 'alkblobs'
alkblobs.scheduler_databases = '$db, alkblobs_noext'
alkblobs.scheduler_naptime = 250
CONF
        fi
        # Trust on loopback and the private socket only (replication too: the
        # tests take a pg_basebackup).
        cat > "$data/pg_hba.conf" <<HBA
local all all trust
host all all 127.0.0.1/32 trust
local replication all trust
host replication all 127.0.0.1/32 trust
HBA
    fi
    if ! as_pg "$bindir/pg_ctl" -D "$data" status >/dev/null 2>&1; then
        # A start that fails says why (the stop the caller's trap runs
        # next removes the log).
        if ! as_pg "$bindir/pg_ctl" -D "$data" -l "$base/server.log" -w -t 60 start >/dev/null; then
            echo "the cluster on port $port did not start; its log:" >&2
            tail -n 40 "$base/server.log" >&2 || true
            exit 1
        fi
    fi
    "$bindir/psql" -h "$sock" -p "$port" -U postgres -d postgres -qtAc \
        "SELECT 1 FROM pg_database WHERE datname = '$db'" | grep -q 1 \
        || "$bindir/psql" -h "$sock" -p "$port" -U postgres -d postgres -qc "CREATE DATABASE $db"
    "$bindir/psql" -h "$sock" -p "$port" -U postgres -d postgres -qtAc \
        "SELECT 1 FROM pg_database WHERE datname = 'alkblobs_noext'" | grep -q 1 \
        || "$bindir/psql" -h "$sock" -p "$port" -U postgres -d postgres -qc "CREATE DATABASE alkblobs_noext"
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
ca)
    echo "$base/tls/ca.crt"
    ;;
log)
    echo "$base/server.log"
    ;;
restart)
    # Fast shutdown (every session disconnected) and start again.
    as_pg "$bindir/pg_ctl" -D "$data" -l "$base/server.log" -m fast -w -t 60 restart >/dev/null
    ;;
restart-immediate)
    # Immediate shutdown (the server process killed, crash recovery at the
    # start) and start again.
    as_pg "$bindir/pg_ctl" -D "$data" -l "$base/server.log" -m immediate -w -t 60 restart >/dev/null
    ;;
down-for)
    # Fast shutdown, $2 seconds down (an outage), start again.
    as_pg "$bindir/pg_ctl" -D "$data" -m fast -w -t 60 stop >/dev/null
    sleep "${2:?down-for SECONDS}"
    as_pg "$bindir/pg_ctl" -D "$data" -l "$base/server.log" -w -t 60 start >/dev/null
    ;;
*)
    echo "usage: $0 start|stop|restart|restart-immediate|down-for N|url|ca|log" >&2
    exit 2
    ;;
esac
