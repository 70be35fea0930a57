-- Progress and streams (docs/progress.md). The tables are new and the column has a constant
-- default: adding them rewrites nothing, and the previous release's statements leave them out.
--
-- stream_head: how many items the run's stream holds, the last offset given. An append
-- bumps it in the run's row, so appends to one run take turns on that row lock: offsets are
-- given in commit order with no gap (a reader that saw offset n has seen every one before
-- it), and an append waits for a transition of the run in flight, then sees whether the run
-- ended (its stream is closed then).
ALTER TABLE __schema__.cyclone_runs ADD COLUMN stream_head bigint NOT NULL DEFAULT 0;

-- A run's stream: append-only items, by offset, each with the node and attempt that wrote
-- it. ON DELETE CASCADE: a run's items go with it, whichever statement deletes the run
-- (purge, retention, a job that keeps nothing once completed).
CREATE TABLE __schema__.cyclone_streams (
    run_id      uuid NOT NULL REFERENCES __schema__.cyclone_runs (id) ON DELETE CASCADE,
    seq         bigint NOT NULL,
    node        text NOT NULL,
    attempt     int NOT NULL,
    value       jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, seq)
);

-- The latest progress of each node of a run (a job's under its kind), overwritten by each
-- report; writes counts them. Goes with its run as the stream does.
CREATE TABLE __schema__.cyclone_progress (
    run_id      uuid NOT NULL REFERENCES __schema__.cyclone_runs (id) ON DELETE CASCADE,
    node        text NOT NULL,
    attempt     int NOT NULL,
    value       jsonb NOT NULL,
    writes      int NOT NULL DEFAULT 1,
    updated_at  timestamptz NOT NULL,
    PRIMARY KEY (run_id, node)
);
