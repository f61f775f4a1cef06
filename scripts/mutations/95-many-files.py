"""Many files: `put` of a tree prints a key only once its batch is durable,
and the embedded store gives the disk back after a gc (docs/operations.md,
"The embedded store: many files, and the disk after a gc")."""
# (M is the runner's: scripts/mutants.py loads this file.)
MUTATIONS = [
    # The contract "a printed key is durable": a batch's keys printed
    # before its commit instead of after (printed once, as the real code
    # does). The full disk catches it every time (a batch that fails after
    # its keys were printed); the kill test when the kill lands between.
    M(id="put-prints-before-commit",
      what="put -r prints a batch's keys before the batch commits (a kill or a full disk part-way leaves printed keys that were never stored)",
      file="client/src/bin/alkblobs/put.rs",
      find="        let many = self.store.put_many(b.blobs).await?;\n        let puts = b\n            .paths\n            .into_iter()\n            .zip(b.listed)\n            .zip(many.entries)\n            .map(|((path, listed), p)| (path, listed, p))\n            .collect();\n        let keys = self.stored(puts).await?;\n        self.print(&keys)?;",
      replace="        let early: Vec<Key> = b.blobs.iter().map(|v| Key::of(v)).collect();\n        if !self.ctx.json {\n            self.print(&early)?;\n        }\n        let many = self.store.put_many(b.blobs).await?;\n        let puts = b\n            .paths\n            .into_iter()\n            .zip(b.listed)\n            .zip(many.entries)\n            .map(|((path, listed), p)| (path, listed, p))\n            .collect();\n        let _ = self.stored(puts).await?;",
      kind="rust",
      tests=["a_disk_that_fills_mid_batch_prints_no_key_it_did_not_store",
             "a_put_r_killed_mid_run_leaves_every_printed_key_readable"]),
    M(id="sqlite-no-give-back",
      what="the sqlite engine does not free the pages a batch of deletions emptied (a gc gives no disk back)",
      file="client/src/backend/sqlite/engine.rs",
      find="        if let Err(e) = self.give_back().await {",
      replace="        if let Err(e) = async { Ok::<(), crate::Error>(()) }.await {",
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
