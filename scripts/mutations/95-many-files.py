"""Many files: `put` of a tree prints a key only once its batch is durable,
and the embedded store gives the disk back after a gc (docs/operations.md,
"The embedded store: many files, and the disk after a gc")."""
# (M is the runner's: scripts/mutants.py loads this file.)
MUTATIONS = [
    # The contract "a printed key is durable": keys printed as the batch is
    # read, before its commit (the sleep holds the window open for the
    # kill).
    M(id="put-prints-before-commit",
      what="put -r prints a batch's keys before the batch commits (a kill part-way leaves printed keys that were never stored)",
      file="client/src/bin/alkblobs/put.rs",
      find="        let many = self.store.put_many(b.blobs).await?;",
      replace="        for v in &b.blobs {\n            let _ = writeln!(self.out, \"{}\", blake3::hash(v).to_hex());\n        }\n        let _ = self.out.flush();\n        tokio::time::sleep(Duration::from_millis(300)).await;\n        let many = self.store.put_many(b.blobs).await?;",
      kind="rust",
      tests=["a_put_r_killed_mid_run_leaves_every_printed_key_readable"]),
    M(id="sqlite-no-give-back",
      what="the sqlite engine does not free the pages a batch of deletions emptied (a gc gives no disk back)",
      file="client/src/backend/sqlite/engine.rs",
      find="        self.give_back().await?;",
      replace="",
      kind="rust",
      tests=["gc_gives_the_disk_back_and_compact_rewrites_an_older_store"]),
    M(id="sqlite-not-incremental",
      what="a new sqlite database is made without incremental auto-vacuum (freed pages stay until a VACUUM)",
      file="client/src/backend/sqlite/mod.rs",
      find='conn.pragma_update(None, "auto_vacuum", "INCREMENTAL")',
      replace='conn.pragma_update(None, "auto_vacuum", "NONE")',
      kind="rust",
      tests=["gc_gives_the_disk_back_and_compact_rewrites_an_older_store"]),
]
