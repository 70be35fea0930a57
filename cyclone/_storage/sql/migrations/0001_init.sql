-- Cyclone's tables. __schema__ is replaced by the client's (validated, quoted) schema.
--
-- Live work and history are kept apart so that claims only ever touch live work:
--   cyclone_runs   one row per run, for its whole life (state, input, keys, result).
--   cyclone_steps  one row per node of a workflow run (a standalone job has none: its run
--                  row carries its step's record).
--   cyclone_edges  the dependency edges of each workflow run, as submitted.
--   cyclone_tasks  the hot table: one row per step that is claimable, scheduled or running.
--                  A finished step's row is deleted, so the claim index holds live rows only.

CREATE TABLE __schema__.cyclone_runs (
    id          uuid PRIMARY KEY,          -- time-ordered (UUIDv7): newest-first listing by id
    name        text NOT NULL,             -- workflow name, or step kind for a standalone job
    job         boolean NOT NULL,          -- a standalone job: one step, no step rows
    state       text NOT NULL DEFAULT 'pending'
                CHECK (state IN ('pending', 'completed', 'failed', 'cancelled')),
    input       jsonb NOT NULL,
    output      jsonb,                     -- a job's output
    result_node text,                      -- a result workflow's result node
    key         text,                      -- submit_once key
    unique_key  text,                      -- unique= key, held while the run is pending
    queue       text,                      -- a job's queue
    nodes       integer NOT NULL,          -- nodes in the run (1 for a job)
    remaining   integer NOT NULL,          -- nodes not completed; 0 when completed
    priority    integer NOT NULL DEFAULT 0,      -- a job's priority, to re-queue it on retry
    max_attempts integer NOT NULL DEFAULT 1,     -- a job's attempt budget, likewise
    attempts    integer NOT NULL DEFAULT 0,       -- a job's attempts, kept when it ends
    errors      jsonb NOT NULL DEFAULT '[]',      -- a job's attempt errors, kept when it ends
    error       jsonb,                     -- why the run failed
    deadline    timestamptz,
    created_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);

-- One run per (workflow name, key) in every state, until the run is purged.
CREATE UNIQUE INDEX idx_runs_submit_key ON __schema__.cyclone_runs (name, key)
    WHERE key IS NOT NULL;
-- unique= holds among active runs only: a run leaves this index when it ends.
CREATE UNIQUE INDEX idx_runs_unique_key ON __schema__.cyclone_runs (name, unique_key)
    WHERE unique_key IS NOT NULL AND state = 'pending';
CREATE INDEX idx_runs_name ON __schema__.cyclone_runs (name, id);
CREATE INDEX idx_runs_deadline ON __schema__.cyclone_runs (deadline)
    WHERE deadline IS NOT NULL AND state = 'pending';
CREATE INDEX idx_runs_finished ON __schema__.cyclone_runs (finished_at)
    WHERE state <> 'pending';

CREATE TABLE __schema__.cyclone_steps (
    run_id       uuid NOT NULL,
    node         text NOT NULL,
    kind         text,                     -- NULL for a wait node
    queue        text NOT NULL,
    priority     integer NOT NULL,
    max_attempts integer NOT NULL,
    -- pending: dependencies not done (or the run halted); queued: has a task row;
    -- waiting: a reachable wait node without its signal.
    state        text NOT NULL
                 CHECK (state IN ('pending', 'queued', 'waiting',
                                  'completed', 'failed', 'cancelled')),
    pending_deps integer NOT NULL,
    attempts     integer NOT NULL DEFAULT 0,
    errors       jsonb NOT NULL DEFAULT '[]',
    output       jsonb,
    signal       jsonb,                    -- a wait node's payload, kept even before reachable
    wait_timeout double precision,         -- seconds
    wait_until   timestamptz,
    finished_at  timestamptz,
    PRIMARY KEY (run_id, node)
);

CREATE INDEX idx_steps_wait_until ON __schema__.cyclone_steps (wait_until)
    WHERE state = 'waiting' AND wait_until IS NOT NULL;

CREATE TABLE __schema__.cyclone_edges (
    run_id uuid NOT NULL,
    parent text NOT NULL,
    child  text NOT NULL,
    PRIMARY KEY (run_id, parent, child)
);

CREATE INDEX idx_edges_child ON __schema__.cyclone_edges (run_id, child);

CREATE TABLE __schema__.cyclone_tasks (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,  -- also enqueue order
    run_id       uuid NOT NULL,
    node         text,                     -- NULL for a standalone job
    kind         text NOT NULL,
    queue        text NOT NULL,
    priority     integer NOT NULL DEFAULT 0,
    -- failed: a sequenced job that ran out of attempts stays to block its sequence.
    state        text NOT NULL DEFAULT 'available'
                 CHECK (state IN ('available', 'running', 'failed')),
    available_at timestamptz NOT NULL DEFAULT now(),
    attempt      integer NOT NULL DEFAULT 0,
    max_attempts integer NOT NULL,
    claims       integer NOT NULL DEFAULT 0,   -- fencing token: bumped by every claim
    lease_until  timestamptz,
    worker       text,
    sequence_key text,
    errors       jsonb NOT NULL DEFAULT '[]',
    started_at   timestamptz
) WITH (fillfactor = 80, autovacuum_vacuum_scale_factor = 0.01,
        autovacuum_vacuum_insert_scale_factor = 0.01);

CREATE INDEX idx_tasks_claim ON __schema__.cyclone_tasks (queue, priority DESC, available_at, id)
    WHERE state = 'available';
CREATE INDEX idx_tasks_lease ON __schema__.cyclone_tasks (lease_until)
    WHERE state = 'running';
CREATE INDEX idx_tasks_run ON __schema__.cyclone_tasks (run_id);
CREATE INDEX idx_tasks_sequence ON __schema__.cyclone_tasks (kind, sequence_key, id)
    WHERE sequence_key IS NOT NULL;
