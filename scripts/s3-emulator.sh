#!/usr/bin/env bash
# A second S3 server for the engine and store suites: moto's server mode
# (Python registry), an emulator that honours `If-None-Match: *` where
# Garage 2.5 ignores it, so the conditional-create branches (the prefix
# lease, the owner object, PutObject's) are taken there and only there.
# It checks no credentials, so the suites' refused-credentials case runs
# against Garage alone (scripts/test.sh).
#   scripts/s3-emulator.sh start   start it (installing moto if missing),
#                                  create the test bucket, print the
#                                  environment a client needs (for `env $(...)`)
#   scripts/s3-emulator.sh stop    stop it (its objects are in memory: gone)
# It listens on 127.0.0.1:$ALKBLOBS_S3_EMULATOR_PORT (default 39100).
set -euo pipefail
port=${ALKBLOBS_S3_EMULATOR_PORT:-39100}
pidf=/tmp/alkblobs-s3-emulator-$port.pid
log=/tmp/alkblobs-s3-emulator-$port.log
bucket=alkblobs-test

case "${1:-}" in
start)
    if ! command -v moto_server >/dev/null 2>&1; then
        python3 -m pip install --quiet 'moto[server]==5.2.1' >&2
    fi
    if [ -f "$pidf" ] && kill -0 "$(cat "$pidf")" 2>/dev/null; then
        kill "$(cat "$pidf")"; sleep 0.5
    fi
    setsid moto_server -H 127.0.0.1 -p "$port" >"$log" 2>&1 &
    echo $! >"$pidf"
    for _ in $(seq 1 100); do
        if curl -s -o /dev/null "http://127.0.0.1:$port/"; then break; fi
        sleep 0.1
    done
    code=$(curl -s -o /dev/null -w '%{http_code}' -X PUT "http://127.0.0.1:$port/$bucket")
    if [ "$code" != 200 ]; then
        echo "moto did not create the bucket (HTTP $code); its log:" >&2; cat "$log" >&2; exit 1
    fi
    echo "AWS_ENDPOINT_URL=http://127.0.0.1:$port"
    echo "AWS_ACCESS_KEY_ID=testing"
    echo "AWS_SECRET_ACCESS_KEY=testing"
    echo "AWS_REGION=us-east-1"
    echo "AWS_ALLOW_HTTP=true"
    echo "ALKBLOBS_S3_BUCKET=$bucket"
    ;;
stop)
    if [ -f "$pidf" ]; then
        kill "$(cat "$pidf")" 2>/dev/null || true
        rm -f "$pidf"
    fi
    ;;
*)
    echo "usage: $0 start|stop" >&2; exit 2
    ;;
esac
