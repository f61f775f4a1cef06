"""Verify sees every loss: a PostgreSQL pool is checked against its record
(docs/operations.md, "Verify"), never against what the tier still lists."""
# (M is the runner's: scripts/mutants.py loads this file.)
MUTATIONS = [
    # The record walk is what makes a lost object visible at all.
    M(id="verify-walks-the-listing",
      what="verify of a PostgreSQL pool walks the engines' listings instead of the pool's record",
      file="client/src/store/verify.rs",
      find="        match self.inner.record.clone() {\n            Some(record) => {",
      replace="        match None::<Arc<dyn PoolRecord>> {\n            Some(record) => {",
      kind="rust",
      tests=["fleet_shared_local_a_removed_file_is_missing_and_reads_call_it_lost",
             "fleet_pg_lo_a_lost_large_object_named_by_its_liveness_table"]),
    # A lost large object is one missing key, not the end of the run.
    M(id="verify-stops-at-a-lost-object",
      what="a lost large object ends the verify with an error instead of being one missing key",
      file="client/src/store/verify.rs",
      find="        Error::Lost { .. } => Ok(Check::Lost),",
      replace="        Error::Lost { .. } => Err(e),",
      kind="rust",
      tests=["single_instance_pg_lo_a_lost_large_object_is_one_missing_root_and_a_reput_restores_it"]),
    # References count: a liveness row names what must exist.
    M(id="verify-ignores-liveness-rows",
      what="the record leaves out the rows of registered liveness tables",
      file="sql/api/94-verify.sql",
      find="        CONTINUE WHEN got IS NULL;",
      replace="        CONTINUE;",
      kind="ext",
      tests=["fleet_pg_lo_a_lost_large_object_named_by_its_liveness_table",
             "unrecorded_objects_puts_in_flight_forward_and_malformed_references_are_not_losses"]),
    # The extension tells a lost large object from a present one.
    M(id="lo-read-lost-absent",
      what="a large-object entry whose object is gone is read as present (stat answers its size)",
      file="sql/api/40-reads.sql",
      find="    IF tier = 'lo' AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_largeobject_metadata m WHERE m.oid = o) THEN",
      replace="    IF false THEN",
      kind="ext",
      tests=["single_instance_pg_lo_a_lost_large_object_is_one_missing_root_and_a_reput_restores_it"]),
    # A re-put of the original bytes must restore a lost large object.
    M(id="lo-reput-keeps-the-lost-object",
      what="a put of a key whose large object is gone keeps the dead entry (the loss cannot be repaired)",
      file="sql/api/60-large-objects.sql",
      find="           AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_largeobject_metadata m WHERE m.oid = e.loid);\n        IF NOT FOUND THEN",
      replace="           AND false;\n        IF NOT FOUND THEN",
      kind="ext",
      tests=["single_instance_pg_lo_a_lost_large_object_is_one_missing_root_and_a_reput_restores_it"]),
    # A miss is re-checked against the record before it is reported.
    M(id="verify-no-recheck",
      what="a key whose content was not found is reported missing without looking up the record again",
      file="client/src/store/verify.rs",
      find="        let now = record.lookup(&suspects).await?;",
      replace="        let now = record.page(None, 10_000).await?;",
      kind="rust",
      tests=["a_sweep_racing_verify_is_not_a_loss"]),
    # The health view says what the last verify found.
    M(id="health-ignores-verify",
      what="alkblobs_health stays ok after a verify found content missing",
      file="sql/api/92-health.sql",
      find="        IF vf.damaged_since IS NOT NULL THEN",
      replace="        IF false THEN",
      kind="ext",
      tests=["single_instance_pg_lo_a_lost_large_object_is_one_missing_root_and_a_reput_restores_it"]),
]
