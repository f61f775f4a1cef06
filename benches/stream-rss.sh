#!/usr/bin/env bash
# Peak RSS of a streaming put of a 2 GiB file through the CLI, measured with
# /usr/bin/time -v. Usage: benches/stream-rss.sh [SIZE_MIB] [LARGE]
# LARGE is a --large value, e.g. s3://bucket/prefix (with the AWS
# environment set: `env $(scripts/s3-server.sh start) benches/stream-rss.sh
# 2048 s3://alkblobs-test/rss`).
set -euo pipefail
cd "$(dirname "$0")/.."
size_mib=${1:-2048}
large=()
[ -n "${2:-}" ] && large=(--large "$2")
command -v /usr/bin/time >/dev/null || apt-get install -y -q time >/dev/null
cargo build --release -q --bin alkblobs
work=$(mktemp -d -p target)
trap 'rm -rf "$work"' EXIT
# Incompressible input, written in bounded chunks.
head -c "$((size_mib * 1024 * 1024))" /dev/urandom > "$work/big.bin"
/usr/bin/time -v target/release/alkblobs --data-dir "$work/store" "${large[@]}" --quiet put "$work/big.bin" 2> "$work/time.txt" > "$work/key.txt"
key=$(cat "$work/key.txt")
rss_kib=$(awk -F: '/Maximum resident set size/ {gsub(/ /, "", $2); print $2}' "$work/time.txt")
wall=$(awk '/Elapsed \(wall clock\)/ {print $NF}' "$work/time.txt")
stored=$(target/release/alkblobs --data-dir "$work/store" "${large[@]}" --json stat "$key" | awk -F: '/"size"/ {gsub(/[ ,]/, "", $2); print $2}')
echo "streaming put of ${size_mib} MiB${2:+ to $2}: peak RSS $((rss_kib / 1024)) MiB (${rss_kib} KiB), wall ${wall}, stored ${stored} bytes as ${key}"
[ "$stored" = "$((size_mib * 1024 * 1024))" ]
