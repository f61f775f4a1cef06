#!/usr/bin/env bash
# Builds and installs the alkblobs extension into the system PostgreSQL 15.
# Idempotent: installs what is missing (Debian packages, cargo-pgrx 0.18.1),
# runs `cargo pgrx init` once, then `cargo pgrx install --release`, and
# copies the frozen scripts of released versions (sql/released/) and the
# current version's generated upgrade script (scripts/gen-upgrade.py).
set -euo pipefail
cd "$(dirname "$0")/.."
pg_config=/usr/lib/postgresql/15/bin/pg_config

need_pkgs=()
for pkg in postgresql-15 postgresql-server-dev-15 libclang-dev clang pkg-config; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need_pkgs+=("$pkg")
done
if [ ${#need_pkgs[@]} -gt 0 ]; then
    echo "installing Debian packages: ${need_pkgs[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q "${need_pkgs[@]}" >/dev/null
fi

if [ "$(cargo pgrx --version 2>/dev/null)" != "cargo-pgrx 0.18.1" ]; then
    echo "installing cargo-pgrx 0.18.1 (about 10 minutes on 2 cores)"
    cargo install cargo-pgrx --version 0.18.1 --locked
fi

if ! grep -qs "pg15 = \"$pg_config\"" "${PGRX_HOME:-$HOME/.pgrx}/config.toml"; then
    cargo pgrx init --pg15 "$pg_config" >/dev/null
fi

(cd pg_ext && cargo pgrx install --pg-config "$pg_config" --release)
# The released scripts (cargo pgrx only writes the current install script),
# so that CREATE EXTENSION alkblobs VERSION '<old>' and the upgrade path from
# it keep working, and the current version's upgrade script, generated from
# sql/ (scripts/gen-upgrade.py; never committed until released).
upgrade=$(python3 scripts/gen-upgrade.py)
install -m 644 sql/released/alkblobs--*.sql "$upgrade" "$("$pg_config" --sharedir)/extension/"
