#!/usr/bin/env bash
# Packages of the extension, for operators who install from packages.
#
#   scripts/package.sh sql-only [--out DIR]
#       Writes the SQL-only install script (scripts/gen-sql-only.py: for
#       servers that cannot load the library, e.g. managed PostgreSQL) and
#       prints its path. `psql -v ON_ERROR_STOP=1 -f <it> DB` as a role with
#       CREATEROLE is the whole install (docs/operations.md).
#
#   scripts/package.sh deb [--major N] [--rev GIT-REV] [--out DIR]
#       Builds the Debian package postgresql-N-alkblobs (N is 15 unless
#       --major; one of scripts/postgres.sh majors) from the pgrx build
#       (cargo pgrx package --release) against that major's pg_config
#       (scripts/postgres.sh pg-config N) and prints the path of the .deb
#       it wrote (in target/packages/ unless --out). With --rev, the
#       package of that commit (e.g. the previous release, for the upgrade
#       test), built from a git worktree of it in the release profile,
#       sharing this checkout's target directory (its dependencies).
#
# The package installs where that pg_config says the server looks
# (--pkglibdir, --sharedir). Where the server is Debian's (its pg_config
# belongs to a package: Debian 12's 15, or any major from the PostgreSQL
# project's apt repository) the package depends on postgresql-N and has
# Debian's paths; built against a server of ours from source
# (/opt/postgresql-N) it installs into that server's directories and
# depends on no PostgreSQL package, as nothing of dpkg's provides it.
#
# A commit from before a major was supported (--rev with N other than
# 15: the releases before 0.8.0 were built for 15 only) is built for N by
# adding the pgrx feature of N to its worktree's manifest: the release's
# own code, compiled for a major it was not shipped for, which is what
# the upgrade test on that major needs.
#
# Install with `apt install ./postgresql-N-alkblobs_<v>_<arch>.deb` (or
# dpkg -i), then CREATE EXTENSION alkblobs; remove with `apt remove
# postgresql-N-alkblobs`. Needs what scripts/install-extension.sh N
# installs (cargo-pgrx 0.18.1, that major's headers); run that first on
# a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

kind=${1:-}
shift || true
rev=""
major=15
out="$root/target/packages"
while [ $# -gt 0 ]; do
    case "$1" in
    --major) major=$2; shift 2 ;;
    --rev) rev=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
if [ "$kind" = sql-only ]; then
    # The SQL-only install script, generated from sql/ (never kept by hand).
    script=$(python3 scripts/gen-sql-only.py)
    if [ "$out" != "$root/target/packages" ] || [ -n "$rev" ]; then
        [ -z "$rev" ] || { echo "--rev is for deb packages" >&2; exit 2; }
        mkdir -p "$out"
        cp "$script" "$out/"
        script="$out/$(basename "$script")"
    fi
    echo "$script"
    exit 0
fi
if [ "$kind" != deb ]; then
    echo "usage: $0 deb [--major N] [--rev GIT-REV] [--out DIR] | $0 sql-only [--out DIR]" >&2
    exit 2
fi
pg_config=$(scripts/postgres.sh pg-config "$major")
package="postgresql-$major-alkblobs"
mkdir -p "$out"

src=$root
if [ -n "$rev" ]; then
    commit=$(git rev-parse --verify "$rev^{commit}")
    src="$root/target/package-src/$commit"
    if [ ! -d "$src/pg_ext" ]; then
        rm -rf "$src"
        git worktree prune
        git worktree add --detach "$src" "$commit" >&2
    fi
    # A release from before this major was supported: its manifest gains
    # the major's pgrx feature (as 0.8.0's has it), nothing else.
    if ! grep -q "^pg$major = " "$src/pg_ext/Cargo.toml"; then
        sed -i "s|^pg15 = \[\(.*\)\]\$|&\npg$major = [\"pgrx/pg$major\", \"pgrx-tests/pg$major\"]|" "$src/pg_ext/Cargo.toml"
        grep -q "^pg$major = " "$src/pg_ext/Cargo.toml" || { echo "cannot add the pg$major feature to $src/pg_ext/Cargo.toml" >&2; exit 1; }
    fi
fi

version=$(sed -n 's/^version = "\([0-9.]*\)".*/\1/p' "$src/pg_ext/Cargo.toml")
arch=$(dpkg --print-architecture)
stage="$root/target/package-stage/alkblobs-$major-$version"
rm -rf "$stage"
# Another commit's package is built in the release profile too, in this
# checkout's target directory: the release's dependencies of the same
# versions are this checkout's release build's (scripts/install-extension.sh
# made them; its release profile is the same), so only what changed is
# compiled (the dev profile differs between the two commits: there every
# dependency was compiled again, 4 min 45 s of the PostgreSQL 15 step).
# Its library is then the one at target/release/libalkblobs_pg.so; the next
# build of this checkout's links its own there again.
(
    cd "$src/pg_ext"
    CARGO_TARGET_DIR="$root/target" cargo pgrx package --pg-config "$pg_config" --out-dir "$stage" >&2
)
sharedir=$("$pg_config" --sharedir)
pkglibdir=$("$pg_config" --pkglibdir)
# The frozen install scripts of released versions (cargo pgrx writes only
# the current one), as scripts/install-extension.sh copies them.
install -m 644 "$src"/sql/released/alkblobs--*.sql "$stage$sharedir/extension/"
# And the current version's upgrade script, generated from sql/ (a tree
# from before the scripts were generated has them in sql/, which cargo pgrx
# package copied already).
if [ -f "$src/scripts/gen-upgrade.py" ] && [ -d "$src/sql/api" ]; then
    install -m 644 "$(cd "$src" && python3 scripts/gen-upgrade.py)" "$stage$sharedir/extension/"
fi
# Every script refuses a server of another major (scripts/stamp-major.sh).
scripts/stamp-major.sh "$major" "$stage$sharedir"/extension/alkblobs--*.sql
test -f "$stage$pkglibdir/alkblobs.so"
test -f "$stage$sharedir/extension/alkblobs--$version.sql"

doc="$stage/usr/share/doc/$package"
mkdir -p "$doc"
{
    echo "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/"
    echo "Upstream-Name: alkblobs"
    echo "Source: https://github.com/alkblobs/alkblobs"
    echo
    echo "Files: *"
    echo "Copyright: 2026 The alkblobs developers"
    echo "License: MIT or Apache-2.0"
    sed 's/^/ /; s/^ $/ ./' "$src/LICENSE-MIT" 2>/dev/null || true
} > "$doc/copyright"
gzip -9n -c > "$doc/changelog.gz" <<CHANGES
$package ($version) unstable; urgency=medium

  * alkblobs extension $version; see docs/operations.md, "Versions".

 -- alkblobs developers <alkblobs@example.org>  $(date -R -u -d @"$(git -C "$src" log -1 --format=%ct)")
CHANGES

# Shared-library dependencies, as dpkg computes them for the .so.
shlibs=$(
    tmp=$(mktemp -d)
    mkdir -p "$tmp/debian"
    printf 'Source: alkblobs\n\nPackage: %s\nArchitecture: any\n' "$package" > "$tmp/debian/control"
    (cd "$tmp" && dpkg-shlibdeps -O -e "$stage$pkglibdir/alkblobs.so" 2>/dev/null | sed -n 's/^shlibs:Depends=//p')
    rm -rf "$tmp"
)
# The server this package is for: Debian's (a dependency) or one built
# from source (none; the description names its directory).
depends=$shlibs
server="PostgreSQL $major"
if dpkg -S "$(readlink -f "$pg_config")" >/dev/null 2>&1; then
    depends="postgresql-$major${shlibs:+, $shlibs}"
else
    server="the PostgreSQL $major built in $("$pg_config" --bindir | sed 's|/bin$||')"
fi
size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
mkdir -p "$stage/DEBIAN"
cat > "$stage/DEBIAN/control" <<CONTROL
Package: $package
Version: $version
Architecture: $arch
Maintainer: alkblobs developers <alkblobs@example.org>
Installed-Size: $size
Depends: $depends
Section: database
Priority: optional
Homepage: https://github.com/alkblobs/alkblobs
Description: content-addressed blob store, fleet garbage collection for PostgreSQL $major
 The alkblobs extension: pools of deduplicated, content-addressed blobs
 (rows and large objects), pins and liveness tables that protect them, and a
 garbage collector that runs inside the database, swept from psql, from
 store nodes, from pg_cron or by its own scheduler (which needs
 shared_preload_libraries = 'alkblobs'; everything else works without it).
 After installing: CREATE EXTENSION alkblobs; after upgrading: restart the
 server if it preloads the library, then ALTER EXTENSION alkblobs UPDATE.
 Built for $server.
CONTROL
deb="$out/${package}_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$stage" "$deb" >&2
echo "$deb"
