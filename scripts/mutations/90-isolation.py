# The isolation specs (tests/isolation/specs/, scripts/isolation.sh): the
# protocol's arbitration steps published as isolationtester permutations.
# Each mutation removes one guard the specs exercise; the specs named must
# fail (a permutation whose verdict ends `lost t`, or a step that no longer
# waits). The same guards are also covered by the Rust race suites
# (20-extension-issue-8.py and later); these entries check the specs.
ALL = [("isolation", s) for s in ("pin_vs_sweep", "liveness_vs_executor", "put_many_vs_sweep", "review_vs_unpin")]
MUTATIONS = [
    M(id="iso-recheck-off",
      what="the executor's re-check keeps nothing: every claimed key is deleted, pinned or referenced",
      file="sql/api/80-local-tier.sql",
      find="        INTO keep USING ks, p;\n    keep := coalesce(keep, '{}');",
      replace="        INTO keep USING ks, p;\n    keep := '{}';",
      kind="ext",
      tests=ALL),
    M(id="iso-pin-no-lock",
      what="alkblobs_pin reads the entry without locking it FOR KEY SHARE: it does not wait out an executor deleting it",
      file="sql/api/30-puts-and-pins.sql",
      find="    IF NOT alkblobs.lock_entry(pl.id, $2)\n       AND NOT (pl.large_tier",
      replace="    IF NOT EXISTS (SELECT 1 FROM alkblobs.entries e WHERE e.pool = pl.id AND e.key = $2)\n       AND NOT (pl.large_tier",
      kind="ext",
      tests=[("isolation", "pin_vs_sweep"), ("isolation", "review_vs_unpin")]),
    M(id="iso-guard-no-lock",
      what="the liveness guard reads the entry a new row names without locking it",
      file="sql/api/70-liveness.sql",
      find="        IF alkblobs.lock_entry(r.pool, k) THEN\n            CONTINUE;",
      replace="        IF EXISTS (SELECT 1 FROM alkblobs.entries e WHERE e.pool = r.pool AND e.key = k) THEN\n            CONTINUE;",
      kind="ext",
      tests=[("isolation", "liveness_vs_executor")]),
    M(id="iso-put-many-no-lock",
      what="put_many's re-check of the present keys takes no FOR KEY SHARE: it trusts an entry an executor is deleting",
      file="sql/api/30-puts-and-pins.sql",
      find="                     ORDER BY e.key FOR KEY SHARE) x;\n                IF cardinality(present) < cardinality(others) THEN",
      replace="                     ORDER BY e.key) x;\n                IF cardinality(present) < cardinality(others) THEN",
      kind="ext",
      tests=[("isolation", "put_many_vs_sweep")]),
    M(id="iso-claim-no-lock",
      what="the executor claims staged entries without FOR UPDATE SKIP LOCKED: it deletes an entry a pin or a liveness write holds",
      file="sql/api/90-sweep.sql",
      find="             WHERE e.pool = pl.id AND e.key = ANY(stl) ORDER BY e.key FOR UPDATE SKIP LOCKED) x;",
      replace="             WHERE e.pool = pl.id AND e.key = ANY(stl) ORDER BY e.key) x;",
      kind="ext",
      tests=ALL),
]

# The extension's own role check across majors (sql/bootstrap.sql): a role
# that may act as alkblobs_owner makes CREATE EXTENSION refuse.
MUTATIONS += [
    M(id="owner-members-unchecked",
      what="CREATE EXTENSION no longer refuses a member that can use alkblobs_owner's privileges (PostgreSQL 15's query)",
      file="sql/bootstrap.sql",
      find="                 WHERE m.roleid = (SELECT o.oid FROM pg_catalog.pg_roles o WHERE o.rolname = ''alkblobs_owner'')';\n",
      replace="                 WHERE m.roleid = (SELECT o.oid FROM pg_catalog.pg_roles o WHERE o.rolname = ''alkblobs_owner'') AND false';\n",
      kind="ext",
      create_in=[PG1],
      env={"ALKBLOBS_PG_URL": PG2},
      tests=["create_extension_refuses_while_a_role_can_act_as_alkblobs_owner"]),
]
