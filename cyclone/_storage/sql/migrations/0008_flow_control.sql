-- Flow control (docs/flow-control.md): paused queues, concurrency and rate limits per queue
-- and per kind, and group keys that the claim rotates across fairly.
--
-- A queue or kind with no row (or a row of NULL limits) is unlimited: its claims read the
-- row by key and lock nothing. A limited one's row is the limit's bookkeeping: every claim
-- of the queue locks it, and every claim that starts work writes it (version, bucket), so it
-- is the one hot row a limit costs. A limited claim counts running tasks through the lease
-- index (idx_tasks_lease: running tasks only, as many as the workers' slots): no index is
-- added that every claim and completion, limited or not, would have to write.
CREATE TABLE __schema__.cyclone_queues (
    queue           text PRIMARY KEY,
    paused          boolean NOT NULL DEFAULT false,
    concurrency     integer CHECK (concurrency > 0),      -- running at once, all workers
    rate            integer CHECK (rate > 0),             -- starts per `per` seconds
    per             double precision CHECK (per > 0),
    key_concurrency integer CHECK (key_concurrency > 0),  -- running at once per group key
    key_rate        integer CHECK (key_rate > 0),         -- starts per `key_per` per key
    key_per         double precision CHECK (key_per > 0),
    tokens          double precision NOT NULL DEFAULT 0,  -- the rate's bucket at refilled_at
    refilled_at     timestamptz NOT NULL DEFAULT now(),
    -- Bumped by every claim that starts work and every change: a claim whose snapshot saw
    -- an older version than the row it locked counts running tasks that are out of date.
    version         bigint NOT NULL DEFAULT 0,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    CHECK ((rate IS NULL) = (per IS NULL)),
    CHECK ((key_rate IS NULL) = (key_per IS NULL))
);

-- The starts of a queue with a per-key rate, by the claim's clock: a key may start key_rate
-- in any key_per seconds (a sliding window). Written and pruned only by that queue's claims,
-- which hold its row locked: the queue's next claim deletes the rows out of the window, and
-- clearing the rate deletes them all.
CREATE TABLE __schema__.cyclone_key_starts (
    queue     text NOT NULL,
    group_key text NOT NULL,
    at        timestamptz NOT NULL
);
CREATE INDEX idx_key_starts ON __schema__.cyclone_key_starts (queue, at);

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
-- A run's group key (NULL: none), so that the tasks made for it later (a workflow's next
-- nodes, a re-opened job) carry it too.
ALTER TABLE __schema__.cyclone_runs ADD COLUMN group_key text;
