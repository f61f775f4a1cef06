# The extension's guards from the hardening of issue 8 (extension 0.3.0 to
# 0.7.0): docs/design.md §4, "How the guards are tested", the first table.
# Rows that were run on an older SQL are expressed against today's mechanism.
MUTATIONS = [
    # Row 1. Only the sweep (the row's words); stage, claim and explain still validate.
    M(
        id='sources-not-revalidated',
        what='sources not re-validated at use: the sweep skips check_sources (no lock, no validation, no pending re-check of registered tables)',
        file='sql/api/90-sweep.sql',
        find="    SELECT * INTO cs FROM alkblobs.check_sources(pl.id);\n    IF cs.problem IS NOT NULL THEN\n        RAISE WARNING 'sweep of alkblobs pool",
        replace="    SELECT NULL::text AS problem, false AS busy INTO cs;\n    IF cs.problem IS NOT NULL THEN\n        RAISE WARNING 'sweep of alkblobs pool",
        kind='ext',
        tests=['a_registered_tables_owner_cannot_become_superuser', 'inheritance_children_are_refused'],
    ),
    # Row 2. apply_policy gives every function, definer or not, to the installing superuser.
    # a_registered_tables_owner_cannot_become_superuser fails at its last check (SECURITY DEFINER
    # functions owned by a superuser), if not before. (Golden `privileges` not named.)
    M(
        id='definers-owned-by-superuser',
        what='definer functions left owned by the installing superuser (apply_policy no longer gives SECURITY DEFINER functions to alkblobs_owner)',
        file='sql/finalize.sql',
        find="                           CASE WHEN (SELECT prosecdef FROM pg_catalog.pg_proc WHERE oid = o.objid) THEN 'alkblobs_owner' ELSE ext_owner END);",
        replace='                           ext_owner);',
        kind='ext',
        tests=['a_registered_tables_owner_cannot_become_superuser'],
    ),
    # Row 3. The step of the test that keeps the guard on a retyped table: the cast runs as alkblobs_owner.
    M(
        id='guard-no-typeof-check',
        what="the guard converts a non-bytea key (no pg_typeof check in liveness_guard: `k := NEW.key` runs the column type's implicit cast as alkblobs_owner)",
        file='sql/api/70-liveness.sql',
        find="    IF pg_catalog.pg_typeof(NEW.key) <> 'pg_catalog.bytea'::pg_catalog.regtype THEN",
        replace='    IF false THEN',
        kind='ext',
        tests=['a_registered_tables_owner_cannot_become_superuser'],
    ),
    # Row 4.
    M(
        id='read-committed-noop',
        what='the READ COMMITTED check is a no-op (alkblobs.require_read_committed never raises AB003)',
        file='sql/api/10-helpers.sql',
        find="    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN\n        RAISE EXCEPTION '% needs READ COMMITTED",
        replace="    IF false THEN\n        RAISE EXCEPTION '% needs READ COMMITTED",
        kind='ext',
        tests=['a_sweep_outside_read_committed_never_deletes_a_pinned_key', 'stage_claim_and_explain_refuse_outside_read_committed'],
    ),
    # Row 5. pg_races' a_pin_committing_while_the_executor_decides_keeps_the_key hangs
    # (the executor waits for the pin the test holds open): a timeout counts as caught.
    M(
        id='executor-entries-no-skip-locked',
        what='the executor locks entries FOR UPDATE without SKIP LOCKED',
        file='sql/api/90-sweep.sql',
        find='             WHERE e.pool = pl.id AND e.key = ANY(stl) ORDER BY e.key FOR UPDATE SKIP LOCKED) x;',
        replace='             WHERE e.pool = pl.id AND e.key = ANY(stl) ORDER BY e.key FOR UPDATE) x;',
        kind='ext', timeout=240,
        tests=['a_writer_locking_in_another_order_does_not_deadlock_the_executor', 'an_idle_pinner_does_not_stall_the_sweep', 'a_pin_committing_while_the_executor_decides_keeps_the_key'],
    ),
    # Row 6. The sweep's executor (the test's path); the claim's use of `busy` is left alone.
    M(
        id='executor-ignores-busy-pins',
        what="pin rows someone is changing do not keep the key (the executor ignores protected()'s `busy`)",
        file='sql/api/90-sweep.sql',
        find='        dead := ARRAY(SELECT k FROM unnest(ent) k EXCEPT SELECT k FROM unnest(pr.keep || pr.busy) k);',
        replace='        dead := ARRAY(SELECT k FROM unnest(ent) k EXCEPT SELECT k FROM unnest(pr.keep) k);',
        kind='ext',
        tests=['a_renewal_racing_the_reaper_at_expiry_keeps_the_pin'],
    ),
    # Row 7. The test hangs (the reaper waits for the renewal the test holds open): caught by the timeout.
    M(
        id='reaper-no-skip-locked',
        what='the reaper deletes expired pins FOR UPDATE without SKIP LOCKED',
        file='sql/api/90-sweep.sql',
        find='             LIMIT v_keys FOR UPDATE SKIP LOCKED)',
        replace='             LIMIT v_keys FOR UPDATE)',
        kind='ext', timeout=240,
        tests=['a_renewal_racing_the_reaper_at_expiry_keeps_the_pin'],
    ),
    # Row 8. Needs three coordinated changes, all in 70-liveness.sql: install_guard creates the trigger
    # BEFORE ROW (tgtype 31), liveness_guard returns NEW (OLD on DELETE) instead of NULL, and
    # source_problem and queue_problem (from 10-helpers.sql) are re-created after install_guard to accept
    # the BEFORE tgtypes (23, 31). Larger than a one-line edit; it removes only the AFTER-ness of the guard.
    M(
        id='guard-before-row',
        what='the guard is BEFORE ROW instead of AFTER ROW (it sees the key before generated columns and later BEFORE triggers set it)',
        file='sql/api/70-liveness.sql',
        find=[
            '            IF OLD.key IS NOT DISTINCT FROM k THEN\n                RETURN NULL;',
            '    IF k IS NULL OR length(k) <> 32 THEN\n        RETURN NULL;\n    END IF;',
            '    END LOOP;\n    RETURN NULL;\nEND $$;',
            "    IF FOUND AND (tg.tgfoid <> 'alkblobs_registration.liveness_guard()'::pg_catalog.regprocedure OR tg.tgtype <> 29) THEN\n        EXECUTE format('DROP TRIGGER alkblobs_liveness_guard ON %s', $1);\n    END IF;\n    IF NOT FOUND OR tg.tgfoid <> 'alkblobs_registration.liveness_guard()'::pg_catalog.regprocedure OR tg.tgtype <> 29 THEN\n        EXECUTE format('CREATE TRIGGER alkblobs_liveness_guard AFTER INSERT OR UPDATE OR DELETE ON %s '",
            "    EXECUTE format('ALTER TABLE %s ENABLE ALWAYS TRIGGER alkblobs_liveness_truncate', $1);\nEND $$;\n",
        ],
        replace=[
            '            IF OLD.key IS NOT DISTINCT FROM k THEN\n                RETURN NEW;',
            "    IF TG_OP = 'DELETE' THEN\n        RETURN OLD;\n    END IF;\n    IF k IS NULL OR length(k) <> 32 THEN\n        RETURN NEW;\n    END IF;",
            '    END LOOP;\n    RETURN NEW;\nEND $$;',
            "    IF FOUND AND (tg.tgfoid <> 'alkblobs_registration.liveness_guard()'::pg_catalog.regprocedure OR tg.tgtype <> 31) THEN\n        EXECUTE format('DROP TRIGGER alkblobs_liveness_guard ON %s', $1);\n    END IF;\n    IF NOT FOUND OR tg.tgfoid <> 'alkblobs_registration.liveness_guard()'::pg_catalog.regprocedure OR tg.tgtype <> 31 THEN\n        EXECUTE format('CREATE TRIGGER alkblobs_liveness_guard BEFORE INSERT OR UPDATE OR DELETE ON %s '",
            '    EXECUTE format(\'ALTER TABLE %s ENABLE ALWAYS TRIGGER alkblobs_liveness_truncate\', $1);\nEND $$;\n\n-- (Mutation guard-before-row: the guard is BEFORE ROW, so the validation\n-- accepts tgtypes 23 and 31 and the guard returns NEW, or OLD on DELETE.)\nCREATE OR REPLACE FUNCTION alkblobs.source_problem(rel oid) RETURNS text\nLANGUAGE plpgsql\nSET search_path = pg_catalog, pg_temp AS $$\nDECLARE\n    c record;\n    t oid;\n    child oid;\n    prob text;\nBEGIN\n    SELECT cl.relkind, cl.relpersistence, cl.relrowsecurity INTO c FROM pg_catalog.pg_class cl WHERE cl.oid = rel;\n    IF NOT FOUND THEN\n        RETURN \'no longer exists\';\n    END IF;\n    IF c.relkind NOT IN (\'r\', \'p\') THEN\n        RETURN format(\'is not a table (relkind %s)\', c.relkind);\n    END IF;\n    IF c.relpersistence = \'t\' THEN\n        RETURN \'is a temporary table\';\n    END IF;\n    IF c.relpersistence = \'u\' THEN\n        RETURN \'is an unlogged table (a crash empties it, and every key it protected with it)\';\n    END IF;\n    IF c.relrowsecurity THEN\n        RETURN \'has row-level security enabled (a sweep must see every row)\';\n    END IF;\n    IF EXISTS (SELECT 1 FROM pg_catalog.pg_rewrite rw WHERE rw.ev_class = rel) THEN\n        RETURN \'has rules\';\n    END IF;\n    SELECT a.atttypid INTO t FROM pg_catalog.pg_attribute a\n     WHERE a.attrelid = rel AND a.attname = \'key\' AND a.attnum > 0 AND NOT a.attisdropped;\n    IF NOT FOUND THEN\n        RETURN \'has no column "key"\';\n    END IF;\n    IF t <> \'pg_catalog.bytea\'::pg_catalog.regtype THEN\n        RETURN format(\'has a "key" column of type %s, not bytea\', t::pg_catalog.regtype);\n    END IF;\n    IF c.relkind = \'r\' AND EXISTS (SELECT 1 FROM pg_catalog.pg_inherits i WHERE i.inhparent = rel) THEN\n        RETURN \'has INHERITS children (a sweep reads their rows, the guard does not see their writes)\';\n    END IF;\n    -- User code the planner or executor could run as the definer: every\n    -- dependency of the table itself (partition key expressions), of its\n    -- indexes (expressions, predicates), constraints and extended\n    -- statistics on a function or operator that is not built in.\n    SELECT format(\'%s %s\', CASE d.refclassid WHEN \'pg_catalog.pg_proc\'::pg_catalog.regclass THEN \'function\' ELSE \'operator\' END,\n                  CASE d.refclassid WHEN \'pg_catalog.pg_proc\'::pg_catalog.regclass THEN d.refobjid::pg_catalog.regprocedure::text\n                                    ELSE d.refobjid::pg_catalog.regoperator::text END)\n      INTO prob\n      FROM pg_catalog.pg_depend d\n     WHERE d.refclassid IN (\'pg_catalog.pg_proc\'::pg_catalog.regclass, \'pg_catalog.pg_operator\'::pg_catalog.regclass)\n       AND d.refobjid >= 16384\n       AND ((d.classid = \'pg_catalog.pg_class\'::pg_catalog.regclass\n             AND (d.objid = rel OR d.objid IN (SELECT ix.indexrelid FROM pg_catalog.pg_index ix WHERE ix.indrelid = rel)))\n         OR (d.classid = \'pg_catalog.pg_constraint\'::pg_catalog.regclass\n             AND d.objid IN (SELECT co.oid FROM pg_catalog.pg_constraint co WHERE co.conrelid = rel))\n         OR (d.classid = \'pg_catalog.pg_statistic_ext\'::pg_catalog.regclass\n             AND d.objid IN (SELECT st.oid FROM pg_catalog.pg_statistic_ext st WHERE st.stxrelid = rel)))\n     ORDER BY d.refobjid LIMIT 1;\n    IF prob IS NOT NULL THEN\n        RETURN format(\'uses the user-defined %s in an index, constraint, partition key or statistics object (a sweep would run it as alkblobs_owner)\', prob);\n    END IF;\n    IF NOT EXISTS (\n        SELECT 1 FROM pg_catalog.pg_trigger tg\n         WHERE tg.tgrelid = rel AND tg.tgname = \'alkblobs_liveness_guard\'\n           AND tg.tgfoid = \'alkblobs_registration.liveness_guard()\'::pg_catalog.regprocedure\n           -- ROW | INSERT | UPDATE (| DELETE), BEFORE (mutation)\n           AND tg.tgtype IN (23, 31)\n           AND tg.tgenabled = \'A\' AND tg.tgqual IS NULL AND tg.tgnargs = 0\n           AND tg.tgconstraint = 0 AND NOT tg.tgdeferrable\n           AND coalesce(pg_catalog.array_length(tg.tgattr::int2[], 1), 0) = 0) THEN\n        RETURN \'lacks its guard trigger alkblobs_liveness_guard (missing, altered, deferred or not ENABLE ALWAYS)\';\n    END IF;\n    IF c.relkind = \'p\' THEN\n        FOR child IN SELECT i.inhrelid FROM pg_catalog.pg_inherits i WHERE i.inhparent = rel ORDER BY 1 LOOP\n            prob := alkblobs.source_problem(child);\n            IF prob IS NOT NULL THEN\n                RETURN format(\'has a partition %s that %s\', child::pg_catalog.regclass, prob);\n            END IF;\n        END LOOP;\n    END IF;\n    RETURN NULL;\nEND $$;\n\nCREATE OR REPLACE FUNCTION alkblobs.queue_problem(rel oid) RETURNS text\nLANGUAGE plpgsql\nSET search_path = pg_catalog, pg_temp AS $$\nBEGIN\n    IF EXISTS (SELECT 1 FROM pg_catalog.pg_trigger tg\n                WHERE tg.tgname = \'alkblobs_liveness_guard\' AND tg.tgtype <> 31  -- BEFORE (mutation)\n                  AND tg.tgrelid IN (SELECT rel UNION SELECT pt.relid FROM pg_catalog.pg_partition_tree(rel) pt))\n       OR NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger tg\n                       WHERE tg.tgrelid = rel AND tg.tgname = \'alkblobs_liveness_truncate\'\n                         AND tg.tgfoid = \'alkblobs_registration.liveness_truncated()\'::pg_catalog.regprocedure\n                         AND tg.tgtype = 32 AND tg.tgenabled = \'A\') THEN\n        RETURN \'has guard triggers that do not see deletions and truncation (installed before 0.8.0, or altered): register it again, or set the pool\'\'s collector to \'\'mark\'\' (alkblobs_alter_pool)\';\n    END IF;\n    RETURN NULL;\nEND $$;\n',
        ],
        kind='ext',
        tests=['the_guard_sees_generated_keys_and_keys_set_by_later_triggers'],
    ),
    # Row 9. (Golden `errors` not named.)
    M(
        id='guard-accepts-absent-key',
        what='the guard accepts a key the pool does not hold (no AB002 from liveness_guard)',
        file='sql/api/70-liveness.sql',
        find='        RAISE EXCEPTION \'key % is not present in pool "%"\', encode(k, \'hex\'), r.name\n            USING ERRCODE = \'AB002\',\n                  HINT = \'Put the content first (same bytes, same key), then record it.\';\n',
        replace='        CONTINUE;  -- (mutation: an absent key passes)\n',
        kind='ext',
        tests=['a_reference_to_absent_content_fails_with_ab002_unless_forward_references_are_allowed', 'a_repeatable_read_writer_cannot_record_a_key_it_does_not_lock', 'the_guard_sees_generated_keys_and_keys_set_by_later_triggers', 'a_liveness_row_written_while_the_executor_deletes_fails_with_ab002'],
    ),
    # Row 10. remove_source's check (the test registers the table with a second pool, so no DROP TRIGGER
    # brings PostgreSQL's own ownership check into play).
    M(
        id='unregister-no-owner-check',
        what='unregistering without the ownership check (remove_source)',
        file='sql/api/70-liveness.sql',
        find="    IF NOT pg_catalog.pg_has_role(session_user, (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = $2), 'USAGE') THEN\n        RAISE EXCEPTION 'must own table % to unregister it'",
        replace="    IF false THEN\n        RAISE EXCEPTION 'must own table % to unregister it'",
        kind='ext',
        tests=['only_the_tables_owner_unregisters_it'],
    ),
    # Row 11.
    M(
        id='upload-not-bound',
        what='uploads not bound to their transaction and role (my_upload finds any upload by its oid)',
        file='sql/api/60-large-objects.sql',
        find='     WHERE up.loid = o AND up.xact = pg_catalog.pg_current_xact_id() AND up.role = session_user;',
        replace='     WHERE up.loid = o;',
        kind='ext',
        tests=['an_upload_belongs_to_its_transaction_and_is_bounded_and_reaped'],
    ),
    # Row 12.
    M(
        id='uploads-not-reaped',
        what="abandoned uploads not reaped (the sweep's reaping selects none)",
        file='sql/api/60-large-objects.sql',
        find='                  WHERE x.pool = pool_id AND NOT alkblobs.upload_running(x.xact)\n',
        replace='                  WHERE false AND x.pool = pool_id AND NOT alkblobs.upload_running(x.xact)\n',
        kind='ext',
        tests=['an_upload_belongs_to_its_transaction_and_is_bounded_and_reaped'],
    ),
    # Row 13. The write at 4 TiB then fails in lo_put (22023, not 54000).
    M(
        id='upload-no-size-bound',
        what='no upload size bound (alkblobs_lo_write ignores max_object_bytes)',
        file='sql/api/60-large-objects.sql',
        find='    IF $2 + length($3) > lim THEN',
        replace='    IF false THEN',
        kind='ext',
        tests=['an_upload_belongs_to_its_transaction_and_is_bounded_and_reaped'],
    ),
    # Row 14. 0.3.0's bucket (advisory) locks are now the file rows a liveness writer or pin_new
    # holds FOR KEY SHARE: the claim's `ours` no longer leaves out keys whose file row it could not
    # lock. (The tombstone upsert takes FOR NO KEY UPDATE, which does not wait for KEY SHARE, so the
    # test fails rather than hangs.)
    M(
        id='claim-ignores-file-locks',
        what='the claim ignores bucket locks (now: the file-row locks of liveness writers and pin_new in flight)',
        file='sql/api/80-local-tier.sql',
        find="    ours := ARRAY(SELECT b FROM unnest(batch) b\n                   WHERE b = ANY(coalesce(locked, '{}'))\n                      OR NOT EXISTS (SELECT 1 FROM alkblobs.files x WHERE x.pool = pl.id AND x.key = b)\n                   ORDER BY b);",
        replace='    ours := ARRAY(SELECT b FROM unnest(batch) b ORDER BY b);',
        kind='ext',
        tests=['a_local_liveness_write_holds_off_a_claim'],
    ),
    # Row 15. DOUBT: likely SURVIVES now. The test reads alkblobs_usage.liveness_tables, which since the
    # SQL-only flavour counts only registrations whose table still exists (pg_class), so a registration
    # the event trigger left behind is not counted. The test would have to read alkblobs.liveness.
    M(
        id='drop-trigger-tag-filter',
        what='the drop event trigger keeps its old tag filter (DROP TABLE, DROP SCHEMA, DROP OWNED only: DROP TYPE … CASCADE and DROP EXTENSION leave the registration)',
        file='sql/api/70-liveness.sql',
        find='CREATE EVENT TRIGGER alkblobs_liveness_drop ON sql_drop\n    EXECUTE FUNCTION alkblobs.on_sql_drop();',
        replace="CREATE EVENT TRIGGER alkblobs_liveness_drop ON sql_drop\n    WHEN TAG IN ('DROP TABLE', 'DROP SCHEMA', 'DROP OWNED')\n    EXECUTE FUNCTION alkblobs.on_sql_drop();",
        kind='ext',
        tests=['a_table_dropped_by_cascade_is_unregistered'],
    ),
    # Row 16.
    M(
        id='explain-probes-unreadable',
        what='explain probes tables the caller cannot read (no has_table_privilege check)',
        file='sql/api/93-explain.sql',
        find="        IF NOT pg_catalog.has_table_privilege(session_user, r.relid, 'SELECT') THEN",
        replace='        IF false THEN',
        kind='ext',
        tests=['explain_reports_only_what_the_caller_may_read'],
    ),
    # Row 17. The worker's call then waits (lock_timeout 5 s) and records an error, never a skip.
    M(
        id='sweep-waits-for-lock',
        what='the sweep waits for the sweeper lock (take_lock(…, false) for the `try`)',
        file='sql/api/90-sweep.sql',
        find="    IF NOT alkblobs.take_lock(pl.id, true) THEN\n        aborted := 'sweeper_lock';",
        replace="    IF NOT alkblobs.take_lock(pl.id, false) THEN\n        aborted := 'sweeper_lock';",
        kind='ext',
        tests=['a_node_holding_the_sweeper_lock_makes_the_scheduler_skip_never_wait'],
    ),
    # Row 18. The sweep's error escapes the worker's transaction: the worker exits and restarts,
    # no error row is ever recorded.
    M(
        id='scheduled-sweep-no-exception',
        what='scheduled_sweep without its exception block around sweep_core',
        file='sql/api/91-scheduler.sql',
        find="    BEGIN\n        SELECT * INTO r FROM alkblobs.sweep_core(pl.name, false, 1000, marking, 20000);\n    EXCEPTION WHEN query_canceled OR OTHERS THEN\n        err := SQLSTATE || ': ' || SQLERRM;\n    END;\n",
        replace='    SELECT * INTO r FROM alkblobs.sweep_core(pl.name, false, 1000, marking, 20000);\n',
        kind='ext',
        tests=['a_failing_sweep_is_recorded_and_the_worker_goes_on'],
    ),
    # Row 19. Since 0.8.0 the worker's rule is in two places: scheduler_due and the claim's one-statement
    # re-check (scheduler_claim, shared with pg_cron). Removing it from scheduler_due alone survives (the
    # claim refuses a period not due), so this one edit (the two functions are adjacent) removes it from both.
    M(
        id='scheduler-ignores-sweep-every',
        what="scheduler_due ignores sweep_every (and so does scheduler_claim's re-check of the same rule): every scheduled pool is swept every naptime",
        file='sql/api/91-scheduler.sql',
        find="       AND coalesce(s.last_scheduled, '-infinity'::timestamptz) + p.sweep_every <= clock_timestamp()\n     ORDER BY s.last_scheduled NULLS FIRST, p.id;\nEXCEPTION WHEN lock_not_available THEN\n    RAISE WARNING 'alkblobs scheduler: no pool scheduled this time: %', SQLERRM\n        USING HINT = 'The pools table stayed locked (an upgrade, a VACUUM FULL?) for lock_timeout; the next look retries.';\n    RETURN;\nEND $$;\n\n-- The start of a scheduled run of pool p, committed before its first call.\n-- False (the pool is skipped this time) if its row stays locked, or if\n-- another runner (a pg_cron job of the pool, alkblobs_cron_claim) started\n-- a run since scheduler_due looked: the same one-statement claim as\n-- alkblobs_cron_claim's, so two runners never both run one period.\nCREATE FUNCTION alkblobs.scheduler_claim(p integer) RETURNS boolean\nLANGUAGE plpgsql\nSET search_path = pg_catalog, pg_temp AS $$\nBEGIN\n    INSERT INTO alkblobs.schedule AS s (pool, last_scheduled, runner) VALUES (p, clock_timestamp(), 'worker')\n    ON CONFLICT ON CONSTRAINT schedule_pkey DO UPDATE SET last_scheduled = excluded.last_scheduled, runner = 'worker'\n     WHERE s.last_scheduled + (SELECT x.sweep_every FROM alkblobs.pools x WHERE x.id = p) <= clock_timestamp();\n",
        replace="     ORDER BY s.last_scheduled NULLS FIRST, p.id;\nEXCEPTION WHEN lock_not_available THEN\n    RAISE WARNING 'alkblobs scheduler: no pool scheduled this time: %', SQLERRM\n        USING HINT = 'The pools table stayed locked (an upgrade, a VACUUM FULL?) for lock_timeout; the next look retries.';\n    RETURN;\nEND $$;\n\n-- The start of a scheduled run of pool p, committed before its first call.\n-- False (the pool is skipped this time) if its row stays locked, or if\n-- another runner (a pg_cron job of the pool, alkblobs_cron_claim) started\n-- a run since scheduler_due looked: the same one-statement claim as\n-- alkblobs_cron_claim's, so two runners never both run one period.\nCREATE FUNCTION alkblobs.scheduler_claim(p integer) RETURNS boolean\nLANGUAGE plpgsql\nSET search_path = pg_catalog, pg_temp AS $$\nBEGIN\n    INSERT INTO alkblobs.schedule AS s (pool, last_scheduled, runner) VALUES (p, clock_timestamp(), 'worker')\n    ON CONFLICT ON CONSTRAINT schedule_pkey DO UPDATE SET last_scheduled = excluded.last_scheduled, runner = 'worker';\n",
        kind='ext',
        tests=['health_turns_critical_when_the_last_sweep_is_too_old'],
    ),
    # Row 20.
    M(
        id='history-retention-waits',
        what="the history's retention waits for locked rows (FOR UPDATE without SKIP LOCKED in record_sweep)",
        file='sql/api/90-sweep.sql',
        find='         ORDER BY x.started LIMIT 1000 FOR UPDATE SKIP LOCKED)',
        replace='         ORDER BY x.started LIMIT 1000 FOR UPDATE)',
        kind='ext',
        tests=['an_open_sweep_transaction_does_not_stall_the_scheduler'],
    ),
    # Row 21.
    M(
        id='worker-ready-exists-only',
        what='the worker checks only that alkblobs.scheduled_sweep exists (READY, not extension membership)',
        file='pg_ext/src/scheduler.rs',
        find='const READY: &str = "SELECT pg_catalog.count(*) OPERATOR(pg_catalog.=) 3 FROM pg_catalog.pg_depend d \\\n      JOIN pg_catalog.pg_extension x ON x.oid OPERATOR(pg_catalog.=) d.refobjid \\\n                                     AND x.extname OPERATOR(pg_catalog.=) \'alkblobs\' \\\n     WHERE d.deptype OPERATOR(pg_catalog.=) \'e\' \\\n       AND d.classid OPERATOR(pg_catalog.=) \'pg_catalog.pg_proc\'::pg_catalog.regclass \\\n       AND d.objid OPERATOR(pg_catalog.=) ANY (ARRAY[ \\\n           pg_catalog.to_regprocedure(\'alkblobs.scheduled_sweep(integer,boolean)\')::pg_catalog.oid, \\\n           pg_catalog.to_regprocedure(\'alkblobs.scheduler_due()\')::pg_catalog.oid, \\\n           pg_catalog.to_regprocedure(\'alkblobs.scheduler_claim(integer)\')::pg_catalog.oid])";',
        replace='const READY: &str = "SELECT pg_catalog.to_regprocedure(\'alkblobs.scheduled_sweep(integer,boolean)\') IS NOT NULL";',
        kind='ext',
        tests=['the_scheduler_never_calls_an_alkblobs_schema_it_did_not_install'],
    ),
    # Row 22. Since 0.7.0 the switch carries two flags, and either alone
    # refuses the RESET ROLE / SET ROLE the test's planted trigger runs
    # (PostgreSQL checks GUC_NOT_WHILE_SEC_REST against both: "within
    # security-definer function" or "within security-restricted
    # operation", both 42501). So the row's mutation removes both: the
    # worker's switch without either flag. (Row 23's own guard, the
    # restricted operation's refusal of a deferred trigger, is mutated
    # alone below.)
    M(
        id='worker-no-switch-flags',
        what='the worker switches user with neither SECURITY_LOCAL_USERID_CHANGE nor SECURITY_RESTRICTED_OPERATION (Rust, as_extension)',
        file='pg_ext/src/scheduler.rs',
        find='                saved_ctx\n                    | pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32\n                    | pg_sys::SECURITY_RESTRICTED_OPERATION as i32,\n',
        replace='                saved_ctx,\n',
        kind='ext',
        tests=['code_the_worker_runs_cannot_become_the_superuser'],
    ),
    # Row 23.
    M(
        id='worker-no-restricted-operation',
        what="the worker's switch without SECURITY_RESTRICTED_OPERATION (Rust, as_extension: a deferred trigger fires at commit as the superuser)",
        file='pg_ext/src/scheduler.rs',
        find='                    | pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32\n                    | pg_sys::SECURITY_RESTRICTED_OPERATION as i32,\n',
        replace='                    | pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32,\n',
        kind='ext',
        tests=['what_the_workers_code_leaves_behind_dies_with_its_call'],
    ),
    # Row 24. The nest level is still opened (NewGUCNestLevel) but never rolled back before the
    # switch back; the commit's own AtEOXact_GUC keeps session-level SETs.
    M(
        id='worker-no-guc-nest-level',
        what='the worker without its GUC nest level (Rust, no AtEOXact_GUC before switching back)',
        file='pg_ext/src/scheduler.rs',
        find='            pg_sys::AtEOXact_GUC(false, nest);\n',
        replace='            let _ = nest;\n',
        kind='ext',
        tests=['what_the_workers_code_leaves_behind_dies_with_its_call'],
    ),
    # Row 25. Historical (0.6.0's SQL); the guard exists now as the pool_locks row lock in
    # alkblobs.take_lock, which this puts back to 0.6.0's advisory lock ('alkb' = 1634495330, pool id,
    # the key the test's squatter takes).
    M(
        id='sweeper-lock-advisory',
        what="the sweeper lock an advisory lock (0.6.0's SQL): alkblobs.take_lock takes pg_advisory_xact_lock(1634495330, pool) instead of the pool_locks row",
        file='sql/api/10-helpers.sql',
        find='BEGIN\n    LOOP\n        IF $2 THEN\n            PERFORM 1 FROM alkblobs.pool_locks l WHERE l.pool = $1 FOR UPDATE SKIP LOCKED;\n        ELSE\n            PERFORM 1 FROM alkblobs.pool_locks l WHERE l.pool = $1 FOR UPDATE;\n        END IF;\n        IF FOUND THEN\n            RETURN true;\n        ELSIF EXISTS (SELECT 1 FROM alkblobs.pool_locks l WHERE l.pool = $1) THEN\n            RETURN false;\n        END IF;\n        INSERT INTO alkblobs.pool_locks (pool) VALUES ($1) ON CONFLICT DO NOTHING;\n    END LOOP;\nEND $$;',
        replace="BEGIN\n    -- (Mutation: 0.6.0's transaction-level advisory lock, key ('alkb', pool id).)\n    IF $2 THEN\n        RETURN pg_catalog.pg_try_advisory_xact_lock(1634495330, $1);\n    END IF;\n    PERFORM pg_catalog.pg_advisory_xact_lock(1634495330, $1);\n    RETURN true;\nEND $$;",
        kind='ext',
        tests=['a_role_without_access_cannot_hold_a_pools_locks'],
    ),
    # Row 26.
    M(
        id='lease-no-access-check',
        what="alkblobs_sweep_lease without its access check (the pool looked up by name instead of alkblobs.pool(…, 'sweep'))",
        file='sql/api/90-sweep.sql',
        find="SET lock_timeout = '200ms' AS $$\n#variable_conflict use_column\nDECLARE\n    pl alkblobs.pools := alkblobs.pool($1, 'sweep');",
        replace="SET lock_timeout = '200ms' AS $$\n#variable_conflict use_column\nDECLARE\n    pl alkblobs.pools := (SELECT x FROM alkblobs.pools x WHERE x.name = $1);",
        kind='ext',
        tests=['a_role_without_access_cannot_hold_a_pools_locks'],
    ),
    # Row 27. Historical (0.6.0's grants); expressed on the current grants in finalize.sql.
    M(
        id='admins-usage-on-alkblobs',
        what="admins with USAGE on schema alkblobs (0.6.0's grants)",
        file='sql/finalize.sql',
        find='GRANT USAGE ON SCHEMA alkblobs_registration TO alkblobs_admin;\n',
        replace="GRANT USAGE ON SCHEMA alkblobs_registration TO alkblobs_admin;\nGRANT USAGE ON SCHEMA alkblobs TO alkblobs_admin;  -- (mutation: 0.6.0's grant)\n",
        kind='ext',
        tests=['an_admin_of_one_pool_cannot_stall_the_others'],
    ),
    # Row 28.
    M(
        id='worker-no-read-committed',
        what="the worker's session does not pin READ COMMITTED (Rust: no SET default_transaction_isolation)",
        file='pg_ext/src/scheduler.rs',
        find="             SET search_path = pg_catalog; SET default_transaction_isolation = 'read committed'; \\\n",
        replace='             SET search_path = pg_catalog; \\\n',
        kind='ext',
        tests=['pausing_and_terminating_the_scheduler'],
    ),
    # Row 29. One edit over the adjacent unpin, renew, (pins_held untouched), unpin_many and unpin_all:
    # pins matched by owner string alone.
    M(
        id='pins-across-roles',
        what='pins released and renewed across roles (unpin, unpin_many, unpin_all and renew match the owner string, not the role)',
        file='sql/api/30-puts-and-pins.sql',
        find="    DELETE FROM alkblobs.pins pn\n     WHERE pn.pool = pl.id AND pn.key = $2 AND pn.owner = $3 AND (any_role OR pn.role = session_user);\n    RETURN FOUND;\nEND $$;\n\n-- Renews every un-expired pin of the caller's (role, owner) in one\n-- statement. An expired pin is not revived: its protection already lapsed\n-- and a sweep may have acted, so the holder must re-put (the count tells it\n-- how many survived).\nCREATE FUNCTION @extschema@.alkblobs_renew(pool text, owner text)\nRETURNS bigint\nLANGUAGE plpgsql SECURITY DEFINER\nSET search_path = pg_catalog, pg_temp AS $$\nDECLARE\n    pl alkblobs.pools := alkblobs.pool($1, 'write');\n    me name := session_user;\n    n bigint;\n    skipped bigint;\n    stale boolean;\nBEGIN\n    PERFORM alkblobs.require_mode(pl, 'fleet', 'alkblobs_renew');\n    PERFORM alkblobs.check_owner($2);\n    -- Before the pool's first sweep since a server start or a restore\n    -- (alkblobs.adopt), the caller's pins that lapsed meanwhile are renewed\n    -- too if their content is still there: nothing could renew them, and\n    -- no executor runs before that sweep has given them a fresh TTL.\n    stale := NOT alkblobs.adopted(pl);\n    -- A row a sweep holds (deciding its key) is passed over, not waited\n    -- for: one long sweep call must not hold back the renewal of every pin\n    -- of the instance. The next round (TTL/3 later) renews it.\n    -- (Joined by ctid: whatever plan the estimates pick, each locked row\n    -- is found again by a TID lookup — a key join could be a nested loop\n    -- over 100,000 pins squared.)\n    UPDATE alkblobs.pins pn\n       SET expires_at = clock_timestamp() + pl.pin_ttl\n      FROM (SELECT x.ctid AS t FROM alkblobs.pins x\n             WHERE x.pool = pl.id AND x.role = me AND x.owner = $2\n               AND (x.expires_at > clock_timestamp() OR (stale AND alkblobs.content_exists(x.pool, x.key)))\n               FOR UPDATE SKIP LOCKED) l\n     WHERE pn.ctid = l.t;\n    GET DIAGNOSTICS n = ROW_COUNT;\n    -- A row passed over because a sweep holds it, and close to expiry:\n    -- wait for the sweep call (bounded) rather than let it lapse.\n    UPDATE alkblobs.pins pn\n       SET expires_at = clock_timestamp() + pl.pin_ttl\n     WHERE pn.pool = pl.id AND pn.role = me AND pn.owner = $2\n       AND pn.expires_at > clock_timestamp() AND pn.expires_at < clock_timestamp() + pl.pin_ttl / 2;\n    GET DIAGNOSTICS skipped = ROW_COUNT;\n    n := n + skipped;\n    RETURN n;\nEND $$;\n\n-- Which of `keys` the caller's (role, owner) holds an un-expired pin on: a\n-- holder checks before publishing under a pin (its renewal may have\n-- failed).\nCREATE FUNCTION @extschema@.alkblobs_pins_held(pool text, owner text, keys bytea[])\nRETURNS SETOF bytea\nLANGUAGE plpgsql SECURITY DEFINER\nSET search_path = pg_catalog, pg_temp AS $$\nDECLARE\n    pl alkblobs.pools := alkblobs.pool($1, 'write');\n    me name := session_user;\nBEGIN\n    PERFORM alkblobs.require_mode(pl, 'fleet', 'alkblobs_pins_held');\n    PERFORM alkblobs.check_owner($2);\n    PERFORM alkblobs.not_null($3, 'keys');\n    RETURN QUERY\n        SELECT pn.key FROM alkblobs.pins pn\n         WHERE pn.pool = pl.id AND pn.role = me AND pn.owner = $2 AND pn.key = ANY($3)\n           AND pn.expires_at > clock_timestamp()\n         ORDER BY pn.key;\nEND $$;\n\n-- Releases the caller's (role, owner) pins on `keys` in one statement (a\n-- store instance's guards dropping); at most 10,000 keys. Returns how many\n-- pin rows it deleted.\nCREATE FUNCTION @extschema@.alkblobs_unpin_many(pool text, owner text, keys bytea[])\nRETURNS bigint\nLANGUAGE plpgsql SECURITY DEFINER\nSET search_path = pg_catalog, pg_temp AS $$\nDECLARE\n    pl alkblobs.pools := alkblobs.pool($1, 'write');\n    n bigint;\nBEGIN\n    PERFORM alkblobs.require_mode(pl, 'fleet', 'alkblobs_unpin_many');\n    PERFORM alkblobs.check_owner($2);\n    PERFORM alkblobs.max_keys($3, 10000);\n    DELETE FROM alkblobs.pins pn\n     WHERE pn.pool = pl.id AND pn.role = session_user AND pn.owner = $2 AND pn.key = ANY($3);\n    GET DIAGNOSTICS n = ROW_COUNT;\n    RETURN n;\nEND $$;\n\n-- Releases every pin of the caller's (role, owner); a pool admin releases\n-- that owner's pins under every role.\nCREATE FUNCTION @extschema@.alkblobs_unpin_all(pool text, owner text)\nRETURNS bigint\nLANGUAGE plpgsql SECURITY DEFINER\nSET search_path = pg_catalog, pg_temp AS $$\nDECLARE\n    pl alkblobs.pools := alkblobs.pool($1, 'write');\n    any_role boolean := alkblobs.may(pl, 'admin');\n    n bigint;\nBEGIN\n    PERFORM alkblobs.require_mode(pl, 'fleet', 'alkblobs_unpin_all');\n    PERFORM alkblobs.check_owner($2);\n    DELETE FROM alkblobs.pins pn\n     WHERE pn.pool = pl.id AND pn.owner = $2 AND (any_role OR pn.role = session_user);",
        replace="    DELETE FROM alkblobs.pins pn\n     WHERE pn.pool = pl.id AND pn.key = $2 AND pn.owner = $3;\n    RETURN FOUND;\nEND $$;\n\n-- Renews every un-expired pin of the caller's (role, owner) in one\n-- statement. An expired pin is not revived: its protection already lapsed\n-- and a sweep may have acted, so the holder must re-put (the count tells it\n-- how many survived).\nCREATE FUNCTION @extschema@.alkblobs_renew(pool text, owner text)\nRETURNS bigint\nLANGUAGE plpgsql SECURITY DEFINER\nSET search_path = pg_catalog, pg_temp AS $$\nDECLARE\n    pl alkblobs.pools := alkblobs.pool($1, 'write');\n    me name := session_user;\n    n bigint;\n    skipped bigint;\n    stale boolean;\nBEGIN\n    PERFORM alkblobs.require_mode(pl, 'fleet', 'alkblobs_renew');\n    PERFORM alkblobs.check_owner($2);\n    -- Before the pool's first sweep since a server start or a restore\n    -- (alkblobs.adopt), the caller's pins that lapsed meanwhile are renewed\n    -- too if their content is still there: nothing could renew them, and\n    -- no executor runs before that sweep has given them a fresh TTL.\n    stale := NOT alkblobs.adopted(pl);\n    -- A row a sweep holds (deciding its key) is passed over, not waited\n    -- for: one long sweep call must not hold back the renewal of every pin\n    -- of the instance. The next round (TTL/3 later) renews it.\n    -- (Joined by ctid: whatever plan the estimates pick, each locked row\n    -- is found again by a TID lookup — a key join could be a nested loop\n    -- over 100,000 pins squared.)\n    UPDATE alkblobs.pins pn\n       SET expires_at = clock_timestamp() + pl.pin_ttl\n      FROM (SELECT x.ctid AS t FROM alkblobs.pins x\n             WHERE x.pool = pl.id AND x.owner = $2\n               AND (x.expires_at > clock_timestamp() OR (stale AND alkblobs.content_exists(x.pool, x.key)))\n               FOR UPDATE SKIP LOCKED) l\n     WHERE pn.ctid = l.t;\n    GET DIAGNOSTICS n = ROW_COUNT;\n    -- A row passed over because a sweep holds it, and close to expiry:\n    -- wait for the sweep call (bounded) rather than let it lapse.\n    UPDATE alkblobs.pins pn\n       SET expires_at = clock_timestamp() + pl.pin_ttl\n     WHERE pn.pool = pl.id AND pn.owner = $2\n       AND pn.expires_at > clock_timestamp() AND pn.expires_at < clock_timestamp() + pl.pin_ttl / 2;\n    GET DIAGNOSTICS skipped = ROW_COUNT;\n    n := n + skipped;\n    RETURN n;\nEND $$;\n\n-- Which of `keys` the caller's (role, owner) holds an un-expired pin on: a\n-- holder checks before publishing under a pin (its renewal may have\n-- failed).\nCREATE FUNCTION @extschema@.alkblobs_pins_held(pool text, owner text, keys bytea[])\nRETURNS SETOF bytea\nLANGUAGE plpgsql SECURITY DEFINER\nSET search_path = pg_catalog, pg_temp AS $$\nDECLARE\n    pl alkblobs.pools := alkblobs.pool($1, 'write');\n    me name := session_user;\nBEGIN\n    PERFORM alkblobs.require_mode(pl, 'fleet', 'alkblobs_pins_held');\n    PERFORM alkblobs.check_owner($2);\n    PERFORM alkblobs.not_null($3, 'keys');\n    RETURN QUERY\n        SELECT pn.key FROM alkblobs.pins pn\n         WHERE pn.pool = pl.id AND pn.role = me AND pn.owner = $2 AND pn.key = ANY($3)\n           AND pn.expires_at > clock_timestamp()\n         ORDER BY pn.key;\nEND $$;\n\n-- Releases the caller's (role, owner) pins on `keys` in one statement (a\n-- store instance's guards dropping); at most 10,000 keys. Returns how many\n-- pin rows it deleted.\nCREATE FUNCTION @extschema@.alkblobs_unpin_many(pool text, owner text, keys bytea[])\nRETURNS bigint\nLANGUAGE plpgsql SECURITY DEFINER\nSET search_path = pg_catalog, pg_temp AS $$\nDECLARE\n    pl alkblobs.pools := alkblobs.pool($1, 'write');\n    n bigint;\nBEGIN\n    PERFORM alkblobs.require_mode(pl, 'fleet', 'alkblobs_unpin_many');\n    PERFORM alkblobs.check_owner($2);\n    PERFORM alkblobs.max_keys($3, 10000);\n    DELETE FROM alkblobs.pins pn\n     WHERE pn.pool = pl.id AND pn.owner = $2 AND pn.key = ANY($3);\n    GET DIAGNOSTICS n = ROW_COUNT;\n    RETURN n;\nEND $$;\n\n-- Releases every pin of the caller's (role, owner); a pool admin releases\n-- that owner's pins under every role.\nCREATE FUNCTION @extschema@.alkblobs_unpin_all(pool text, owner text)\nRETURNS bigint\nLANGUAGE plpgsql SECURITY DEFINER\nSET search_path = pg_catalog, pg_temp AS $$\nDECLARE\n    pl alkblobs.pools := alkblobs.pool($1, 'write');\n    any_role boolean := alkblobs.may(pl, 'admin');\n    n bigint;\nBEGIN\n    PERFORM alkblobs.require_mode(pl, 'fleet', 'alkblobs_unpin_all');\n    PERFORM alkblobs.check_owner($2);\n    DELETE FROM alkblobs.pins pn\n     WHERE pn.pool = pl.id AND pn.owner = $2;",
        kind='ext',
        tests=['a_writer_cannot_release_or_renew_another_roles_pins'],
    ),
    # Row 30. alkblobs.may and its `-- @source may(...)` rules (same file, adjacent) all `true`; the runner's
    # `gen-upgrade.py --inline` then rewrites the inline copies in the hot paths. (Golden `privileges` not named.)
    M(
        id='may-always-true',
        what='every pool open to every role (alkblobs.may and its inlined @source rules always true)',
        file='sql/api/10-helpers.sql',
        find="-- @source may(write): (EXISTS (SELECT 1 FROM pg_catalog.pg_roles o WHERE (o.oid = p.owner_oid OR (p.owner_oid IS NULL AND o.rolname = p.owner)) AND pg_catalog.pg_has_role(session_user, o.oid, 'USAGE')) OR EXISTS (SELECT 1 FROM alkblobs.pool_grants g JOIN pg_catalog.pg_roles r ON (r.oid = g.grantee_oid OR (g.grantee_oid IS NULL AND r.rolname = g.grantee)) WHERE g.pool = p.id AND g.access IN ('write', 'admin') AND pg_catalog.pg_has_role(session_user, r.oid, 'USAGE')))\n-- @source may(read): (EXISTS (SELECT 1 FROM pg_catalog.pg_roles o WHERE (o.oid = p.owner_oid OR (p.owner_oid IS NULL AND o.rolname = p.owner)) AND pg_catalog.pg_has_role(session_user, o.oid, 'USAGE')) OR EXISTS (SELECT 1 FROM alkblobs.pool_grants g JOIN pg_catalog.pg_roles r ON (r.oid = g.grantee_oid OR (g.grantee_oid IS NULL AND r.rolname = g.grantee)) WHERE g.pool = p.id AND pg_catalog.pg_has_role(session_user, r.oid, 'USAGE')))\n\n-- Does the caller have `need` ('read', 'write', 'sweep' or 'admin') on pool\n-- p? Superusers and members of the pool's owner role have everything;\n-- 'admin' implies every access, 'write' and 'sweep' imply 'read'.\n-- SECURITY DEFINER because the views call it as the reader (a function in\n-- a view runs with the caller's privileges); it reveals nothing but the\n-- caller's own access.\nCREATE FUNCTION alkblobs.may(p alkblobs.pools, need text) RETURNS boolean\nLANGUAGE plpgsql STABLE SECURITY DEFINER\nSET search_path = pg_catalog, pg_temp AS $$\nBEGIN\n    RETURN EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = session_user AND r.rolsuper)\n        OR EXISTS (SELECT 1 FROM pg_catalog.pg_roles r\n                    WHERE (r.oid = p.owner_oid OR (p.owner_oid IS NULL AND r.rolname = p.owner))\n                      AND pg_catalog.pg_has_role(session_user, r.oid, 'USAGE'))\n        OR EXISTS (SELECT 1 FROM alkblobs.pool_grants g\n                     JOIN pg_catalog.pg_roles r ON (r.oid = g.grantee_oid OR (g.grantee_oid IS NULL AND r.rolname = g.grantee))\n                    WHERE g.pool = p.id AND pg_catalog.pg_has_role(session_user, r.oid, 'USAGE')\n                      AND (g.access = need OR g.access = 'admin' OR (need = 'read' AND g.access IN ('write', 'sweep'))));\nEND $$;",
        replace="-- @source may(write): (true)\n-- @source may(read): (true)\n\n-- Does the caller have `need` ('read', 'write', 'sweep' or 'admin') on pool\n-- p? Superusers and members of the pool's owner role have everything;\n-- 'admin' implies every access, 'write' and 'sweep' imply 'read'.\n-- SECURITY DEFINER because the views call it as the reader (a function in\n-- a view runs with the caller's privileges); it reveals nothing but the\n-- caller's own access.\nCREATE FUNCTION alkblobs.may(p alkblobs.pools, need text) RETURNS boolean\nLANGUAGE plpgsql STABLE SECURITY DEFINER\nSET search_path = pg_catalog, pg_temp AS $$\nBEGIN\n    RETURN true;  -- (mutation: every pool open to every role)\nEND $$;",
        kind='ext',
        tests=['a_writer_cannot_release_or_renew_another_roles_pins', 'pools_are_granted_per_role'],
    ),
    # Row 31. DOUBT: likely SURVIVES now. Every over-long case of the test ('300000 years', '1000 years')
    # has a year part, which mixed_interval (row 34's fix, added since) refuses first with 22023; only the
    # golden `errors` (pin_ttl => '8 days') reaches a maximum, and that is the TTL's.
    M(
        id='no-window-maximum',
        what="no window maximum in check_settings (delete_window over 366 days reaches the table's CHECK: 23514)",
        file='sql/api/20-pools.sql',
        find="    IF w < interval '0' OR w > interval '366 days' THEN",
        replace="    IF w < interval '0' THEN",
        kind='ext',
        tests=['bad_windows_and_null_arguments_get_sqlstates'],
    ),
    # Row 32: both of sweep_all's guards against a budget of 0 (the refusal,
    # and the exit after a call that executed nothing); either alone keeps
    # the call returning, so the mutation removes both: it then loops until
    # the test's statement_timeout (57014).
    M(
        id='sweep-all-zero-budget',
        what='sweep_all accepts max_unlinks = 0 and loops without progress',
        file='sql/api/90-sweep.sql',
        find=["    IF $2 OPERATOR(pg_catalog.<) 1 THEN\n",
              "              AND (r.remaining OPERATOR(pg_catalog.=) 0 OR r.executed OPERATOR(pg_catalog.=) 0);\n"],
        replace=["    IF $2 OPERATOR(pg_catalog.<) 0 THEN\n",
                 "              AND (r.remaining OPERATOR(pg_catalog.=) 0);\n"],
        kind='ext',
        tests=['sweep_all_with_no_unlink_budget_returns'],
    ),
    # Row 33. Historical (0.3.0's SQL); the guard exists now as the views' security_barrier in finalize.sql:
    # one edit per view, the seven CREATE VIEW lines.
    M(
        id='views-no-security-barrier',
        what='views without security_barrier',
        file='sql/finalize.sql',
        find=[
            'CREATE VIEW @extschema@.alkblobs_pools WITH (security_barrier) AS\n',
            'CREATE VIEW @extschema@.alkblobs_pool_grants WITH (security_barrier) AS\n',
            'CREATE VIEW @extschema@.alkblobs_pins WITH (security_barrier) AS\n',
            'CREATE VIEW @extschema@.alkblobs_staged WITH (security_barrier) AS\n',
            'CREATE VIEW @extschema@.alkblobs_usage WITH (security_barrier) AS\n',
            'CREATE VIEW @extschema@.alkblobs_sweeps WITH (security_barrier) AS\n',
            'CREATE VIEW @extschema@.alkblobs_health WITH (security_barrier) AS\n',
        ],
        replace=[
            'CREATE VIEW @extschema@.alkblobs_pools AS\n',
            'CREATE VIEW @extschema@.alkblobs_pool_grants AS\n',
            'CREATE VIEW @extschema@.alkblobs_pins AS\n',
            'CREATE VIEW @extschema@.alkblobs_staged AS\n',
            'CREATE VIEW @extschema@.alkblobs_usage AS\n',
            'CREATE VIEW @extschema@.alkblobs_sweeps AS\n',
            'CREATE VIEW @extschema@.alkblobs_health AS\n',
        ],
        kind='ext',
        tests=['the_pool_views_do_not_leak_other_pools_rows_through_a_callers_quals'],
    ),
    # Row 34. Historical ("the SQL before the fix"); the fix is check_settings' two mixed_interval
    # checks, removed here (check_schedule's are left alone).
    M(
        id='settings-no-mixed-interval',
        what='check_settings without mixed_interval (mixed-unit windows and TTLs compare as small and are accepted)',
        file='sql/api/20-pools.sql',
        find="    IF alkblobs.mixed_interval(w) THEN\n        RAISE EXCEPTION 'delete_window must be days, hours, minutes and seconds with no month, year or negative part, got %', w\n            USING ERRCODE = 'invalid_parameter_value';\n    END IF;\n    IF alkblobs.mixed_interval(ttl) THEN\n        RAISE EXCEPTION 'pin_ttl must be days, hours, minutes and seconds with no month, year or negative part, got %', ttl\n            USING ERRCODE = 'invalid_parameter_value';\n    END IF;\n",
        replace='',
        kind='ext',
        tests=['bad_windows_and_null_arguments_get_sqlstates'],
    ),
]
