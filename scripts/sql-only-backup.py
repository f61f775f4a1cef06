#!/usr/bin/env python3
"""Dump and restore of a database with the SQL-only install, run as its
installing role (a managed service's admin role: CREATEROLE, owner of the
database), never as a superuser.

    scripts/sql-only-backup.py dump SRC_URL OUT      writes OUT.dump (pg_dump
                                                     custom format, large
                                                     objects in), OUT.roles.sql
                                                     and OUT.owners
    scripts/sql-only-backup.py restore OUT DST_URL   restores them into DST_URL,
                                                     an empty database the
                                                     same role owns

The PostgreSQL client programs (psql, pg_dump, pg_dumpall, pg_restore) are
those in $ALKBLOBS_PG_BIN if set (use the server's major's: pg_dump refuses
a newer server), else those on PATH.

What it does that a plain pg_dump / pg_restore cannot (docs/operations.md,
"Dump and restore of the SQL-only flavour"):
* the installer reads only what it owns, so for the dump it is made a
  member of every role owning something in the database (alkblobs_owner,
  which owns the internal tables, sequences and large objects; each
  application role owning a table), and of none of them after;
* pg_cron's schema is left out (its job table has row-level security, and
  a job names the server it was made on): schedule each pool again with
  alkblobs_schedule_cron, as the role that scheduled it;
* the roles file is made loadable by a non-superuser (no superuser-only
  attributes, no role that exists already, no passwords);
* the restore makes the two schemas itself, with the rights alkblobs_owner
  needs while its objects are handed to it, and takes them back after.
A pool restored so is adopted at its first use (its row of
alkblobs.incarnation names another installation): every pin gets a fresh
TTL and every mark a fresh window, so the first sweep deletes nothing that
was protected when the dump was taken.
"""
import json
import re
import os
import subprocess
import sys


def run(cmd, **kw):
    if os.environ.get("ALKBLOBS_PG_BIN"):
        cmd = [os.path.join(os.environ["ALKBLOBS_PG_BIN"], cmd[0])] + cmd[1:]
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:2])} failed:\n{r.stderr.strip()}")
    return r.stdout


def psql(url, sql, **kw):
    return run(["psql", "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-d", url, "-c", sql], **kw)


OWNERS = """
SELECT string_agg(pg_catalog.quote_ident(r), ', ' ORDER BY r) FROM (
    SELECT pg_catalog.pg_get_userbyid(c.relowner) AS r FROM pg_catalog.pg_class c
      JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
     WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast', 'cron')
    UNION SELECT pg_catalog.pg_get_userbyid(p.proowner) FROM pg_catalog.pg_proc p
      JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
     WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'cron')
    UNION SELECT pg_catalog.pg_get_userbyid(m.lomowner) FROM pg_catalog.pg_largeobject_metadata m
    UNION SELECT 'alkblobs_owner') o
 WHERE r <> current_user AND NOT pg_catalog.pg_has_role(current_user, r, 'USAGE')
"""


# The schema privileges the restore grants for a while: (role, schema,
# privilege) for alkblobs_owner and every owner role; whether the source
# had each is kept, so the restore takes back exactly what it added.
def granted(url, roles):
    want = [(r, sch, priv) for r in roles for sch, priv in
            (("alkblobs", "USAGE"), ("alkblobs", "CREATE"), ("alkblobs_registration", "CREATE"), ("public", "CREATE"))]
    had = {}
    for r, sch, priv in want:
        q = (f"SELECT pg_catalog.has_schema_privilege({sql_literal(r)}, {sql_literal(sch)}, {sql_literal(priv)})")
        had[f"{r}|{sch}|{priv}"] = psql(url, q).strip() == "t"
    return had


def sql_literal(s):
    return "'" + s.replace("'", "''") + "'"


def dump(src, out):
    if psql(src, "SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user").strip() == "t":
        print("note: running as a superuser; the recipe is for the installing role", file=sys.stderr)
    owners = [o for o in psql(src, OWNERS).strip().split(", ") if o]
    had = granted(src, sorted(set(owners) | {"alkblobs_owner"}))
    if owners:
        psql(src, f"GRANT {', '.join(owners)} TO CURRENT_USER")
    try:
        run(["pg_dump", "-Fc", "-b", "-N", "cron", "-f", out + ".dump", "-d", src])
    finally:
        if owners:
            psql(src, f"REVOKE {', '.join(owners)} FROM CURRENT_USER")
    with open(out + ".owners", "w") as f:
        json.dump({"owners": owners, "had": had}, f, indent=1)
    # After the REVOKE: the installer's temporary memberships stay out.
    roles = run(["pg_dumpall", "--roles-only", "--no-role-passwords", "-d", src])
    with open(out + ".roles.sql", "w") as f:
        f.write(roles)
    print(out + ".dump")


def loadable_roles(text, me, existing, held=frozenset(), administered=frozenset()):
    """The roles file as a non-superuser may run it: no statement about a
    role that exists (its attributes there stay), the installer or a
    superuser; no superuser-only attribute."""
    keep = []
    for line in text.splitlines():
        m = re.match(r"^(CREATE|ALTER) ROLE (\"?[^\" ;]+\"?)", line)
        if m:
            name = m.group(2).strip('"')
            if name == me or name == "postgres" or name in existing:
                # A role the target has already keeps its attributes there
                # (since PostgreSQL 16 a CREATEROLE role may alter only the
                # roles it administers, and no attribute it lacks itself).
                continue
            if " SUPERUSER" in line:
                continue  # a superuser: the provider's, not ours to make
            # Superuser-only attributes, and the defaults of a role just
            # made (PostgreSQL 16 refuses even NOCREATEDB from a role
            # without CREATEDB).
            line = re.sub(r" (NOSUPERUSER|NOREPLICATION|NOBYPASSRLS|REPLICATION|BYPASSRLS|NOCREATEDB|NOCREATEROLE)\b", "", line)
        elif line.startswith("GRANT "):
            g = re.match(r"^GRANT (\"?[^\" ;]+\"?) TO (\"?[^\" ;]+\"?)", line)
            if g:
                role, member = g.group(1).strip('"'), g.group(2).strip('"')
                # The installer's own memberships are the target's, as are
                # those it holds already; since PostgreSQL 16 an existing
                # role is granted only by a role with ADMIN OPTION on it.
                # Any other is kept: an application role's membership in
                # alkblobs_writer is what its access rests on.
                if member == me or (role, member) in held or (
                        role in existing and role not in administered):
                    print(f"restore: left out (the target's own): {line}", file=sys.stderr)
                    continue
            line = re.sub(r" GRANTED BY \"?[^\" ;]+\"?", "", line)
        keep.append(line)
    return "\n".join(keep) + "\n"


def restore(out, dst):
    me = psql(dst, "SELECT current_user").strip()
    existing = set(psql(dst, "SELECT rolname FROM pg_catalog.pg_roles").split())
    held = {tuple(l.split("|")) for l in psql(dst,
            "SELECT r.rolname, m.rolname FROM pg_catalog.pg_auth_members a"
            " JOIN pg_catalog.pg_roles r ON r.oid = a.roleid JOIN pg_catalog.pg_roles m ON m.oid = a.member").split()}
    administered = set(psql(dst,
            "SELECT rolname FROM pg_catalog.pg_roles"
            " WHERE pg_catalog.pg_has_role(current_user, oid, 'MEMBER WITH ADMIN OPTION')").split())
    roles = loadable_roles(open(out + ".roles.sql").read(), me, existing, held, administered)
    # A membership granted twice only warns; a role made twice is skipped above.
    run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", dst], input=roles)
    meta = json.load(open(out + ".owners"))
    owners, had = meta["owners"], meta["had"]
    listing = run(["pg_restore", "-l", out + ".dump"])
    drop = re.compile(r" (EXTENSION (- )?pg_cron |COMMENT - EXTENSION pg_cron|SCHEMA - cron |SCHEMA - alkblobs(_registration)? )")
    kept = "\n".join(l for l in listing.splitlines() if not drop.search(l)) + "\n"
    list_file = out + ".list"
    with open(list_file, "w") as f:
        f.write(kept)
    # What the restore adds for a while: membership of every owner (to hand
    # objects to them), alkblobs_owner's use of its schema, and CREATE
    # where owners' objects go; taken back after, unless the source had it.
    pre = [f"GRANT {', '.join(owners)} TO CURRENT_USER;"] if owners else []
    pre += ["CREATE SCHEMA alkblobs;", "CREATE SCHEMA alkblobs_registration;"]
    post = []
    for k, source_had in had.items():
        role, schema, priv = k.split("|")
        pre.append(f"GRANT {priv} ON SCHEMA {schema} TO {role};")
        if not source_had:
            post.append(f"REVOKE {priv} ON SCHEMA {schema} FROM {role};")
    if owners:
        post.append(f"REVOKE {', '.join(owners)} FROM CURRENT_USER;")
    psql(dst, "\n".join(pre))
    try:
        run(["pg_restore", "--exit-on-error", "--single-transaction", "-L", list_file, "-d", dst, out + ".dump"])
    finally:
        psql(dst, "\n".join(post))
    print(f"restored {out}.dump into {dst}; schedule pg_cron sweeps again with alkblobs_schedule_cron")


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "dump":
        dump(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "restore":
        restore(sys.argv[2], sys.argv[3])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
