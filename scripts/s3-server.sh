#!/usr/bin/env bash
# A private, throwaway S3 server for the tests: Garage, a real (distributed,
# here single-node) S3-compatible object store, run as a separate process.
#   scripts/s3-server.sh install  cargo install garage into /opt/garage (once)
#   scripts/s3-server.sh start    configure (if needed) and start it; prints
#                                 the environment a client needs, one
#                                 VAR=value per line (for `env $(...)`)
#   scripts/s3-server.sh stop     stop it and delete its data
#   scripts/s3-server.sh kill     SIGKILL it (its data stays)
#   scripts/s3-server.sh resume   start it again over the same data
#   scripts/s3-server.sh bucket NAME  create another bucket, the key allowed
# It listens on 127.0.0.1:$ALKBLOBS_S3_PORT (default 39000) for S3 and the
# next two ports for its RPC and admin API. Garage is AGPL-3.0: it runs
# beside the tests as a server, it is never linked into anything.
set -euo pipefail
port=${ALKBLOBS_S3_PORT:-39000}
base=${ALKBLOBS_S3_DIR:-/tmp/alkblobs-s3-$port}
garage_root=${ALKBLOBS_GARAGE_ROOT:-/opt/garage}
garage="$garage_root/bin/garage"
version=2.5.0
conf="$base/garage.toml"
pidf="$base/garage.pid"
log="$base/garage.log"
# A fixed test key: the server is private to this machine and thrown away.
key_id=GK0a1b2c3d4e5f60718293a4b5
key_secret=5e3c1d9a0b7f4e6a8c2d1b0a9f8e7d6c5b4a3928170f6e5d4c3b2a1908f7e6d5
bucket=alkblobs-test
region=garage

g() { "$garage" -c "$conf" "$@"; }

wait_up() {
    for _ in $(seq 1 200); do
        if g status >/dev/null 2>&1; then return 0; fi
        if ! kill -0 "$(cat "$pidf")" 2>/dev/null; then
            echo "garage exited; its log:" >&2; cat "$log" >&2; exit 1
        fi
        sleep 0.1
    done
    echo "garage did not answer in 20 s; its log:" >&2; cat "$log" >&2; exit 1
}

run() {
    # setsid: a test that stops the tests' process group leaves it alone.
    setsid "$garage" -c "$conf" server >>"$log" 2>&1 < /dev/null &
    echo $! > "$pidf"
    wait_up
}

env_lines() {
    cat <<ENV
AWS_ENDPOINT_URL=http://127.0.0.1:$port
AWS_ACCESS_KEY_ID=$key_id
AWS_SECRET_ACCESS_KEY=$key_secret
AWS_REGION=$region
AWS_ALLOW_HTTP=true
ALKBLOBS_S3_BUCKET=$bucket
ALKBLOBS_S3_SERVER=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
ENV
}

case "${1:-}" in
install)
    if [ -x "$garage" ] && "$garage" --version 2>/dev/null | grep -q "$version"; then
        exit 0
    fi
    # Its smallest build: the sqlite metadata engine, bundled C libraries,
    # none of the optional features (k2v, consul/kubernetes discovery,
    # telemetry, lmdb).
    # A test server: built for build time (opt-level 1, no LTO, parallel
    # codegen), not for speed.
    CARGO_PROFILE_RELEASE_OPT_LEVEL=1 CARGO_PROFILE_RELEASE_LTO=false \
        CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 CARGO_PROFILE_RELEASE_DEBUG=false \
        cargo install garage --version "$version" --locked --no-default-features \
        --features bundled-libs,sqlite --root "$garage_root"
    ;;
start)
    [ -x "$garage" ] || { echo "no garage at $garage: run scripts/s3-server.sh install" >&2; exit 1; }
    if [ -f "$pidf" ] && kill -0 "$(cat "$pidf")" 2>/dev/null; then
        env_lines; exit 0
    fi
    rm -rf "$base"
    mkdir -p "$base/meta" "$base/data"
    cat > "$conf" <<CONF
metadata_dir = "$base/meta"
data_dir = "$base/data"
db_engine = "sqlite"
metadata_fsync = true
data_fsync = true
replication_factor = 1
rpc_bind_addr = "127.0.0.1:$((port + 1))"
rpc_public_addr = "127.0.0.1:$((port + 1))"
rpc_secret = "$(openssl rand -hex 32)"

[s3_api]
s3_region = "$region"
api_bind_addr = "127.0.0.1:$port"
root_domain = ".s3.localhost"

[admin]
api_bind_addr = "127.0.0.1:$((port + 2))"
CONF
    run
    node=$(g node id -q | cut -d@ -f1)
    g layout assign -z test -c 10G "$node" >/dev/null
    g layout apply --version 1 >/dev/null
    g key import --yes -n alkblobs-test "$key_id" "$key_secret" >/dev/null
    g bucket create "$bucket" >/dev/null
    g bucket allow --read --write --owner "$bucket" --key alkblobs-test >/dev/null
    env_lines
    ;;
bucket)
    g bucket create "$2" >/dev/null
    g bucket allow --read --write --owner "$2" --key alkblobs-test >/dev/null
    ;;
kill)
    [ -f "$pidf" ] && kill -9 "$(cat "$pidf")" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$(cat "$pidf")" 2>/dev/null || break; sleep 0.05; done
    ;;
resume)
    run
    ;;
stop)
    if [ -f "$pidf" ]; then
        kill "$(cat "$pidf")" 2>/dev/null || true
        for _ in $(seq 1 100); do kill -0 "$(cat "$pidf")" 2>/dev/null || break; sleep 0.05; done
        kill -9 "$(cat "$pidf")" 2>/dev/null || true
    fi
    rm -rf "$base"
    ;;
*)
    echo "usage: $0 install|start|stop|kill|resume|bucket NAME" >&2
    exit 2
    ;;
esac
