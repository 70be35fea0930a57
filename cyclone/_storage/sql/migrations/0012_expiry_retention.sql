-- Jobs that expire while they wait, and retention per kind or workflow name
-- (docs/jobs.md, "Expiry"; docs/operations.md, "Retention").
--
-- A run may end expired: a job not started by its expires_at. The new CHECK allows it; it
-- is added NOT VALID (existing rows are not read again, and all of them pass it), and the
-- previous release, which never writes 'expired', is unaffected. The old constraint goes
-- in the same transaction, so no moment allows less than before.
ALTER TABLE __schema__.cyclone_runs DROP CONSTRAINT cyclone_runs_state_check;
ALTER TABLE __schema__.cyclone_runs ADD CONSTRAINT cyclone_runs_state_check
    CHECK (state IN ('pending', 'completed', 'failed', 'cancelled', 'expired')) NOT VALID;

-- expires_at: when a job's task that has not started yet ends expired (NULL: never, and
-- always once claimed: a retry of a job that started does not expire). Nullable: adding it
-- rewrites nothing, and the previous release's inserts leave it out. The sweep finds due
-- tasks by the index, which holds only tasks with an expiry; it is built here rather than
-- concurrently because the column is new, so it indexes no row of a task table whose rows
-- are live work only.
ALTER TABLE __schema__.cyclone_tasks ADD COLUMN expires_at timestamptz;
ALTER TABLE __schema__.cyclone_tasks ADD CONSTRAINT cyclone_tasks_expires_unstarted
    CHECK (expires_at IS NULL OR state = 'available') NOT VALID;
CREATE INDEX idx_tasks_expires ON __schema__.cyclone_tasks (expires_at)
    WHERE expires_at IS NOT NULL;

-- The kinds and workflows with a retention of their own, as the workers that define them
-- declare it (NULL: kept forever). The client-wide sweep leaves these names alone; the
-- workers that know a name purge it by its own ages. A worker that knows a name without a
-- retention of its own deletes the name's row, so the name goes back to the client's.
CREATE TABLE __schema__.cyclone_retention (
    name       text PRIMARY KEY,
    completed  interval,
    failed     interval,
    cancelled  interval,
    expired    interval,
    updated_at timestamptz NOT NULL DEFAULT now()
);
