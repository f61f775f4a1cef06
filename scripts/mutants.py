#!/usr/bin/env python3
"""The mutation runner: removes one guard at a time and checks that the tests
named for it fail.

    scripts/mutants.py            every mutation below
    scripts/mutants.py ID ...     just those
    scripts/mutants.py --list     what there is
    scripts/mutants.py --baseline every mutation's tests without the mutation
                                  (they must pass, or a "caught" means nothing)

Each mutation edits one file (the `find` text must occur exactly once; the
edit is undone afterwards, also on Ctrl-C), rebuilds what it must (a SQL or
extension mutation reinstalls the extension and recreates it in the test
databases), and runs its tests with `cargo test --no-fail-fast`, with a
time limit (a hang counts as caught: the guard that keeps a wait bounded is
gone). A mutation SURVIVES if its tests pass with the guard removed; the
runner exits 1 if any does. It starts the two test clusters itself
(scripts/pg-cluster.sh, as scripts/test.sh does) and stops them at the end.

Not run in CI (it rebuilds once per mutation). On the 2-core machine,
with the build cache warm (after scripts/test.sh), the first eight
mutations below took 1 min 34 s and their baselines 1 min; a cold cache adds the
first build. docs/design.md's mutation tables name the guards; this list
is the part of them that is re-runnable (the rest were /tmp scripts).
"""
import os
import pathlib
import subprocess
import sys

root = pathlib.Path(__file__).resolve().parent.parent
PG1 = "postgresql://postgres@127.0.0.1:54329/alkblobs_test"
PG2 = "postgresql://postgres@127.0.0.1:54330/alkblobs_test"

# (id, what the mutation removes, file, find, replace, kind, tests)
# kind: "rust" (the client: tests rebuild it), "ext" (sql/ or pg_ext/:
# reinstall the extension) or "sqlonly" (sql/: the SQL-only install made
# afresh on its managed-like cluster, scripts/sql-only-cluster.sh, whose
# env the tests get). tests: (cargo arguments, env) pairs.
PG_TESTS = ["-p", "alkblobs-tests", "--features", "pg"]
MUTATIONS = [
    ("publication-pin",
     "a put publishes without its pin (every put path goes through Publication)",
     "client/src/store/publication.rs",
     "let pin = arbiter.pin(tier, &keys).await?;",
     "let pin = arbiter.pin(tier, &[]).await?;",
     "rust",
     [(["-p", "alkblobs-tests", "--test", "gc", "--", "a_put_in_flight", "every_put_path"], {})]),
    ("local-file-fsync",
     "the local engine publishes a staging file without fsyncing its bytes (a power cut leaves an empty blob under its name)",
     "client/src/backend/local.rs",
     "        if self.durable() {\n            file.sync_all().map_err(sync_err)?;\n        }",
     "        if false {\n            file.sync_all().map_err(sync_err)?;\n        }",
     "rust",
     [(["-p", "alkblobs-tests", "--test", "powercut"], {})]),
    ("local-dir-fsync",
     "the local engine does not fsync the shard directory after publishing (a power cut loses an acknowledged put)",
     "client/src/backend/local.rs",
     "        if outcome == PutOutcome::Created && self.durable() {\n            self.sync_dir(leaf)?;",
     "        if outcome == PutOutcome::Created && false {\n            self.sync_dir(leaf)?;",
     "rust",
     [(["-p", "alkblobs-tests", "--test", "powercut"], {})]),
    ("sqlite-synchronous",
     "the durable sqlite engine commits with synchronous=OFF (a power cut loses acknowledged kv puts)",
     "client/src/backend/sqlite/mod.rs",
     'Durability::Durable => "FULL",',
     'Durability::Durable => "OFF",',
     "rust",
     [(["-p", "alkblobs-tests", "--test", "powercut"], {})]),
    ("sqlite-database",
     "the sqlite engine does not say it has a database (StoreBuilder::kv keeps roots and staged rows in process)",
     "client/src/backend/sqlite/engine.rs",
     "    fn sqlite_database(&self) -> Option<&SqliteBackend> {\n        Some(self)",
     "    fn sqlite_database(&self) -> Option<&SqliteBackend> {\n        None",
     "rust",
     [(["-p", "alkblobs-tests", "--test", "arbiters", "--", "behind_a_pointer"], {})]),
    ("sqlite-put-hook",
     "the sqlite engine never runs its companion's put hook (a re-put keeps its staged row)",
     "client/src/backend/sqlite/mod.rs",
     "self.hook.filter(|_| self.hook_active).map(|h| h.on_put)",
     "self.hook.filter(|_| false).map(|h| h.on_put)",
     "rust",
     [(["-p", "alkblobs-tests", "--test", "gc", "--", "a_re_put_of_a_staged_key_gets_a_fresh_window"], {})]),
    ("driver-kinds",
     "driver I/O and connect errors not classified as Unavailable",
     "client/src/pg/errors.rs",
     '"error connecting to server" => DriverKind::Connect,',
     '"error connecting to server" => DriverKind::Other,',
     "rust",
     [(PG_TESTS + ["--test", "pg_restart", "--", "refused"], {"ALKBLOBS_PG_URL": PG1})]),
    ("adopt",
     "no adoption after a server start or a restore (pins lapse, windows end while nothing could renew)",
     "sql/api/10-helpers.sql",
     "    RETURN pl.mode = 'single'\n        OR (pl.seen_incarnation",
     "    RETURN true OR pl.mode = 'single'\n        OR (pl.seen_incarnation",
     "ext",
     [(PG_TESTS + ["--test", "pg_restore"], {"ALKBLOBS_PG_URL": PG1, "ALKBLOBS_PG_URL_OTHER": PG2}),
      (PG_TESTS + ["--test", "pg_restart", "--", "outage"], {"ALKBLOBS_PG_URL": PG1})]),
    ("upload-xid",
     "a restored upload's foreign transaction id reaches pg_xact_status (22023)",
     "sql/api/60-large-objects.sql",
     "EXCEPTION WHEN invalid_parameter_value THEN\n    RETURN false;  -- \"transaction ID",
     "EXCEPTION WHEN division_by_zero THEN\n    RETURN false;  -- \"transaction ID",
     "ext",
     [(PG_TESTS + ["--test", "pg_restore", "--", "another_cluster"], {"ALKBLOBS_PG_URL": PG1, "ALKBLOBS_PG_URL_OTHER": PG2})]),
    ("sweep-all-operators",
     "alkblobs_sweep_all uses an unqualified operator (the caller's search_path resolves it)",
     "sql/api/90-sweep.sql",
     "calls := calls OPERATOR(pg_catalog.+) 1;",
     "calls := calls + 1;",
     "ext",
     [(PG_TESTS + ["--test", "pg_privileges", "--", "a_schema_before_pg_catalog"], {"ALKBLOBS_PG_URL": PG1})]),
    ("pin-again",
     "a pin taken again takes the new expiry even when it is sooner (the one source of every put path's pin upsert)",
     "sql/api/30-puts-and-pins.sql",
     "-- @source pin(again): ON CONFLICT ON CONSTRAINT pins_pkey DO UPDATE SET expires_at = greatest(pn.expires_at, EXCLUDED.expires_at)",
     "-- @source pin(again): ON CONFLICT ON CONSTRAINT pins_pkey DO UPDATE SET expires_at = EXCLUDED.expires_at",
     "ext",
     [(PG_TESTS + ["--test", "pg_hotpaths", "--", "never_shortens"], {"ALKBLOBS_PG_URL": PG1})]),
    ("put-many-retry",
     "alkblobs_put_many does not run its pass again when a key was deleted under it",
     "sql/api/30-puts-and-pins.sql",
     "                IF cardinality(present) < cardinality(others) THEN\n                    RAISE EXCEPTION 'a key was deleted under the batch'",
     "                IF false THEN\n                    RAISE EXCEPTION 'a key was deleted under the batch'",
     "ext",
     [(PG_TESTS + ["--test", "pg_races", "--", "put_many_batches"], {"ALKBLOBS_PG_URL": PG1})]),
    ("pin-role-names",
     "pins record their role as a regrole (a missing role makes the pins table fail to restore)",
     "sql/bootstrap.sql",
     "    role       name NOT NULL,\n    owner      text NOT NULL",
     "    role       regrole NOT NULL,\n    owner      text NOT NULL",
     "ext",
     [(PG_TESTS + ["--test", "pg_restore", "--", "another_cluster"], {"ALKBLOBS_PG_URL": PG1, "ALKBLOBS_PG_URL_OTHER": PG2})]),
    ("scheduler-guc",
     "the library defines its postmaster-only setting when it is not preloaded (CREATE EXTENSION fails at FATAL)",
     "pg_ext/src/scheduler.rs",
     "    if preloading {\n        PRELOADED.store(true",
     "    if true {\n        PRELOADED.store(preloading",
     "ext",
     [(PG_TESTS + ["--test", "pg_default_server"], {"ALKBLOBS_PG_URL": PG2})]),
    ("sql-only-other-bytes",
     "where keys are trusted, a put of a present key with other bytes answers \"present\" (a forged value squats the key)",
     "sql/api/30-puts-and-pins.sql",
     "IF actual IS NULL AND NOT alkblobs.holds(pl.id, $2, $3, NULL, NULL) THEN",
     "IF false THEN",
     "sqlonly",
     [(PG_TESTS + ["--test", "pg_sql_only", "--", "other_bytes"], {})]),
    ("incarnation-relid",
     "a restored row of alkblobs.incarnation passes for this installation's (a SQL-only restore is not adopted; lapsed pins' content is deleted)",
     "sql/api/10-helpers.sql",
     "    SELECT i.id FROM alkblobs.incarnation i WHERE i.relid OPERATOR(pg_catalog.=) 'alkblobs.incarnation'::pg_catalog.regclass",
     "    SELECT i.id FROM alkblobs.incarnation i",
     "sqlonly",
     [(PG_TESTS + ["--test", "pg_sql_only", "--", "dump_restored"], {})]),
    ("sql-only-search-path",
     "the SQL-only install script runs in the installer's search_path (a schema before pg_catalog lends it operators)",
     "scripts/gen-sql-only.py",
     r'"SET LOCAL search_path = pg_catalog, public, pg_temp;\n",',
     '"",',
     "sqlonly",
     [(PG_TESTS + ["--test", "pg_sql_only", "--", "whatever_the_installers_search_path"], {})]),
]


def sh(cmd, env=None, timeout=None, quiet=False):
    e = dict(os.environ)
    e.update(env or {})
    out = subprocess.DEVNULL if quiet else None
    return subprocess.run(cmd, cwd=root, env=e, timeout=timeout, stdout=out, stderr=out).returncode


def clusters(action):
    sh(["scripts/pg-cluster.sh", action], quiet=True)
    sh(["scripts/pg-cluster.sh", action], env={"ALKBLOBS_PG_PRELOAD": "0", "ALKBLOBS_PG_PORT": "54330"}, quiet=True)


def install_extension():
    if sh(["scripts/install-extension.sh"], quiet=True) != 0:
        raise SystemExit("cannot install the extension")
    # A fresh extension in the two test databases (restarting the clusters
    # also loads a rebuilt library into the preloading one).
    clusters("stop")
    clusters("start")
    for url in (PG1, PG2):
        sh(["psql", "-X", "-q", url, "-c", "DROP EXTENSION IF EXISTS alkblobs CASCADE", "-c", "CREATE EXTENSION alkblobs"], quiet=True)


def sql_only_cluster():
    """Makes the SQL-only install afresh; returns the env its tests read."""
    r = subprocess.run(["scripts/sql-only-cluster.sh", "start"], cwd=root, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit("cannot make the SQL-only cluster:\n" + r.stderr)
    return dict(line.split("=", 1) for line in r.stdout.split())


def run(m, baseline=False):
    mid, what, rel, find, replace, kind, tests = m
    path = root / rel
    original = path.read_text()
    if original.count(find) != 1:
        print(f"  {mid}: the text to mutate occurs {original.count(find)} times in {rel}: update the runner")
        return "broken"
    api = {f: f.read_text() for f in (root / "sql" / "api").glob("*.sql")}
    try:
        if not baseline:
            path.write_text(original.replace(find, replace))
            if kind == "ext":
                # A mutated `-- @source` rule reaches its inlined copies.
                sh(["scripts/gen-upgrade.py", "--inline"], quiet=True)
                install_extension()
        extra = sql_only_cluster() if kind == "sqlonly" else {}
        caught = False
        for args, env in tests:
            env = {**env, **extra}
            # A mutation that does not build proves nothing: build first.
            build = args[: args.index("--")] if "--" in args else args
            if sh(["cargo", "test", "--no-run"] + build, env=env, quiet=True) != 0:
                print(f"  {mid}: the mutated code does not build: update the runner")
                return "broken"
            try:
                rc = sh(["cargo", "test", "--no-fail-fast"] + args, env=env, timeout=600, quiet=True)
            except subprocess.TimeoutExpired:
                rc = -1
            if rc != 0:
                caught = True
        if baseline:
            return "FAILS UNMUTATED" if caught else "passes"
        return "caught" if caught else "SURVIVED"
    finally:
        path.write_text(original)
        for f, text in api.items():
            if f.read_text() != text:
                f.write_text(text)


def main():
    baseline = "--baseline" in sys.argv
    args = [a for a in sys.argv[1:] if a != "--baseline"]
    if "--list" in args:
        for m in MUTATIONS:
            print(f"{m[0]:22} {m[1]}")
        return 0
    chosen = [m for m in MUTATIONS if not args or m[0] in args]
    if args and len(chosen) != len(args):
        print("unknown mutation id; --list names them", file=sys.stderr)
        return 2
    clusters("stop")
    clusters("start")
    results = []
    try:
        for m in chosen:
            print(f"mutation {m[0]}: {m[1]}", flush=True)
            r = run(m, baseline)
            print(f"  -> {r}", flush=True)
            results.append((m[0], r))
    finally:
        if not baseline and any(m[5] == "ext" for m in chosen):
            install_extension()  # the unmutated extension back
        clusters("stop")
        if any(m[5] == "sqlonly" for m in chosen):
            sh(["scripts/sql-only-cluster.sh", "stop"], quiet=True)
    want = "passes" if baseline else "caught"
    bad = [i for i, r in results if r != want]
    print(f"{len(results) - len(bad)} of {len(results)} " + ("baselines pass" if baseline else "mutations caught")
          + (f"; not: {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
