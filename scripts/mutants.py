#!/usr/bin/env python3
"""The mutation runner: removes one guard at a time and checks that the tests
named for it fail.

    scripts/mutants.py               every mutation in scripts/mutations/
    scripts/mutants.py ID ...        just those
    scripts/mutants.py --group G     those of scripts/mutations/G.py (repeatable)
    scripts/mutants.py --list        what there is
    scripts/mutants.py --check       only that every entry still applies
                                     (its text occurs once, its tests
                                     exist); scripts/test.sh runs it
    scripts/mutants.py --baseline    every mutation's tests without the
                                     mutation (they must pass, or a
                                     "caught" means nothing)

The mutations live in scripts/mutations/*.py, one file per part of the
protocol (the single-node arbiter and the engines; the extension's guards
of issue 8; its 0.4.0 audit guards; its 0.8.0 guards and the SQL-only
flavour's), each entry written as

    M(id=..., what=..., file=..., find=..., replace=..., kind=..., tests=[...])

Each mutation edits one file (`find` must occur exactly once; the edit is
undone afterwards, also on Ctrl-C) and rebuilds what it must:
- kind "rust": the client, which the tests rebuild;
- kind "ext": sql/ or pg_ext/, so the extension is reinstalled and created
  afresh in the test databases (a mutated `-- @source` rule reaches its
  inlined copies through gen-upgrade.py --inline);
- kind "sqlonly": sql/, run on the SQL-only install made afresh on its
  managed-like cluster (scripts/sql-only-cluster.sh), whose env the tests get.

`tests` names test functions (the runner finds the file that defines each
under tests/tests/ or client/tests/, and its package and features) or, for
a case the conformance macros stamp into several modules, a pair
(test target, filter); the target "lib" is the client's unit tests, and
("isolation", spec) an isolation spec of tests/isolation/specs/
(scripts/isolation.sh, on the preloading cluster). A test run past `timeout` seconds (600 unless the
entry says) counts as failed: a hang is what removing a guard that keeps a
wait bounded looks like. A mutation SURVIVES if all its tests pass with the
guard removed; the runner exits 1 if any does, or if a mutation no longer
applies or builds ("broken": update the entry).

Not run in CI (it rebuilds once per mutation). It starts the two test
clusters itself (scripts/pg-cluster.sh, as scripts/test.sh does) and stops
them at the end; run it alone (it reinstalls the extension system-wide).
Timings on the 2-core machine with the build cache warm (after
scripts/test.sh) are in docs/design.md, "How the guards are tested".
"""
import os
import pathlib
import re
import subprocess
import sys
import time

root = pathlib.Path(__file__).resolve().parent.parent
PG1 = "postgresql://postgres@127.0.0.1:54329/alkblobs_test"
PG2 = "postgresql://postgres@127.0.0.1:54330/alkblobs_test"
KINDS = ("rust", "ext", "sqlonly")


def M(id, what, file, find, replace, kind, tests, env=None, timeout=600, create_in=None, s3="garage"):
    assert kind in KINDS, f"{id}: kind {kind!r}"
    assert tests, f"{id}: names no test"
    # s3: which S3 server the entry's s3 suites run against: Garage, or
    # moto ("emulator", scripts/s3-emulator.sh), which honours the
    # conditional creates Garage ignores.
    assert s3 in ("garage", "emulator"), f"{id}: s3 {s3!r}"
    return dict(id=id, what=what, file=file, find=find, replace=replace, kind=kind,
                tests=tests, env=env or {}, timeout=timeout, create_in=create_in, s3=s3)


def load():
    """Every mutation, by group (the file's stem), in file-name order."""
    out = []
    for f in sorted((root / "scripts" / "mutations").glob("*.py")):
        ns = {"M": M, "PG1": PG1, "PG2": PG2}
        exec(compile(f.read_text(), str(f), "exec"), ns)
        for m in ns["MUTATIONS"]:
            out.append({**m, "group": f.stem})
    ids = [m["id"] for m in out]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        raise SystemExit(f"mutation ids used twice: {', '.join(sorted(dup))}")
    return out


def test_targets():
    """fn name -> (package args, test target) for every test file."""
    found = {}
    dirs = [(root / "tests" / "tests", "alkblobs-tests"), (root / "client" / "tests", "alkblobs")]
    for d, package in dirs:
        for f in sorted(d.glob("*.rs")):
            for name in re.findall(r"^\s*(?:pub\s+)?(?:async\s+)?fn\s+([a-z0-9_]+)\s*\(", f.read_text(), re.M):
                found.setdefault(name, []).append((package, f.stem))
    return found


def package_args(package, target):
    args = ["-p", package]
    if package == "alkblobs-tests" and target in S3_PG_TARGETS:
        args += ["--features", "pg,s3"]
    elif package == "alkblobs-tests" and target.startswith("s3_"):
        args += ["--features", "s3"]
    elif package == "alkblobs-tests" and target.startswith("pg_"):
        args += ["--features", "pg"]
    if package == "alkblobs" and target in ("cli_pg", "cli_s3"):
        args += ["--features", "pg-tests"]
    if target == "lib":
        return args + ["--lib"]
    return args + ["--test", target]


def runs(m, targets):
    """[(cargo test arguments, filters)] for a mutation's tests, one per target."""
    by_target = {}
    for t in m["tests"]:
        if isinstance(t, tuple) and t[0] == "isolation":
            if not (root / "tests" / "isolation" / "specs" / f"{t[1]}.spec").exists():
                raise LookupError(f"no isolation spec {t[1]}")
            by_target.setdefault(("isolation", "isolation"), []).append(t[1])
            continue
        if isinstance(t, tuple):
            target, filt = t
            # ("lib", filter): the client's unit tests.
            package = "alkblobs" if target == "lib" or (root / "client" / "tests" / f"{target}.rs").exists() else "alkblobs-tests"
        else:
            where = targets.get(t, [])
            if len(where) != 1:
                raise LookupError(f"test {t} is defined in {len(where)} test files")
            (package, target), filt = where[0], t
        by_target.setdefault((package, target), []).append(filt)
    return [(["isolation"] if p == "isolation" else package_args(p, t), filters)
            for (p, t), filters in by_target.items()]


def sh(cmd, env=None, timeout=None, quiet=False):
    e = dict(os.environ)
    e.update(env or {})
    out = subprocess.DEVNULL if quiet else None
    return subprocess.run(cmd, cwd=root, env=e, timeout=timeout, stdout=out, stderr=out).returncode


def clusters(action):
    sh(["scripts/pg-cluster.sh", action], quiet=True)
    sh(["scripts/pg-cluster.sh", action], env={"ALKBLOBS_PG_PRELOAD": "0", "ALKBLOBS_PG_PORT": "54330"}, quiet=True)


def install_extension(create_in=None):
    """Installs the extension and creates it afresh in `create_in` (both test
    databases unless an entry says: a mutation that breaks CREATE EXTENSION
    on the non-preloading cluster leaves that to its test)."""
    if sh(["scripts/install-extension.sh"], quiet=True) != 0:
        return False
    # A fresh extension in the two test databases (restarting the clusters
    # also loads a rebuilt library into the preloading one).
    clusters("stop")
    clusters("start")
    for url in create_in or (PG1, PG2):
        if sh(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", url, "-c", "DROP EXTENSION IF EXISTS alkblobs CASCADE",
               "-c", "CREATE EXTENSION alkblobs"], quiet=True) != 0:
            return False
    return True


def sql_only_cluster():
    """Makes the SQL-only install afresh; returns the env its tests read, or None."""
    r = subprocess.run(["scripts/sql-only-cluster.sh", "start"], cwd=root, capture_output=True, text=True)
    if r.returncode != 0:
        return None
    return dict(line.split("=", 1) for line in r.stdout.split())


# The suites that need both PostgreSQL and the S3 server.
S3_PG_TARGETS = ("pg_s3", "pg_partition")


def uses_s3(m, targets):
    """Whether a mutation's tests need the S3 server."""
    try:
        return any("s3" in args[-1] or args[-1] in S3_PG_TARGETS for args, _ in runs(m, targets))
    except LookupError:
        return False  # reported as broken when it runs


def s3_server(action, script="scripts/s3-server.sh"):
    """Starts (returning the env its tests read) or stops a test S3 server."""
    r = subprocess.run([script, action], cwd=root, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{script} {action} failed: {r.stderr.strip()}")
    return dict(line.split("=", 1) for line in r.stdout.split())


# The environment of each S3 server the chosen entries need, by name.
S3_ENV = {"garage": {}, "emulator": {}}


def run(m, targets, baseline=False):
    path = root / m["file"]
    original = path.read_text()
    # One edit, or several (lists of finds and replacements, in order):
    # a guard that is two checks in one file.
    finds = m["find"] if isinstance(m["find"], list) else [m["find"]]
    replaces = m["replace"] if isinstance(m["replace"], list) else [m["replace"]]
    mutated = original
    for find, replace in zip(finds, replaces, strict=True):
        n = mutated.count(find)
        if n != 1:
            print(f"  the text to mutate occurs {n} times in {m['file']}: update the entry")
            return "broken"
        mutated = mutated.replace(find, replace)
    try:
        plan = runs(m, targets)
    except LookupError as e:
        print(f"  {e}: update the entry")
        return "broken"
    api = {f: f.read_text() for f in (root / "sql" / "api").glob("*.sql")}
    try:
        if not baseline:
            path.write_text(mutated)
        if m["kind"] == "ext" and not baseline:
            # A mutated `-- @source` rule reaches its inlined copies.
            sh(["scripts/gen-upgrade.py", "--inline"], quiet=True)
            if not install_extension(m["create_in"]):
                print("  the mutated extension does not install: update the entry")
                return "broken"
        extra = {}
        if m["kind"] == "sqlonly":
            extra = sql_only_cluster()
            if extra is None:
                print("  the mutated SQL-only install fails: update the entry")
                return "broken"
        caught = []
        for args, filters in plan:
            env = {"ALKBLOBS_PG_URL": PG1, "ALKBLOBS_PG_URL_OTHER": PG2, **S3_ENV[m["s3"]], **m["env"], **extra}
            if args == ["isolation"]:
                # One spec at a time, so the report names those that failed.
                for spec in filters:
                    try:
                        rc = sh(["scripts/isolation.sh", spec], env={"ALKBLOBS_PG_PORT": "54329"},
                                timeout=m["timeout"], quiet=True)
                    except subprocess.TimeoutExpired:
                        rc = "timeout"
                    if rc != 0:
                        caught.append(f"isolation/{spec}{' (hung)' if rc == 'timeout' else ''}")
                continue
            # A mutation that does not build proves nothing: build first.
            if sh(["cargo", "test", "--no-run"] + args, env=env, quiet=True) != 0:
                print(f"  the mutated code does not build ({' '.join(args)}): update the entry")
                return "broken"
            try:
                rc = sh(["cargo", "test", "--no-fail-fast"] + args + ["--"] + filters, env=env,
                        timeout=m["timeout"], quiet=True)
            except subprocess.TimeoutExpired:
                rc = "timeout"
            if rc != 0:
                caught.append(f"{args[-1]}{' (hung)' if rc == 'timeout' else ''}")
        if baseline:
            return "FAILS UNMUTATED: " + ", ".join(caught) if caught else "passes"
        return "caught by " + ", ".join(caught) if caught else "SURVIVED"
    finally:
        path.write_text(original)
        for f, text in api.items():
            if f.read_text() != text:
                f.write_text(text)


def main():
    argv = sys.argv[1:]
    baseline = "--baseline" in argv
    argv = [a for a in argv if a != "--baseline"]
    every = load()
    if "--list" in argv:
        for m in every:
            print(f"{m['group']:12} {m['id']:34} {m['what']}")
        return 0
    if "--check" in argv:
        targets = test_targets()
        stale = []
        for m in every:
            text = (root / m["file"]).read_text() if (root / m["file"]).exists() else ""
            finds = m["find"] if isinstance(m["find"], list) else [m["find"]]
            for find in finds:
                if text.count(find) != 1:
                    stale.append(f"{m['id']}: its text occurs {text.count(find)} times in {m['file']}")
                text = text.replace(find, "")
            try:
                runs(m, targets)
            except LookupError as e:
                stale.append(f"{m['id']}: {e}")
        for line in stale:
            print(line, file=sys.stderr)
        print(f"mutations: {len(every)} entries, {len(stale)} stale")
        return 1 if stale else 0
    if "--group" in argv:
        groups = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--group"]
        known = {m["group"] for m in every}
        for g in groups:
            if g not in known:
                print(f"no group {g}; --list names them", file=sys.stderr)
                return 2
        chosen = [m for m in every if m["group"] in groups]
    else:
        chosen = [m for m in every if not argv or m["id"] in argv]
        if argv and len(chosen) != len(argv):
            print("unknown mutation id; --list names them", file=sys.stderr)
            return 2
    targets = test_targets()
    clusters("stop")
    clusters("start")
    s3 = {m["s3"] for m in chosen if uses_s3(m, targets)}
    if "garage" in s3:
        S3_ENV["garage"] = s3_server("start")
    if "emulator" in s3:
        S3_ENV["emulator"] = s3_server("start", "scripts/s3-emulator.sh")
    if baseline and any(m["kind"] == "ext" for m in chosen) and not install_extension():
        raise SystemExit("cannot install the extension")
    results = []
    started = time.time()
    try:
        for m in chosen:
            t0 = time.time()
            print(f"mutation {m['id']}: {m['what']}", flush=True)
            r = run(m, targets, baseline)
            print(f"  -> {r} ({time.time() - t0:.0f} s)", flush=True)
            results.append((m["id"], r))
    finally:
        if not baseline and any(m["kind"] == "ext" for m in chosen):
            sh(["scripts/gen-upgrade.py", "--inline"], quiet=True)
            install_extension()  # the unmutated extension back
        clusters("stop")
        if "garage" in s3:
            s3_server("stop")
        if "emulator" in s3:
            s3_server("stop", "scripts/s3-emulator.sh")
        if any(m["kind"] == "sqlonly" for m in chosen):
            sh(["scripts/sql-only-cluster.sh", "stop"], quiet=True)
    want = "passes" if baseline else "caught"
    bad = [i for i, r in results if not r.startswith(want)]
    print(f"{len(results) - len(bad)} of {len(results)} "
          + ("baselines pass" if baseline else "mutations caught")
          + f" in {time.time() - started:.0f} s"
          + (f"; not: {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
