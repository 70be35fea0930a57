-- Statements behind the read models the dashboard uses (cyclone.web), each bounded: a page,
-- a count with a cap, a window of minutes, or one run.

-- fragment: runs_matching
-- The runs that match the filters, newest first: keyset pagination on the time-ordered id
-- (:cursor), every filter optional. The walk reads at most :scan runs from the cursor (NULL: no
-- bound), so a filter that few recent runs match stops early and the caller continues from
-- where the walk ended. A queue matches a job by its queue and a workflow run by any of its
-- nodes' queues. The sub-selects that look at a run's tasks and steps end in LIMIT 1 so that
-- each stays a look-up by primary key per run walked: as EXISTS, the planner may hash the
-- whole table.
FROM (
    SELECT * FROM __schema__.cyclone_runs
    WHERE (:cursor::uuid IS NULL OR id < :cursor)
    ORDER BY id DESC
    LIMIT :scan
) r
CROSS JOIN LATERAL (SELECT /* fragment: reported_state */ AS state) live
WHERE (:name::text IS NULL OR r.name = :name)
  AND (:key::text IS NULL OR r.key = :key)
  AND (:created_after::timestamptz IS NULL OR r.created_at >= :created_after)
  AND (:created_before::timestamptz IS NULL OR r.created_at < :created_before)
  AND (:states::text[] IS NULL OR live.state = ANY (:states))
  AND (:queue::text IS NULL OR CASE WHEN r.job THEN r.queue = :queue
        ELSE (SELECT true FROM __schema__.cyclone_steps s
              WHERE s.run_id = r.id AND s.queue = :queue LIMIT 1) END)

-- name: run_search(name, key, created_after, created_before, cursor, states, queue, limit,
--     scan)
-- One page (:limit runs) of the runs matching the filters.
SELECT r.id, r.name, r.job, r.key, r.created_at, r.finished_at, r.error::text AS error,
    live.state
/* fragment: runs_matching */
ORDER BY r.id DESC
LIMIT :limit;

-- name: run_walk_end(cursor, scan)
-- Where a walk of :scan runs older than :cursor (NULL: from the newest) ends: the last run it
-- reads, or NULL when fewer runs are left. Index-only on the primary key.
SELECT id FROM __schema__.cyclone_runs
WHERE (:cursor::uuid IS NULL OR id < :cursor)
ORDER BY id DESC
OFFSET :scan - 1
LIMIT 1;

-- name: run_count(name, key, created_after, created_before, cursor, states, queue, limit, scan)
-- How many runs match the filters, counting at most :limit.
SELECT count(*)::int FROM (
    SELECT 1
    /* fragment: runs_matching */
    LIMIT :limit
) matched;

-- name: node_payloads(run_id)
-- Each node's queue, output and (for a wait node) signal payload, by node name.
SELECT node, queue, output::text AS output, signal::text AS signal
FROM __schema__.cyclone_steps WHERE run_id = :run_id ORDER BY node;

-- name: throughput_minutes(minutes)
-- Steps that ended completed or failed per queue and minute over the last :minutes minutes: jobs
-- from their runs (idx_runs_finished), workflow nodes from their steps (idx_steps_finished).
SELECT queue, date_trunc('minute', finished_at) AS minute,
    count(*) FILTER (WHERE state = 'completed')::int AS completed,
    count(*) FILTER (WHERE state = 'failed')::int AS failed
FROM (
    SELECT queue, state, finished_at FROM __schema__.cyclone_runs
    WHERE state <> 'pending' AND state IN ('completed', 'failed') AND job
      AND finished_at >= date_trunc('minute', __now__) - make_interval(mins => :minutes - 1)
    UNION ALL
    SELECT queue, state, finished_at FROM __schema__.cyclone_steps
    WHERE state IN ('completed', 'failed') AND kind IS NOT NULL
      AND finished_at >= date_trunc('minute', __now__) - make_interval(mins => :minutes - 1)
) ended
GROUP BY 1, 2
ORDER BY 1, 2;
