-- Fewer index entries per enqueue and claim, and no index that an outcome write could pick
-- over the task's key:
-- - A task is found by its run and its id together: the primary key (run_id, id) serves both
--   the look-ups by run (cancel, retry, status) and by task (completions, heartbeats), where
--   a key on id and an index on run_id took two entries per row.
-- - Listing runs by name walks the primary key newest-first and stops at the page size; an
--   index on (name, id) cost every insert an entry to speed up that filter alone.
-- - The lease index covers leased tasks by their lease (set exactly while a task runs), not
--   by state: a write that finds its tasks by key and state = 'running' cannot be planned
--   as a read of every running task, which statistics taken before a burst of claims
--   would favour.
-- And, on a job's run or a node's step, the attempt (task id, claims) that completed it: a
-- worker whose completion reply was lost asks this whether its write committed.
--
-- Every table first, in the order workflow transitions lock them, rather than each as its
-- statement comes; a job transition locks in the other order, and a deadlock with one is
-- retried by both sides.
LOCK TABLE __schema__.cyclone_runs, __schema__.cyclone_tasks, __schema__.cyclone_steps
    IN ACCESS EXCLUSIVE MODE;
ALTER TABLE __schema__.cyclone_tasks DROP CONSTRAINT cyclone_tasks_pkey;
ALTER TABLE __schema__.cyclone_tasks ADD PRIMARY KEY (run_id, id);
DROP INDEX __schema__.idx_tasks_run;
DROP INDEX __schema__.idx_runs_name;
DROP INDEX __schema__.idx_tasks_lease;
CREATE INDEX idx_tasks_lease ON __schema__.cyclone_tasks (lease_until)
    WHERE lease_until IS NOT NULL;
ALTER TABLE __schema__.cyclone_tasks ADD CONSTRAINT cyclone_tasks_leased_while_running
    CHECK ((state = 'running') = (lease_until IS NOT NULL));
ALTER TABLE __schema__.cyclone_runs
    ADD COLUMN completed_task bigint, ADD COLUMN completed_claims integer;
ALTER TABLE __schema__.cyclone_steps
    ADD COLUMN completed_task bigint, ADD COLUMN completed_claims integer;
