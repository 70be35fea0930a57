-- Flow control (see migrations/0008_flow_control.sql and the claim in queries.sql): the rows
-- an operator changes. A change bumps the row's version, so a claim that counted running
-- tasks before it starts nothing and claims again; running work is never interrupted.
-- A changed rate starts its bucket empty: no burst follows a change. A per-key rate is a
-- sliding window over the starts log, which a change keeps: the window's starts still count.

-- name: queue_limits_set
-- Set (NULL: clear) a queue's limits, keeping whether it is paused. Clearing the per-key
-- rate drops its starts log (a queue's claims prune it only while it has the rate).
WITH cleared AS (
    DELETE FROM __schema__.cyclone_key_starts WHERE queue = $1 AND $6::integer IS NULL
)
INSERT INTO __schema__.cyclone_queues AS q
    (queue, concurrency, rate, per, key_concurrency, key_rate, key_per)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (queue) DO UPDATE
SET concurrency = excluded.concurrency, rate = excluded.rate, per = excluded.per,
    key_concurrency = excluded.key_concurrency, key_rate = excluded.key_rate,
    key_per = excluded.key_per, version = q.version + 1, updated_at = now(),
    tokens = CASE WHEN (q.rate, q.per) IS NOT DISTINCT FROM (excluded.rate, excluded.per)
                  THEN q.tokens ELSE 0 END,
    refilled_at = CASE WHEN (q.rate, q.per) IS NOT DISTINCT FROM (excluded.rate, excluded.per)
                       THEN q.refilled_at ELSE now() END;

-- name: queue_pause_set
-- Pause ($2 true) or resume a queue; returns whether it was paused before.
WITH before AS (
    SELECT paused FROM __schema__.cyclone_queues WHERE queue = $1
)
INSERT INTO __schema__.cyclone_queues AS q (queue, paused) VALUES ($1, $2)
ON CONFLICT (queue) DO UPDATE
SET paused = excluded.paused, version = q.version + 1, updated_at = now()
RETURNING coalesce((SELECT paused FROM before), false) AS was_paused;

-- name: queue_list
-- Every queue with a setting (paused or a limit), by name; or the one named ($1).
SELECT queue, paused, concurrency, rate, per, key_concurrency, key_rate, key_per
FROM __schema__.cyclone_queues
WHERE ($1::text IS NULL OR queue = $1)
  AND (paused OR concurrency IS NOT NULL OR rate IS NOT NULL OR key_concurrency IS NOT NULL
       OR key_rate IS NOT NULL)
ORDER BY queue;

-- name: queue_known
-- Whether queue $1 has a setting or a live worker claims from it (a few rows each, by key).
SELECT EXISTS (SELECT 1 FROM __schema__.cyclone_queues WHERE queue = $1)
    OR EXISTS (SELECT 1 FROM __schema__.cyclone_workers w
               WHERE w.expires_at > now() AND $1 = ANY (w.queues));

-- name: kind_limits_set
-- Set (NULL: clear) a kind's limits, across every queue it runs on.
INSERT INTO __schema__.cyclone_kind_limits AS k (kind, concurrency, rate, per)
VALUES ($1, $2, $3, $4)
ON CONFLICT (kind) DO UPDATE
SET concurrency = excluded.concurrency, rate = excluded.rate, per = excluded.per,
    version = k.version + 1, updated_at = now(),
    tokens = CASE WHEN (k.rate, k.per) IS NOT DISTINCT FROM (excluded.rate, excluded.per)
                  THEN k.tokens ELSE 0 END,
    refilled_at = CASE WHEN (k.rate, k.per) IS NOT DISTINCT FROM (excluded.rate, excluded.per)
                       THEN k.refilled_at ELSE now() END;

-- name: kind_limits_list
-- Every kind with a limit, by name.
SELECT kind, concurrency, rate, per FROM __schema__.cyclone_kind_limits
WHERE concurrency IS NOT NULL OR rate IS NOT NULL
ORDER BY kind;

-- The enqueue statements of queries.sql for work with a group key (the group= option), the
-- same but for the group key on the run and its tasks. Work without one goes through those,
-- which write no column of this migration: a client upgraded before `migrate` still enqueues.

-- name: job_insert_many_grouped
-- job_insert_many, and $13 the group key: on the run, and on each task.
WITH run AS (
    INSERT INTO __schema__.cyclone_runs
        (id, name, job, input, queue, nodes, remaining, priority, max_attempts, deadline, trace,
         group_key)
    SELECT i.id, $3, true, i.input::jsonb, $4, 1, 1, $5, $7, $9, $10::jsonb, $13
    FROM unnest($1::uuid[], $2::text[]) AS i (id, input)
), task AS (
    INSERT INTO __schema__.cyclone_tasks
        (run_id, kind, queue, priority, available_at, max_attempts, sequence_key, group_key)
    SELECT i.id, $3, $4, $5, coalesce($6, now()), $7, $8, coalesce($13, '')
    FROM unnest($1::uuid[]) WITH ORDINALITY AS i (id, ord)
    ORDER BY i.ord
)
SELECT pg_notify($11, $12) WHERE $12::text IS NOT NULL;

-- name: job_insert_unique_grouped
-- job_insert_unique, and $14 the group key: on the run, and on its task.
WITH run AS (
    INSERT INTO __schema__.cyclone_runs AS r
        (id, name, job, input, queue, unique_key, nodes, remaining, priority, max_attempts,
         deadline, trace, group_key)
    VALUES ($1, $3, true, $2::jsonb, $4, $13, 1, 1, $5, $7, $9, $10::jsonb, $14)
    ON CONFLICT (name, unique_key) WHERE unique_key IS NOT NULL AND state = 'pending'
    DO NOTHING
    RETURNING r.id
), task AS (
    INSERT INTO __schema__.cyclone_tasks
        (run_id, kind, queue, priority, available_at, max_attempts, sequence_key, group_key)
    SELECT id, $3, $4, $5, coalesce($6, now()), $7, $8, coalesce($14, '') FROM run
)
SELECT c.n, (SELECT pg_notify($11, $12) WHERE $12::text IS NOT NULL AND c.n > 0)
FROM (SELECT count(*)::int AS n FROM run) c;

-- name: workflow_insert_grouped
-- workflow_insert, and $19 the group key: on the run (for the nodes queued later: see
-- node_advance), and on each root node's task.
WITH run AS (
    INSERT INTO __schema__.cyclone_runs AS r
        (id, name, job, input, result_node, key, nodes, remaining, priority, deadline, trace,
         group_key)
    VALUES ($1, $2, false, $3::jsonb, $4, $5, $6, $6, $8, $7, $18::jsonb, $19)
    ON CONFLICT (name, key) WHERE key IS NOT NULL DO NOTHING
    RETURNING r.id
/* fragment: workflow_nodes */
), tasks AS (
    INSERT INTO __schema__.cyclone_tasks
        (run_id, node, kind, queue, priority, available_at, max_attempts, group_key)
    SELECT run.id, n.node, n.kind, n.queue, $8, coalesce($9, now()), n.max_attempts,
           coalesce($19, '')
    FROM run, node n
    WHERE n.deps = 0 AND n.kind IS NOT NULL
)
SELECT id FROM run;
