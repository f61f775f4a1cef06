#!/usr/bin/env python3
"""Writes the upgrade script of the extension's current version.

    scripts/gen-upgrade.py             target/sql/alkblobs--FROM--TO.sql (TO:
                                       pg_ext/Cargo.toml's version, FROM: the
                                       delta sql/upgrade/FROM--TO.sql)
    scripts/gen-upgrade.py --release   the same into sql/released/, where it
                                       is committed and never edited again
    scripts/gen-upgrade.py --inline    first rewrites the inlined copies of a
                                       rule from its one source (see below)

Every run first checks the inlined copies of the access rules (each between
/* @may(<need>) */ and /* @end */ in sql/api/*.sql) against their one
source, the `-- @source` lines of sql/api/10-helpers.sql.

The script is the hand-written schema delta sql/upgrade/FROM--TO.sql
followed by every function, procedure, view and event trigger of
sql/api/*.sql (in file-name order) and sql/finalize.sql re-created
(CREATE OR REPLACE; an event trigger is dropped and created again), so an
upgraded database runs exactly the code a fresh install runs, and it ends,
as the install does, with alkblobs.apply_policy(). The delta drops what the
new version no longer has and every function whose argument list or result
type changed (CREATE OR REPLACE cannot change those).

Until the version is released the script is generated, never committed
(one copy of the work in progress: the sources): scripts/install-extension.sh
and scripts/package.sh run this and install the result beside the released
scripts. Cutting a release is `--release` and committing the file.
"""
import pathlib
import re
import sys

root = pathlib.Path(__file__).resolve().parent.parent


def recreate(text: str) -> str:
    text = re.sub(r"^CREATE FUNCTION ", "CREATE OR REPLACE FUNCTION ", text, flags=re.M)
    text = re.sub(r"^CREATE PROCEDURE ", "CREATE OR REPLACE PROCEDURE ", text, flags=re.M)
    text = re.sub(r"^CREATE VIEW ", "CREATE OR REPLACE VIEW ", text, flags=re.M)
    text = re.sub(
        r"^CREATE EVENT TRIGGER (\w+)",
        r"DROP EVENT TRIGGER IF EXISTS \1;\nCREATE EVENT TRIGGER \1",
        text,
        flags=re.M,
    )
    return text


def api_files() -> list:
    """sql/api/*.sql in file-name order, after checking that pg_ext/src/lib.rs
    declares exactly these files, in this order (the install loads what
    lib.rs declares; an upgrade must run the same code)."""
    files = sorted(p.name for p in (root / "sql" / "api").glob("*.sql"))
    declared = re.findall(r'"\.\./\.\./sql/api/([^"]+)"', (root / "pg_ext" / "src" / "lib.rs").read_text())
    if declared != files:
        raise SystemExit(f"pg_ext/src/lib.rs declares sql/api files {declared}, but sql/api holds {files}")
    return files


def inline_copies(fix: bool) -> None:
    """Checks (or with fix, rewrites) every copy of an inlined rule against its
    one source in sql/api/10-helpers.sql (`-- @source NAME: TEXT`): each copy
    stands between /* @NAME */ and /* @end */. Exits on a difference."""
    norm = lambda t: " ".join(t.split())
    sources = {}
    for f in api_files():
        for m in re.finditer(r"^-- @source ([\w()]+): (.*)$", (root / "sql" / "api" / f).read_text(), re.M):
            sources[m.group(1)] = m.group(2).strip()
    if not sources:
        raise SystemExit("no -- @source lines in sql/api/*.sql")
    bad, seen = [], set()
    for f in api_files():
        path = root / "sql" / "api" / f
        text = path.read_text()

        def check(m):
            name, body = m.group(1), m.group(2)
            if name not in sources:
                raise SystemExit(f"{f}: /* @{name} */ has no -- @source {name}")
            seen.add(name)
            if norm(body) != norm(sources[name]):
                bad.append(f"{f}: the copy of {name} differs from its source")
                if fix:
                    return f"/* @{name} */ {sources[name]} /* @end */"
            return m.group(0)

        new = re.sub(r"/\* @([\w()]+) \*/(.*?)/\* @end \*/", check, text, flags=re.S)
        if fix and new != text:
            path.write_text(new)
    unused = set(sources) - seen
    if unused:
        raise SystemExit(f"sources nobody copies: {sorted(unused)}")
    if bad and not fix:
        raise SystemExit("\n".join(bad) + "\n(scripts/gen-upgrade.py --inline rewrites them from the source)")


def api_text() -> str:
    return "".join((root / "sql" / "api" / f).read_text() for f in api_files())


def main() -> int:
    inline_copies(fix="--inline" in sys.argv)
    cargo = (root / "pg_ext" / "Cargo.toml").read_text()
    new = re.search(r'^version = "([0-9.]+)"', cargo, re.M).group(1)
    deltas = sorted((root / "sql" / "upgrade").glob(f"*--{new}.sql"))
    if len(deltas) != 1:
        print(f"need exactly one sql/upgrade/*--{new}.sql, found {[d.name for d in deltas]}", file=sys.stderr)
        return 2
    old = deltas[0].name.split("--")[0]
    delta = deltas[0].read_text()
    out = [
        f"-- alkblobs {old} -> {new}. Generated by scripts/gen-upgrade.py from\n"
        f"-- sql/upgrade/{old}--{new}.sql, sql/api/*.sql and sql/finalize.sql; never\n"
        "-- edit it by hand.\n\n",
        delta,
        f"\n-- The {new} functions (sql/api/*.sql) " + "-" * 36 + "\n\n",
        recreate(api_text()),
        f"\n-- The {new} views, roles and policy (sql/finalize.sql) " + "-" * 20 + "\n\n",
        recreate((root / "sql" / "finalize.sql").read_text()),
    ]
    text = "".join(out)
    name = f"alkblobs--{old}--{new}.sql"
    released = root / "sql" / "released" / name
    if "--release" in sys.argv:
        target = released
    else:
        if released.exists() and released.read_text() != text:
            print(f"{released} is released and frozen, but the sources now make another script: "
                  f"bump pg_ext/Cargo.toml's version and write sql/upgrade/{new}--NEXT.sql", file=sys.stderr)
            return 1
        target = root / "target" / "sql" / name
        target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
