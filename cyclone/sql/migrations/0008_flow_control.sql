-- Flow control (docs/flow-control.md): paused queues, concurrency and rate limits per queue
-- and per kind, and group keys that the claim rotates across fairly.
--
-- A queue or kind with no row (or a row of NULL limits) is unlimited: its claims read the
-- row by key and lock nothing. A limited one's row is the limit's bookkeeping: every claim
-- of the queue locks it, and every claim that starts work writes it (version, bucket), so it
-- is the one hot row a limit costs. Running tasks are counted by idx_tasks_running{,_kind}.
CREATE TABLE __schema__.cyclone_queues (
    queue           text PRIMARY KEY,
    paused          boolean NOT NULL DEFAULT false,
    concurrency     integer CHECK (concurrency > 0),      -- running at once, all workers
    rate            integer CHECK (rate > 0),             -- starts per `per` seconds
    per             double precision CHECK (per > 0),
    key_concurrency integer CHECK (key_concurrency > 0),  -- running at once per group key
    tokens          double precision NOT NULL DEFAULT 0,  -- the rate's bucket at refilled_at
    refilled_at     timestamptz NOT NULL DEFAULT now(),
    -- Bumped by every claim that starts work and every change: a claim whose snapshot saw
    -- an older version than the row it locked counts running tasks that are out of date.
    version         bigint NOT NULL DEFAULT 0,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    CHECK ((rate IS NULL) = (per IS NULL))
);

CREATE TABLE __schema__.cyclone_kind_limits (
    kind        text PRIMARY KEY,
    concurrency integer CHECK (concurrency > 0),
    rate        integer CHECK (rate > 0),
    per         double precision CHECK (per > 0),
    tokens      double precision NOT NULL DEFAULT 0,
    refilled_at timestamptz NOT NULL DEFAULT now(),
    version     bigint NOT NULL DEFAULT 0,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    CHECK ((rate IS NULL) = (per IS NULL))
);

-- A task's group key ('' for none: one group of its own), and a claim index that finds the
-- keys with available work by one probe each and each key's next tasks in claim order. A
-- constant default: adding the column rewrites nothing.
LOCK TABLE __schema__.cyclone_tasks IN ACCESS EXCLUSIVE MODE;
ALTER TABLE __schema__.cyclone_tasks ADD COLUMN group_key text NOT NULL DEFAULT '';
DROP INDEX __schema__.idx_tasks_claim;
CREATE INDEX idx_tasks_claim
    ON __schema__.cyclone_tasks (queue, group_key, priority DESC, available_at, id)
    WHERE state = 'available';
-- Running tasks by queue and key, and by kind: what a limited claim counts. group_key is
-- never NULL: that half of the predicate is there so that only a statement that says it (the
-- claim's counts) can use these; task_reclaim and the like stay on the lease index.
CREATE INDEX idx_tasks_running ON __schema__.cyclone_tasks (queue, group_key)
    WHERE state = 'running' AND group_key IS NOT NULL;
CREATE INDEX idx_tasks_running_kind ON __schema__.cyclone_tasks (kind)
    WHERE state = 'running' AND group_key IS NOT NULL;
-- A run's group key (NULL: none), so that the tasks made for it later (a workflow's next
-- nodes, a re-opened job) carry it too.
ALTER TABLE __schema__.cyclone_runs ADD COLUMN group_key text;
