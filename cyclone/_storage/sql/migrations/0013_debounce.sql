-- Debounce and throttle on enqueue (docs/debounce.md). Every column is new and nullable, and
-- the table is new: adding them rewrites nothing, and the previous release's statements
-- leave them out.
--
-- A debounced job's task carries its key and when its run was first enqueued (max_wait
-- counts from it). While the task was never claimed (claims = 0) its run is the key's
-- waiting run, and the unique index keeps it the only one: it is where two enqueues of one
-- key meet. A claim bumps claims, which takes the task out of the index: a run that started
-- (running, or retrying) no longer holds the key, and the next enqueue makes a new run. The
-- index holds the waiting debounced tasks only, so a plain insert or claim adds no entry.
ALTER TABLE __schema__.cyclone_tasks
    ADD COLUMN debounce_key text,
    ADD COLUMN debounce_since timestamptz;
CREATE UNIQUE INDEX idx_tasks_debounce ON __schema__.cyclone_tasks (kind, debounce_key)
    WHERE debounce_key IS NOT NULL AND claims = 0;

-- A throttle key's current period: the run that opened it and when. One row per key of a
-- kind, taken over by the first enqueue after the period, so two enqueues of one key meet
-- at its primary key whatever their snapshots.
CREATE TABLE __schema__.cyclone_throttles (
    kind    text NOT NULL,
    key     text NOT NULL,
    run_id  uuid NOT NULL,
    opened  timestamptz NOT NULL,
    PRIMARY KEY (kind, key)
);
