#!/usr/bin/env bash
# Builds and installs the alkblobs extension into PostgreSQL.
#   scripts/install-extension.sh            into PostgreSQL 15 (Debian's)
#   scripts/install-extension.sh 17 18 ...  into each major named
# Idempotent: installs what is missing (Debian packages, cargo-pgrx 0.18.1,
# each major through scripts/postgres.sh: an installed pg_config, or a
# build of the vendored source kept in /opt/postgresql-MAJOR), runs `cargo
# pgrx init` once for every major present, then `cargo pgrx install
# --release` for each major named, and copies the frozen scripts of
# released versions (sql/released/) and the current version's generated
# upgrade script (scripts/gen-upgrade.py) into that major's extension
# directory, every script stamped with the major (scripts/stamp-major.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || set -- 15

need_pkgs=()
for pkg in libclang-dev clang pkg-config; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need_pkgs+=("$pkg")
done
if [ ${#need_pkgs[@]} -gt 0 ]; then
    echo "installing Debian packages: ${need_pkgs[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q "${need_pkgs[@]}" >/dev/null
fi

declare -A pg_config
for major in "$@"; do
    pg_config[$major]=$(scripts/postgres.sh install "$major")
done

if [ "$(cargo pgrx --version 2>/dev/null)" != "cargo-pgrx 0.18.1" ]; then
    echo "installing cargo-pgrx 0.18.1 (about 10 minutes on 2 cores)"
    cargo install cargo-pgrx --version 0.18.1 --locked
fi

# One `cargo pgrx init` naming every supported major present here, run only
# when the config lacks one or names a pg_config that is gone (a major
# removed or moved: pgrx's build reads every entry and fails on it):
# rewriting ~/.pgrx/config.toml makes every major's bindings regenerate on
# the next build.
config="${PGRX_HOME:-$HOME/.pgrx}/config.toml"
init=() missing=0
for major in $(scripts/postgres.sh majors); do
    path=$(scripts/postgres.sh pg-config "$major" 2>/dev/null) || continue
    init+=("--pg$major" "$path")
    grep -qs "pg$major = \"$path\"" "$config" || missing=1
done
while read -r path; do
    [ -x "$path" ] || { echo "$config names $path, which is gone: running cargo pgrx init again"; missing=1; }
done < <(sed -n 's/^pg[0-9]* = "\(.*\)"$/\1/p' "$config" 2>/dev/null)
if [ "$missing" = 1 ]; then
    cargo pgrx init "${init[@]}" >/dev/null
fi

upgrade=$(python3 scripts/gen-upgrade.py)
for major in "$@"; do
    (cd pg_ext && cargo pgrx install --pg-config "${pg_config[$major]}" --release)
    # The released scripts (cargo pgrx only writes the current install
    # script), so that CREATE EXTENSION alkblobs VERSION '<old>' and the
    # upgrade path from it keep working, and the current version's upgrade
    # script, generated from sql/ (never committed until released).
    ext="$("${pg_config[$major]}" --sharedir)/extension"
    install -m 644 sql/released/alkblobs--*.sql "$upgrade" "$ext/"
    # Each script refuses a server of another major before it loads the
    # library (whose loader error would name a missing symbol instead).
    scripts/stamp-major.sh "$major" "$ext"/alkblobs--*.sql
done
