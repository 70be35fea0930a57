-- Statements behind the read models the dashboard uses (cyclone.web), each bounded: a page,
-- a count with a cap, a window of minutes, or one run.

-- fragment: runs_matching
-- The runs that match the filters, newest first: keyset pagination on the time-ordered id
-- ($5), every filter optional. The walk reads at most $9 runs from the cursor (NULL: no
-- bound), so a filter that few recent runs match stops early and the caller continues from
-- where the walk ended. A queue matches a job by its queue and a workflow run by any of its
-- nodes' queues. The sub-selects that look at a run's tasks and steps end in LIMIT 1 so that
-- each stays a look-up by primary key per run walked: as EXISTS, the planner may hash the
-- whole table.
FROM (
    SELECT * FROM __schema__.cyclone_runs
    WHERE ($5::uuid IS NULL OR id < $5)
    ORDER BY id DESC
    LIMIT $9
) r
CROSS JOIN LATERAL (
    SELECT CASE
        WHEN r.state <> 'pending' THEN r.state
        WHEN r.remaining < r.nodes THEN 'running'
        WHEN (SELECT true FROM __schema__.cyclone_tasks t
              WHERE t.run_id = r.id AND (t.state = 'running' OR t.attempt > 0) LIMIT 1)
            THEN 'running'
        ELSE 'pending' END AS state
) live
WHERE ($1::text IS NULL OR r.name = $1)
  AND ($2::text IS NULL OR r.key = $2)
  AND ($3::timestamptz IS NULL OR r.created_at >= $3)
  AND ($4::timestamptz IS NULL OR r.created_at < $4)
  AND ($6::text[] IS NULL OR live.state = ANY ($6))
  AND ($7::text IS NULL OR CASE WHEN r.job THEN r.queue = $7
        ELSE (SELECT true FROM __schema__.cyclone_steps s
              WHERE s.run_id = r.id AND s.queue = $7 LIMIT 1) END)

-- name: run_search
-- One page ($8 runs) of the runs matching the filters.
SELECT r.id, r.name, r.job, r.key, r.created_at, r.finished_at, r.error::text AS error,
    live.state
/* fragment: runs_matching */
ORDER BY r.id DESC
LIMIT $8;

-- name: run_walk_end
-- Where a walk of $2 runs older than $1 (NULL: from the newest) ends: the last run it reads,
-- or NULL when fewer runs are left. Index-only on the primary key.
SELECT id FROM __schema__.cyclone_runs
WHERE ($1::uuid IS NULL OR id < $1)
ORDER BY id DESC
OFFSET $2 - 1
LIMIT 1;

-- name: run_count
-- How many runs match the filters, counting at most $8.
SELECT count(*)::int FROM (
    SELECT 1
    /* fragment: runs_matching */
    LIMIT $8
) matched;

-- name: run_payloads
-- A run's input and output (a job's own, or a result workflow's result node's) as JSON text.
SELECT r.input::text AS input,
    CASE WHEN r.job THEN r.output::text
         ELSE (SELECT s.output::text FROM __schema__.cyclone_steps s
               WHERE s.run_id = r.id AND s.node = r.result_node) END AS output
FROM __schema__.cyclone_runs r WHERE r.id = $1;

-- name: node_payloads
-- Each node's queue, output and (for a wait node) signal payload, by node name.
SELECT node, queue, output::text AS output, signal::text AS signal
FROM __schema__.cyclone_steps WHERE run_id = $1 ORDER BY node;

-- name: throughput_minutes
-- Steps that ended completed or failed per queue and minute over the last $1 minutes: jobs
-- from their runs (idx_runs_finished), workflow nodes from their steps (idx_steps_finished).
SELECT queue, date_trunc('minute', finished_at) AS minute,
    count(*) FILTER (WHERE state = 'completed')::int AS completed,
    count(*) FILTER (WHERE state = 'failed')::int AS failed
FROM (
    SELECT queue, state, finished_at FROM __schema__.cyclone_runs
    WHERE state <> 'pending' AND state IN ('completed', 'failed') AND job
      AND finished_at >= date_trunc('minute', now()) - make_interval(mins => $1 - 1)
    UNION ALL
    SELECT queue, state, finished_at FROM __schema__.cyclone_steps
    WHERE state IN ('completed', 'failed') AND kind IS NOT NULL
      AND finished_at >= date_trunc('minute', now()) - make_interval(mins => $1 - 1)
) ended
GROUP BY 1, 2
ORDER BY 1, 2;
