-- Reading runs (their states as reported, results, listings, what no worker serves) and
-- acting on one: cancelling it, and ending or re-opening a job. The stored run state is
-- pending until the run ends; the state users see (reported_state) tells a started run.

-- fragment: reported_state
-- Run r's state as reported: a pending run that has started (a node completed, or a task is
-- running or past its first attempt) is running. Its tasks are looked at with LIMIT 1, a
-- look-up by key per run: as EXISTS, the planner may hash the whole task table.
CASE
    WHEN r.state <> 'pending' THEN r.state
    WHEN r.remaining < r.nodes THEN 'running'
    WHEN (SELECT true FROM __schema__.cyclone_tasks t
          WHERE t.run_id = r.id AND (t.state = 'running' OR t.attempt > 0) LIMIT 1)
        THEN 'running'
    ELSE 'pending' END

-- fragment: run_output
-- Run r's output as JSON text: a job's own, a workflow's result node's (NULL without one).
CASE WHEN r.job THEN r.output::text
     ELSE (SELECT s.output::text FROM __schema__.cyclone_steps s
           WHERE s.run_id = r.id AND s.node = r.result_node) END

-- name: run_status(run_id)
SELECT /* fragment: reported_state */ AS state
FROM __schema__.cyclone_runs r WHERE r.id = :run_id;

-- name: run_result(run_id)
SELECT r.state, r.job, r.result_node, r.error::text AS error,
    /* fragment: run_output */ AS output
FROM __schema__.cyclone_runs r WHERE r.id = :run_id;

-- name: run_payload(run_id)
-- A run's input and output (a job's own, or a result workflow's result node's) as JSON
-- text: for run.info() and the dashboard.
SELECT r.input::text AS input, /* fragment: run_output */ AS output
FROM __schema__.cyclone_runs r WHERE r.id = :run_id;

-- name: run_get(run_id)
-- One run as listed (run_search's columns), its state as reported (a pending run that
-- started is running). Listing goes through run_search.
SELECT r.id, r.name, r.job, r.key, r.created_at, r.finished_at, r.error::text AS error,
    /* fragment: reported_state */ AS state, r.parent_run, r.parent_node
FROM __schema__.cyclone_runs r
WHERE r.id = :run_id;

-- name: run_nodes(run_id)
-- Each node's state, by node name, a map node's items after it in item order: a queued
-- node's live task tells available, scheduled or running; a waiting sleep node is sleeping
-- until its wake_at.
SELECT * FROM (
    SELECT s.node, s.kind, s.map_of, s.item, s.child_run,
        CASE WHEN s.state = 'waiting' AND s.spec ? 'sleep' THEN 'sleeping'
             WHEN s.state <> 'queued' THEN s.state
             WHEN t.state = 'running' THEN 'running'
             WHEN t.available_at > __now__ THEN 'scheduled'
             ELSE 'available' END AS state,
        coalesce(t.attempt, s.attempts) AS attempts,
        coalesce(t.errors, s.errors)::text AS errors,
        CASE WHEN s.spec ? 'sleep' THEN s.wait_until END AS wake_at
    FROM __schema__.cyclone_steps s
    LEFT JOIN __schema__.cyclone_tasks t ON t.run_id = s.run_id AND t.node = s.node
    WHERE s.run_id = :run_id
    UNION ALL
    SELECT r.name, r.name, NULL, NULL, NULL,
        CASE WHEN t.state = 'running' THEN 'running'
             WHEN t.state = 'failed' THEN 'failed'
             WHEN t.available_at > __now__ THEN 'scheduled'
             WHEN t.id IS NOT NULL THEN 'available'
             ELSE r.state END,
        coalesce(t.attempt, r.attempts), coalesce(t.errors, r.errors)::text,
        NULL::timestamptz
    FROM __schema__.cyclone_runs r
    LEFT JOIN __schema__.cyclone_tasks t ON t.run_id = r.id
    WHERE r.id = :run_id AND r.job
) n
ORDER BY coalesce(map_of, node), item NULLS FIRST, node;

-- name: run_edges(run_id)
SELECT parent, child, cond FROM __schema__.cyclone_edges WHERE run_id = :run_id
ORDER BY parent, child;

-- name: run_kind(run_id)
SELECT job, name, state FROM __schema__.cyclone_runs WHERE id = :run_id;

-- name: run_unique_holder(run_id)
-- The active run holding the unique key of (failed) run :run_id.
SELECT f.name, f.unique_key, h.id AS holder
FROM __schema__.cyclone_runs f
JOIN __schema__.cyclone_runs h
  ON h.name = f.name AND h.unique_key = f.unique_key AND h.state = 'pending'
WHERE f.id = :run_id;

-- fragment: served
-- Whether a live worker serves claimable work c (c.queue, c.kind and c.workflow: its run's
-- workflow for a node, NULL for a job) by the rules of task_claim: it claims from the queue,
-- runs the kind and, for a node, knows the workflow. The one test of unserved work
-- (run_unserved, stats_unserved, node_explain); the few live rows of cyclone_workers.
EXISTS (
    SELECT 1 FROM __schema__.cyclone_workers w
    WHERE w.expires_at > __now__ AND c.queue = ANY (w.queues) AND c.kind = ANY (w.kinds)
      AND (c.workflow IS NULL OR c.workflow = ANY (w.workflows)))

-- name: run_unserved(run_id)
-- A run's claimable tasks that no live worker serves (served), to say what a run.wait()
-- that timed out was waiting for.
SELECT c.node, c.kind, c.queue FROM (
    SELECT t.id, t.node, t.kind, t.queue,
        CASE WHEN t.node IS NOT NULL THEN r.name END AS workflow
    FROM __schema__.cyclone_tasks t
    JOIN __schema__.cyclone_runs r ON r.id = t.run_id
    WHERE t.run_id = :run_id AND t.state = 'available' AND t.available_at <= __now__
) c
WHERE NOT /* fragment: served */
ORDER BY c.id;

-- name: stats_queues
-- Per queue: tasks by state, how long the oldest claimable task has waited, the steps
-- completed in the last minute (jobs from runs, workflow nodes from steps), and the live
-- workers claiming from it. A queue with live workers and no work has a row of zeros.
WITH live AS (
    SELECT queue,
        count(*) FILTER (WHERE state = 'available' AND available_at <= __now__) AS available,
        count(*) FILTER (WHERE state = 'available' AND available_at > __now__) AS scheduled,
        count(*) FILTER (WHERE state = 'running') AS running,
        count(*) FILTER (WHERE state = 'running' AND lease_until < __now__) AS expired,
        count(*) FILTER (WHERE state = 'failed') AS blocking,
        extract(epoch FROM __now__ - min(available_at)
            FILTER (WHERE state = 'available' AND available_at <= __now__)) AS oldest_seconds
    FROM __schema__.cyclone_tasks GROUP BY queue
), done AS (
    SELECT queue, count(*) AS completed FROM (
        SELECT queue FROM __schema__.cyclone_runs
        WHERE job AND state = 'completed' AND finished_at > __now__ - interval '1 minute'
        UNION ALL
        SELECT queue FROM __schema__.cyclone_steps
        WHERE state = 'completed' AND kind IS NOT NULL
          AND finished_at > __now__ - interval '1 minute'
    ) f GROUP BY queue
), served AS (
    SELECT q AS queue, count(*) AS workers
    FROM __schema__.cyclone_workers w, unnest(w.queues) AS q
    WHERE w.expires_at > __now__
    GROUP BY q
), queues AS (
    SELECT queue FROM live UNION SELECT queue FROM done UNION SELECT queue FROM served
)
SELECT q.queue,
    coalesce(l.available, 0)::int AS available, coalesce(l.scheduled, 0)::int AS scheduled,
    coalesce(l.running, 0)::int AS running, coalesce(l.expired, 0)::int AS expired,
    coalesce(l.blocking, 0)::int AS blocking, l.oldest_seconds::float8 AS oldest_seconds,
    coalesce(d.completed, 0)::int AS completed_last_minute,
    coalesce(s.workers, 0)::int AS workers
FROM queues q
LEFT JOIN live l ON l.queue = q.queue
LEFT JOIN done d ON d.queue = q.queue
LEFT JOIN served s ON s.queue = q.queue
ORDER BY 1;

-- name: stats_unserved
-- Claimable tasks that no live worker serves, by queue, kind and workflow (NULL for jobs).
-- A worker serves a task by the rules of task_claim (served). Tasks are grouped before the
-- workers are consulted, so the cost is one pass over the claimable tasks; a node's workflow
-- is read by key, run by run, never by scanning the run history.
WITH claimable AS (
    SELECT t.queue, t.kind,
        CASE WHEN t.node IS NOT NULL THEN
            (SELECT r.name FROM __schema__.cyclone_runs r WHERE r.id = t.run_id)
        END AS workflow,
        count(*)::int AS count
    FROM __schema__.cyclone_tasks t
    WHERE t.state = 'available' AND t.available_at <= __now__
    GROUP BY 1, 2, 3
)
SELECT c.queue, c.kind, c.workflow, c.count FROM claimable c
WHERE NOT /* fragment: served */
ORDER BY 1, 2, 3;

-- name: run_cancel(run_id)
-- Cancel a run (locked by the caller) that is pending, or failed (a failed sequenced job
-- blocks its sequence until cancelled). Handlers of dropped tasks stop at their next
-- heartbeat.
WITH r AS (
    UPDATE __schema__.cyclone_runs SET state = 'cancelled', finished_at = __now__
    WHERE id = :run_id AND state IN ('pending', 'failed')
    RETURNING id
), doomed AS (
    SELECT t.run_id, t.id FROM __schema__.cyclone_tasks t
    WHERE t.run_id IN (SELECT id FROM r) ORDER BY t.id FOR UPDATE
), dropped AS (
    DELETE FROM __schema__.cyclone_tasks t USING doomed d
    WHERE t.run_id = d.run_id AND t.id = d.id
), steps AS (
    UPDATE __schema__.cyclone_steps SET state = 'cancelled', wait_until = NULL
    WHERE run_id IN (SELECT id FROM r) AND state NOT IN ('completed', 'failed', 'skipped')
)
SELECT count(*)::int FROM r;

-- name: job_lock(run_id)
-- Lock a job's task rows, then its run (the job order), in a statement of its own before
-- one that decides on the run's state. A retry that re-opened the run and queued a new task
-- meanwhile has committed once this returns, and the next statement's snapshot sees both;
-- without it, job_end would cancel the re-opened run and miss the new task.
WITH task AS (
    SELECT id FROM __schema__.cyclone_tasks WHERE run_id = :run_id ORDER BY id FOR UPDATE
)
SELECT r.state FROM __schema__.cyclone_runs r
WHERE r.id = :run_id
  -- Lock order: the tasks before the run. Always true, this count cannot be decided before
  -- task has been read in full, and so has locked every task row.
  AND (SELECT count(*) FROM task) >= 0
FOR UPDATE OF r;

-- name: job_end(run_id, state, error)
-- Cancel a pending or failed job, or (:state = 'failed') fail a pending one past its
-- deadline; job_lock has locked it. Its task row is handled first (a running handler stops at
-- its next heartbeat), then the run, in the job lock order. A failing
-- sequenced job keeps its task row, failed, to block its sequence as any failure does; a
-- task already failed (its last attempt failed meanwhile) is left as it is.
WITH gone AS (
    DELETE FROM __schema__.cyclone_tasks
    WHERE run_id = :run_id
      AND (:state = 'cancelled' OR (sequence_key IS NULL AND state <> 'failed'))
    RETURNING attempt, errors
), blocking AS (
    UPDATE __schema__.cyclone_tasks
    SET state = 'failed', lease_until = NULL, worker = NULL
    WHERE run_id = :run_id AND :state = 'failed' AND sequence_key IS NOT NULL
      AND state <> 'failed'
    RETURNING attempt, errors
), task AS (  -- the job's attempt record, kept on the run
    SELECT attempt, errors FROM gone UNION ALL SELECT attempt, errors FROM blocking LIMIT 1
)
UPDATE __schema__.cyclone_runs r
SET state = :state, error = :error::jsonb, finished_at = __now__,
    attempts = coalesce((SELECT attempt FROM task), r.attempts),
    errors = coalesce((SELECT errors FROM task), r.errors)
WHERE r.id = :run_id AND (r.state = 'pending' OR (r.state = 'failed' AND :state = 'cancelled'))
  -- Lock order: the task row before the run. Always true, this count cannot be decided
  -- before gone and blocking have written (and so locked) the task row.
  AND (SELECT count(*) FROM task) >= 0
RETURNING r.id;

-- name: job_reopen(run_id)
-- Re-open a failed job with a fresh attempt budget (task row, then run): revive its blocking
-- task if it kept one, else queue a new task once the run re-opened.
WITH revived AS (
    UPDATE __schema__.cyclone_tasks t
    SET state = 'available', attempt = 0, available_at = __now__
    WHERE t.run_id = :run_id AND t.state = 'failed'
    RETURNING t.id
), r AS (
    UPDATE __schema__.cyclone_runs
    SET state = 'pending', error = NULL, finished_at = NULL, attempts = 0
    WHERE id = :run_id AND state = 'failed'
      -- Lock order: the task row before the run. Always true, this count cannot be decided
      -- before revived has written (and so locked) the blocking task, if the job kept one.
      AND (SELECT count(*) FROM revived) >= 0
    RETURNING id, name, queue, priority, max_attempts, errors, group_key
), queued AS (
    -- The new task carries the errors of earlier attempts, so the history survives.
    INSERT INTO __schema__.cyclone_tasks
        (run_id, kind, queue, priority, max_attempts, errors, group_key)
    SELECT id, name, queue, priority, max_attempts, errors, coalesce(group_key, '') FROM r
    WHERE NOT EXISTS (SELECT 1 FROM revived)
)
SELECT queue FROM r;

