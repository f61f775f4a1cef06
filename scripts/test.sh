#!/usr/bin/env bash
# Runs every test, as CI does (.ci/run calls this):
#   1. installs what is missing (Debian packages, cargo-pgrx 0.18.1) and the
#      extension into PostgreSQL 15 (scripts/install-extension.sh); builds
#      PostgreSQL 17 and 18 from the vendored sources in the background
#      (scripts/postgres.sh, kept in /opt), which get the extension before
#      their step (5b);
#   2. formatting, clippy and rustdoc with warnings denied, and that every
#      mutation of scripts/mutations/ still applies (scripts/mutants.py
#      --check: no build, a second);
#   3. the workspace suite: conformance over every engine and store
#      configuration, bad input, crash, power-cut (on a FUSE filesystem
#      that loses unsynced writes) and GC race tests, the CLI;
#   4. starts a private throwaway PostgreSQL cluster (scripts/pg-cluster.sh),
#      runs the golden SQL tests (scripts/regress.sh) and the isolation
#      specs (scripts/isolation.sh), the PostgreSQL race,
#      protocol, privilege, liveness-registration, local-tier, argument,
#      randomized, peer-race, review-queue and verify suites and the engine
#      conformance suites over real connections (pools on the default
#      'queue' collector), then the race and hardening suites again over
#      the full-mark collector ('mark', the database's default for them);
#   4b. the s3 large tier against Garage (a real S3 server, built from the
#      Rust registry in the background since step 1; scripts/s3-server.sh):
#      engine, store and arbiter suites, alone and with PostgreSQL pools,
#      faults (the S3 server and the database restarted mid-put), fleet
#      processes (killed mid-upload, a claimer stopped mid-delete), the CLI;
#      then the engine and store suites on moto (scripts/s3-emulator.sh),
#      which honours If-None-Match where Garage does not;
#   5. starts a second cluster configured as a server nobody reconfigured
#      (no shared_preload_libraries): a pg_dump of busy pools restored into
#      it from the first, then CREATE EXTENSION and the engine and fleet
#      suites there;
#   5b. for PostgreSQL 17 and then 18: a preloading cluster with golden
#      SQL, isolation specs, the race, fleet, privilege, review-queue and
#      verify suites (18: every suite of step 4's first list); a dump of
#      the PostgreSQL 15 cluster restored into a non-preloading cluster of
#      that major, and the engine and default-server suites there; then
#      pg_upgrade of a preloading 17 cluster with busy pools to 18;
#   6. a third cluster like a managed server (pg_cron preloaded, the
#      library never loaded): the SQL-only install script run by a
#      non-superuser, the SQL-only suite and the engine, fleet, race,
#      privilege, liveness-registration, local-tier, argument and randomized
#      suites against it;
#   7. the engine suites again through a transaction-mode pgbouncer
#      (scripts/pgbouncer.sh), a server restart and an outage;
#   8. the Debian package: the previous release's (built from git history)
#      installed with apt, upgraded in place to this version's, removed;
#      and stops everything.
# Also: cargo publish --dry-run of both crates (scripts/check-crates.sh),
# and the monitoring config through Debian's prometheus-sql-exporter.
# Exits non-zero if anything fails. A PostgreSQL test that cannot reach its
# server fails; none skips.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
# Each step also prints the disk left: a run that fills the disk fails in a
# linker, far from its cause.
step() { printf '\n==> %s (%ss, %s free)\n' "$*" "$(( $(date +%s) - start ))" "$(df -h --output=avail . | tail -1 | tr -d ' ')"; }

step "installing prerequisites and the extension; Garage (the S3 server) builds beside the rest"
# Garage is a Rust program from the Rust registry: a fresh machine builds it
# once (into /opt/garage), in the background while the steps before the
# S3 suites run; they wait for it (its log: target/garage-install.log).
mkdir -p target
# The test servers' ports (PostgreSQL 54329-54341, Garage 39000-39002, moto
# 39100) lie in Linux's ephemeral range (32768-60999): a client connection
# can take one as its source port, and a server started on it later fails
# with "Address already in use" (seen: the second cluster's 54330, taken by
# a connection to moto). Reserve them, where this runs as root.
if [ -w /proc/sys/net/ipv4/ip_local_reserved_ports ]; then
    reserved=$(cat /proc/sys/net/ipv4/ip_local_reserved_ports)
    echo "${reserved:+$reserved,}39000-39002,39100,54329-54341" > /proc/sys/net/ipv4/ip_local_reserved_ports
fi
scripts/s3-server.sh install > target/garage-install.log 2>&1 &
garage_install=$!
# PostgreSQL 17 and 18, built from the vendored sources into /opt (about
# 6 minutes each the first time, kept for later runs: scripts/postgres.sh),
# in the background too, while the steps up to the first cluster's run;
# the extension goes into them before their step (its log:
# target/postgres-install.log). 15 is Debian's.
majors=$(scripts/postgres.sh majors)
others=${majors#15 }
# (Its build tools first, here: two apt-gets at once fail on dpkg's lock.)
build_deps=()
for pkg in bison flex libreadline-dev zlib1g-dev libssl-dev pkg-config make gcc; do
    dpkg -s "$pkg" >/dev/null 2>&1 || build_deps+=("$pkg")
done
if [ ${#build_deps[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${build_deps[@]}" >/dev/null
fi
(for major in $others; do scripts/postgres.sh install "$major" || exit 1; done) > target/postgres-install.log 2>&1 &
postgres_install=$!
scripts/install-extension.sh 15

step "test tools from Debian: the Prometheus SQL exporter (pg_monitoring runs docs/monitoring/ in it), pg_cron (the SQL-only flavour's scheduler), fuse3 (fusermount3, for the power-cut test's lossyfs), curl (scripts/s3-emulator.sh; the client of alkblobs serve's tests), openssl (their TLS certificate), iproute2 (ip netns and veth pairs: pg_partition's network cut)"
tools=()
for pkg in prometheus-sql-exporter postgresql-15-cron fuse3 curl openssl iproute2; do
    dpkg -s "$pkg" >/dev/null 2>&1 || tools+=("$pkg")
done
if [ ${#tools[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q "${tools[@]}" >/dev/null
fi

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (workspace, then the extension)"
cargo clippy --all-targets -- -D warnings
# The extension in the release profile: step 1 built it so, and its build
# scripts (pgrx's bindgen over the server headers) and proc macros are
# reused; in the dev profile they were built again (5 min of the step).
cargo clippy --release -p alkblobs-pg -- -D warnings
cargo clippy -p alkblobs --features postgres,conformance,pg-tests --all-targets -- -D warnings
cargo clippy -p alkblobs-tests --features pg --tests -- -D warnings
cargo clippy -p alkblobs-tests --features pg,s3 --tests --bins -- -D warnings

step "cargo doc (warnings denied)"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps -q -p alkblobs -p alkblobs-core --features alkblobs/conformance,alkblobs/postgres

step "the mutation entries still apply (scripts/mutants.py --check; the mutations themselves run apart: docs/design.md)"
python3 scripts/mutants.py --check

step "the published crates: package contents and cargo publish --dry-run (scripts/check-crates.sh)"
scripts/check-crates.sh

step "workspace tests"
cargo test --workspace --exclude alkblobs-pg
cargo test -p alkblobs --features postgres --lib

step "starting a private PostgreSQL cluster"
scripts/pg-cluster.sh stop >/dev/null 2>&1 || true
trap 'scripts/pg-cluster.sh stop >/dev/null 2>&1 || true' EXIT
url=$(scripts/pg-cluster.sh start)
psql -X -q "$url" -v ON_ERROR_STOP=1 -c "CREATE EXTENSION alkblobs"
echo "extension created in $url"

step "golden SQL tests (pg_regress) and isolation specs (pg_isolation_regress)"
scripts/regress.sh
scripts/isolation.sh

step "PostgreSQL race, protocol, privilege, liveness-registration, local-tier, argument, randomized, engine and verify suites"
ALKBLOBS_PG_URL="$url" ALKBLOBS_PG_CA=$(scripts/pg-cluster.sh ca) cargo test -p alkblobs-tests --features pg --test pg_races --test pg_protocol --test pg_privileges --test pg_liveness_registration --test pg_local_tier --test pg_arguments --test pg_randomized --test pg_engines --test pg_hotpaths --test pg_fleet --test pg_scheduler --test pg_monitoring --test pg_peer_races --test pg_review_queue --test pg_verify
ALKBLOBS_PG_URL="$url" cargo test -p alkblobs --features pg-tests --test cli_pg

step "the race and hardening suites again over the full-mark collector (pools created with collector 'mark': the database's default for this run)"
psql -X -q "$url" -v ON_ERROR_STOP=1 -c "DO \$\$ BEGIN EXECUTE format('ALTER DATABASE %I SET alkblobs.default_collector = %L', current_database(), 'mark'); END \$\$"
ALKBLOBS_PG_URL="$url" ALKBLOBS_PG_COLLECTOR=mark cargo test -p alkblobs-tests --features pg --test pg_races --test pg_randomized --test pg_peer_races --test pg_privileges --test pg_liveness_registration --test pg_local_tier
psql -X -q "$url" -v ON_ERROR_STOP=1 -c "DO \$\$ BEGIN EXECUTE format('ALTER DATABASE %I RESET alkblobs.default_collector', current_database()); END \$\$"

step "the s3 large tier against a real S3 server (Garage, scripts/s3-server.sh): the engine, store and arbiter suites alone and with PostgreSQL (single-instance and fleet pools), writers killed mid-upload, a claimer stopped mid-delete, an instance in its own network namespace cut off from the database (pg_partition), the database and the S3 server restarted mid-put, fleet processes racing over one s3 pool; then the engine and store suites on moto (scripts/s3-emulator.sh), which honours If-None-Match"
if ! wait "$garage_install"; then
    echo "installing Garage failed; its log:" >&2
    cat target/garage-install.log >&2
    exit 1
fi
trap 'scripts/s3-server.sh stop >/dev/null 2>&1 || true; scripts/pg-cluster.sh stop >/dev/null 2>&1 || true' EXIT
s3env=$(scripts/s3-server.sh start)
env $s3env cargo test -p alkblobs-tests --features s3 --test s3_engines --test s3_stores
env $s3env ALKBLOBS_PG_URL="$url" cargo test -p alkblobs-tests --features pg,s3 --test pg_s3 --test pg_partition
# Restarts the cluster under a fleet put between its pin and its publish: alone.
env $s3env ALKBLOBS_PG_URL="$url" cargo test -p alkblobs-tests --features pg,s3 --test pg_s3_restart
env $s3env ALKBLOBS_PG_URL="$url" cargo test -p alkblobs --features pg-tests --test cli_s3
# Kills and restarts the S3 server: alone, last.
env $s3env cargo test -p alkblobs-tests --features s3 --test s3_faults
scripts/s3-server.sh stop
# The engine and store suites again on moto, an emulator that honours
# If-None-Match (Garage ignores it): the conditional-create branches run
# only here. It checks no credentials: that one case is Garage's.
trap 'scripts/s3-emulator.sh stop >/dev/null 2>&1 || true; scripts/pg-cluster.sh stop >/dev/null 2>&1 || true' EXIT
motoenv=$(scripts/s3-emulator.sh start)
env $motoenv cargo test -p alkblobs-tests --features s3 --test s3_engines --test s3_stores -- --skip bad_coordinates_are_clear_errors_without_secrets
scripts/s3-emulator.sh stop

step "a second cluster, configured as nobody reconfigured it (no shared_preload_libraries): restores into it, CREATE EXTENSION, the engine and fleet suites"
other_pg() { ALKBLOBS_PG_PRELOAD=0 ALKBLOBS_PG_PORT=54330 scripts/pg-cluster.sh "$@"; }
trap 'other_pg stop >/dev/null 2>&1 || true; scripts/pg-cluster.sh stop >/dev/null 2>&1 || true' EXIT
other_pg stop >/dev/null 2>&1 || true
other=$(other_pg start)
# First, while its transaction counter is far behind the first cluster's.
ALKBLOBS_PG_URL="$url" ALKBLOBS_PG_URL_OTHER="$other" cargo test -p alkblobs-tests --features pg --test pg_restore
ALKBLOBS_PG_URL="$other" ALKBLOBS_PG_CA=$(other_pg ca) cargo test -p alkblobs-tests --features pg --test pg_default_server --test pg_engines --test pg_fleet
other_pg stop

# The other majors: each gets a preloading cluster of its own (17 on
# 54332, 18 on 54333) for the golden SQL, the isolation specs and the
# race, fleet, privilege, review-queue and verify suites; then a
# non-preloading one on 54330 that a dump of the PostgreSQL 15 cluster's
# busy pools is restored into (with that major's pg_dump and pg_restore;
# pg_restore's suite), and the engine and default-server suites there. docs/operations.md, "PostgreSQL majors", says which suites run on
# which major and why.
step "the extension into PostgreSQL $others (built in the background since step 1)"
if ! wait "$postgres_install"; then
    echo "installing PostgreSQL $others failed; its log:" >&2
    cat target/postgres-install.log >&2
    exit 1
fi
cat target/postgres-install.log
scripts/install-extension.sh $others
# Every major's build is installed now: each refuses another's server with
# both majors named (pg_majors; here on 15, below on each of the others).
ALKBLOBS_PG_URL="$url" cargo test -p alkblobs-tests --features pg --test pg_majors
for major in $others; do
    step "PostgreSQL $major: golden SQL, isolation specs, the race, fleet, privilege, review-queue and verify suites; a dump of the PostgreSQL 15 cluster restored into a $major cluster that does not preload the library, and the engine and default-server suites there"
    major_pg() { ALKBLOBS_PG_MAJOR=$major ALKBLOBS_PG_PORT=$((54315 + major)) scripts/pg-cluster.sh "$@"; }
    major_other() { ALKBLOBS_PG_MAJOR=$major ALKBLOBS_PG_PRELOAD=0 ALKBLOBS_PG_PORT=54330 scripts/pg-cluster.sh "$@"; }
    trap 'major_pg stop >/dev/null 2>&1 || true; major_other stop >/dev/null 2>&1 || true; scripts/pg-cluster.sh stop >/dev/null 2>&1 || true' EXIT
    major_pg stop >/dev/null 2>&1 || true
    major_url=$(major_pg start)
    psql -X -q "$major_url" -v ON_ERROR_STOP=1 -c "CREATE EXTENSION alkblobs"
    psql -X -qAt "$major_url" -c "SELECT version()"
    ALKBLOBS_PG_MAJOR=$major ALKBLOBS_PG_PORT=$((54315 + major)) scripts/regress.sh
    ALKBLOBS_PG_MAJOR=$major ALKBLOBS_PG_PORT=$((54315 + major)) scripts/isolation.sh
    # Every major: the races, the fleet, privileges, the review queue,
    # verify and the protocol suite (with the upgrade from 0.1.0). The newest (18) also runs every other suite of PostgreSQL
    # 15's list above; 17 sits between two majors that run them all.
    suites="--test pg_races --test pg_fleet --test pg_privileges --test pg_review_queue --test pg_verify --test pg_peer_races --test pg_protocol --test pg_majors"
    if [ "$major" = "${majors##* }" ]; then
        suites="$suites --test pg_liveness_registration --test pg_local_tier --test pg_arguments --test pg_randomized --test pg_engines --test pg_hotpaths --test pg_scheduler --test pg_monitoring"
    fi
    ALKBLOBS_PG_URL="$major_url" ALKBLOBS_PG_CA=$(major_pg ca) cargo test -p alkblobs-tests --features pg $suites
    major_pg stop
    major_other stop >/dev/null 2>&1 || true
    major_other_url=$(major_other start)
    ALKBLOBS_PG_URL="$url" ALKBLOBS_PG_URL_OTHER="$major_other_url" \
        ALKBLOBS_PG_BIN_OTHER="$(scripts/postgres.sh bindir "$major")" \
        cargo test -p alkblobs-tests --features pg --test pg_restore
    ALKBLOBS_PG_URL="$major_other_url" ALKBLOBS_PG_CA=$(major_other ca) cargo test -p alkblobs-tests --features pg --test pg_default_server --test pg_engines
    major_other stop
done
# pg_upgrade between the majors built here, oldest to newest (from Debian's
# 15.20 no pg_upgrade gets through, for any database: docs/operations.md,
# "Moving between majors"). The suite makes its two clusters itself.
read -r -a upgrade_majors <<< "$others"
if [ "${#upgrade_majors[@]}" -ge 2 ]; then
    from=${upgrade_majors[0]} to=${upgrade_majors[-1]}
    step "pg_upgrade of a preloading PostgreSQL $from cluster with busy pools to $to"
    ALKBLOBS_PG_BIN_OLD="$(scripts/postgres.sh bindir "$from")" ALKBLOBS_PG_BIN_NEW="$(scripts/postgres.sh bindir "$to")" \
        cargo test -p alkblobs-tests --features pg --test pg_upgrade
fi

step "a third cluster, like a managed server: pg_cron preloaded, the library never loaded; the SQL-only install run by a non-superuser with CREATEROLE, then the engine, fleet, race, privilege, liveness-registration, local-tier, argument and randomized suites against it"
trap 'scripts/sql-only-cluster.sh stop >/dev/null 2>&1 || true; scripts/pg-cluster.sh stop >/dev/null 2>&1 || true' EXIT
managed_env=$(scripts/sql-only-cluster.sh start)
env $managed_env cargo test -p alkblobs-tests --features pg --test pg_sql_only --test pg_engines --test pg_fleet --test pg_races --test pg_privileges --test pg_liveness_registration --test pg_local_tier --test pg_arguments --test pg_randomized --test pg_review_queue
scripts/sql-only-cluster.sh stop
# The SQL-only install on the other majors, by a CREATEROLE role as since
# PostgreSQL 16 (it keeps ADMIN OPTION on the roles it creates): the
# SQL-only suite but its pg_cron test (Debian packages pg_cron for 15
# alone), the race, fleet and privilege suites.
for major in $others; do
    step "PostgreSQL $major: the SQL-only install by a non-superuser, the SQL-only, race, fleet and privilege suites against it"
    managed_env=$(ALKBLOBS_PG_MAJOR=$major scripts/sql-only-cluster.sh start)
    env $managed_env cargo test -p alkblobs-tests --features pg --test pg_sql_only --test pg_races --test pg_fleet --test pg_privileges -- --skip pg_cron_sweeps_a_pool_scheduled_with_one_call
    ALKBLOBS_PG_MAJOR=$major scripts/sql-only-cluster.sh stop
done

step "the engine and store conformance suites through a transaction-mode pgbouncer"
trap 'scripts/pgbouncer.sh stop >/dev/null 2>&1 || true; scripts/pg-cluster.sh stop >/dev/null 2>&1 || true' EXIT
bouncer=$(scripts/pgbouncer.sh start)
ALKBLOBS_PG_URL="$url" ALKBLOBS_PG_STORE_URL="$bouncer" cargo test -p alkblobs-tests --features pg --test pg_engines -- postgres_kv pg_lo single_

step "a server restart under a store (restarts the cluster: runs alone, last)"
ALKBLOBS_PG_URL="$url" cargo test -p alkblobs-tests --features pg --test pg_restart

version=$(sed -n 's/^version = "\([0-9.]*\)".*/\1/p' pg_ext/Cargo.toml)
bump=$(git log --format=%H -n1 -S"version = \"$version\"" -- pg_ext/Cargo.toml)
[ -n "$bump" ] || { echo "cannot find the commit that made version $version in the git history (a shallow clone?)" >&2; exit 1; }
for major in $(scripts/postgres.sh majors); do
    step "the Debian package for PostgreSQL $major: this version's and the previous release's (built from git history), installed with apt, upgraded in place, removed"
    deb_old=$(scripts/package.sh deb --major "$major" --rev "$bump^")
    deb_new=$(scripts/package.sh deb --major "$major")
    echo "packages: $deb_old $deb_new"
    ALKBLOBS_PG_MAJOR=$major ALKBLOBS_DEB_OLD="$deb_old" ALKBLOBS_DEB_NEW="$deb_new" cargo test -p alkblobs-tests --features pg --test pg_package
done

step "all tests passed"
