-- Which workers are running, and what each one claims, so that work no live worker serves
-- can be shown (client.stats(), cyclone_queue_unserved). Each worker upserts its own row
-- once per heartbeat (worker_present) and deletes it on a graceful stop; a row whose
-- expires_at has passed belongs to a worker that died or stalled: readers ignore it and the
-- next heartbeat of any worker deletes it.
CREATE TABLE __schema__.cyclone_workers (
    id         text PRIMARY KEY,          -- the worker's worker_id
    host       text NOT NULL,
    pid        integer NOT NULL,
    queues     text[] NOT NULL,           -- what it claims: the rules of task_claim
    kinds      text[] NOT NULL,
    workflows  text[] NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now(),
    seen_at    timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL        -- live until then, a few heartbeats after seen_at
);

CREATE INDEX idx_workers_expires ON __schema__.cyclone_workers (expires_at);
