-- The outcomes of attempts: completion, retry (or snooze) and a last attempt's failure. Each
-- write is fenced: it touches a task only while the attempt that reports still owns it
-- (running, under the same claim count), so a late writer cannot overwrite a rescue. After
-- a write whose reply was lost, attempts_* say whether it committed.

-- fragment: fenced_completions
-- The completions (:run_ids, task :ids, :claims counts, :outputs) whose attempts still own
-- their tasks (owned_tasks), and those task rows deleted: a completion whose task was
-- reclaimed or cancelled meanwhile matches nothing, and is rejected.
WITH fenced AS (
    SELECT t.run_id, t.id, c.output
    FROM (SELECT * FROM unnest(:run_ids::uuid[], :ids::bigint[], :claims::int[],
                               :outputs::text[]) AS c (run_id, id, claims, output)
          ORDER BY c.id) c
    /* fragment: owned_tasks */
), done AS (
    DELETE FROM __schema__.cyclone_tasks t USING fenced f
    WHERE t.run_id = f.run_id AND t.id = f.id
      AND t.run_id = ANY (ARRAY(SELECT run_id FROM fenced))

-- name: job_complete_many(run_ids, ids, claims, outputs)
-- Completed attempts of standalone jobs, in one statement (task rows, then their runs): the
-- task row goes, the run row takes the output. A task no longer owned by its attempt
-- (reclaimed, cancelled) matches nothing: that completion is rejected.
/* fragment: fenced_completions */
    RETURNING t.id, t.claims, t.run_id, t.attempt, t.errors, f.output
)
UPDATE __schema__.cyclone_runs r
SET state = 'completed', output = d.output::jsonb, remaining = 0, attempts = d.attempt,
    errors = d.errors, finished_at = __now__, completed_task = d.id, completed_claims = d.claims
FROM done d
WHERE r.id = d.run_id AND r.state = 'pending'
RETURNING d.id, d.claims, r.id AS run_id;

-- name: job_discard_many(run_ids, ids, claims)
-- Completed attempts of standalone jobs whose kind keeps nothing once completed: the task
-- row and the run row go in one statement (task rows, then their runs, as completing does),
-- so a completed run of such a kind never exists. Fenced as job_complete_many; the default
-- path never sends this statement.
WITH fenced AS (
    SELECT t.run_id, t.id
    FROM (SELECT * FROM unnest(:run_ids::uuid[], :ids::bigint[], :claims::int[])
              AS c (run_id, id, claims)
          ORDER BY c.id) c
    /* fragment: owned_tasks */
), done AS (
    DELETE FROM __schema__.cyclone_tasks t USING fenced f
    WHERE t.run_id = f.run_id AND t.id = f.id
      AND t.run_id = ANY (ARRAY(SELECT run_id FROM fenced))
    RETURNING t.id, t.claims, t.run_id
)
DELETE FROM __schema__.cyclone_runs r
USING done d
WHERE r.id = d.run_id AND r.state = 'pending'
RETURNING d.id, d.claims, r.id AS run_id;

-- name: jobs_discarded(run_ids)
-- Which of these jobs' runs are gone: after a job_discard_many whose reply was lost, the
-- attempts whose write committed (a pending job's run is deleted by nothing else).
SELECT i.id AS run_id FROM unnest(:run_ids::uuid[]) AS i (id)
WHERE NOT EXISTS (SELECT 1 FROM __schema__.cyclone_runs r WHERE r.id = i.id);

-- name: node_complete_many(run_ids, ids, claims, outputs)
-- Completed attempts of workflow nodes (runs locked by the caller): fenced as above. An item
-- node says its map node (the caller settles it there rather than advancing past it). A
-- child node waits for the end of the child run that the caller submits next, in this
-- transaction, from the attempt's output (the child's input). A sleep node sleeps until the
-- wake time its attempt output (JSON null: its spec's seconds from now); the caller wakes it
-- at once when that time has passed.
/* fragment: fenced_completions */
    RETURNING t.id, t.claims, t.run_id, t.node, t.attempt, t.errors, f.output
)
UPDATE __schema__.cyclone_steps s
SET state = CASE WHEN s.spec ? 'child' OR s.spec ? 'sleep' THEN 'waiting'
                 ELSE 'completed' END,
    output = CASE WHEN s.spec ? 'child' OR s.spec ? 'sleep' THEN NULL
                  ELSE d.output::jsonb END,
    wait_until = CASE WHEN s.spec ? 'sleep' THEN coalesce(
        (d.output::jsonb #>> '{}')::timestamptz,
        __now__ + make_interval(secs => (s.spec->'sleep'->>'seconds')::float8)) END,
    attempts = d.attempt, errors = d.errors,
    finished_at = CASE WHEN s.spec ? 'child' OR s.spec ? 'sleep' THEN NULL ELSE __now__ END,
    completed_task = d.id, completed_claims = d.claims
FROM done d
WHERE s.run_id = d.run_id AND s.node = d.node
RETURNING d.id, d.claims, s.run_id, s.node, s.map_of, s.spec ? 'child' AS child,
          s.spec ? 'sleep' AS sleep;

-- name: attempts_completed(run_ids, nodes, ids, claims)
-- Which of these attempts (run, node or NULL for a job, task id, claim count) completed
-- their job or node: after a completion write whose reply was lost, whether it committed.
-- (task id, claims) names one attempt for good: ids are never reused, every claim counts up.
-- Each attempt's run or step by key (an EXISTS here is hashed over the whole history).
SELECT a.run_id, a.node
FROM unnest(:run_ids::uuid[], :nodes::text[], :ids::bigint[], :claims::int[])
    AS a (run_id, node, task, claims)
WHERE CASE WHEN a.node IS NULL
    THEN (SELECT r.completed_task = a.task AND r.completed_claims = a.claims
          FROM __schema__.cyclone_runs r WHERE r.id = a.run_id)
    ELSE (SELECT s.completed_task = a.task AND s.completed_claims = a.claims
          FROM __schema__.cyclone_steps s WHERE s.run_id = a.run_id AND s.node = a.node)
    END;

-- fragment: park_nodes
-- The CTE after parked (the task rows of attempts whose run failed meanwhile, deleted): their
-- nodes go back to pending with their attempts and errors so far, as run_fail parks unstarted
-- ones, so that no available task is left in a run that starts nothing; a retry of the run
-- releases them again.
), park AS (
    UPDATE __schema__.cyclone_steps s
    SET state = 'pending', attempts = p.attempt, errors = p.errors
    FROM parked p
    WHERE s.run_id = p.run_id AND s.node = p.node

-- name: task_retry_many(run_ids, ids, claims, delays, errors, refunds)
-- Attempts that failed with attempts left, or snoozed (:refunds: give the attempt back): the
-- task becomes available again after its delay, keeping the error of the attempt. If its run
-- failed meanwhile (a failed workflow lets running nodes finish), the node is parked as
-- run_fail parks unstarted ones: no available task is left in a run that starts nothing.
WITH fenced AS (
    SELECT t.run_id, t.id, c.delay, c.refund,
           (SELECT r.state = 'pending' FROM __schema__.cyclone_runs r WHERE r.id = t.run_id)
               AS open,
           CASE WHEN c.error IS NULL THEN t.errors ELSE t.errors || c.error::jsonb END AS errors
    FROM (SELECT * FROM unnest(:run_ids::uuid[], :ids::bigint[], :claims::int[],
                               :delays::float8[], :errors::text[], :refunds::bool[])
              AS c (run_id, id, claims, delay, error, refund)
          ORDER BY c.id) c
    /* fragment: owned_tasks */
), parked AS (
    DELETE FROM __schema__.cyclone_tasks t USING fenced f
    WHERE t.run_id = f.run_id AND t.id = f.id AND NOT f.open
      AND t.run_id = ANY (ARRAY(SELECT run_id FROM fenced WHERE NOT open))
    RETURNING t.id, t.run_id, t.node, t.attempt - f.refund::int AS attempt, f.errors
/* fragment: park_nodes */
), retried AS (
    UPDATE __schema__.cyclone_tasks t
    SET state = 'available', available_at = __now__ + make_interval(secs => f.delay),
        lease_until = NULL, worker = NULL, attempt = t.attempt - f.refund::int,
        errors = f.errors
    FROM fenced f
    WHERE t.run_id = f.run_id AND t.id = f.id AND f.open
      AND t.run_id = ANY (ARRAY(SELECT run_id FROM fenced WHERE open))
    RETURNING t.id, t.queue
)
SELECT id, queue FROM retried
UNION ALL
SELECT id, NULL FROM parked;

-- name: job_fail(run_id, task_id, claims, error, expired_only)
-- A job's last attempt failed (task row, then run). A sequenced job keeps its task row,
-- failed, so that the rest of its sequence waits until it is retried or cancelled.
-- :expired_only: only if the lease expired (maintenance, which read the task without a lock).
WITH gone AS (
    DELETE FROM __schema__.cyclone_tasks t
    WHERE t.run_id = :run_id AND t.id = :task_id AND t.claims = :claims AND t.state = 'running'
      AND t.sequence_key IS NULL AND (NOT :expired_only::bool OR t.lease_until < __now__)
    RETURNING t.run_id, t.attempt, t.errors || :error::jsonb AS errors
), blocking AS (
    UPDATE __schema__.cyclone_tasks t
    SET state = 'failed', lease_until = NULL, worker = NULL, errors = t.errors || :error::jsonb
    WHERE t.run_id = :run_id AND t.id = :task_id AND t.claims = :claims AND t.state = 'running'
      AND t.sequence_key IS NOT NULL AND (NOT :expired_only::bool OR t.lease_until < __now__)
    RETURNING t.run_id, t.attempt, t.errors
)
UPDATE __schema__.cyclone_runs r
SET state = 'failed', attempts = x.attempt, errors = x.errors, error = :error::jsonb,
    finished_at = __now__
FROM (SELECT * FROM gone UNION ALL SELECT * FROM blocking) x
WHERE r.id = x.run_id AND r.state = 'pending'
RETURNING r.id;

-- name: node_fail(run_id, task_id, claims, error, expired_only)
-- A workflow node's last attempt failed (its run locked by the caller): the node fails.
-- :expired_only: only if the lease expired, as for job_fail. Returns whether the node is an
-- item of a map that settles all its items (the caller settles it, not failing the run).
WITH gone AS (
    DELETE FROM __schema__.cyclone_tasks t
    WHERE t.run_id = :run_id AND t.id = :task_id AND t.claims = :claims AND t.state = 'running'
      AND (NOT :expired_only::bool OR t.lease_until < __now__)
    RETURNING t.run_id, t.node, t.attempt, t.errors
)
UPDATE __schema__.cyclone_steps s
SET state = 'failed', attempts = g.attempt, errors = g.errors || :error::jsonb,
    finished_at = __now__
FROM gone g
WHERE s.run_id = g.run_id AND s.node = g.node
RETURNING coalesce((SELECT (m.spec->'map'->>'settle')::bool FROM __schema__.cyclone_steps m
                    WHERE m.run_id = s.run_id AND m.node = s.map_of), false) AS settles;

-- name: attempts_released(run_ids, ids, claims, attempts)
-- Which of these attempts (run, task id, claim count, attempt number) put their task back in
-- its queue (retry, snooze, hand-back): after such a write whose reply was lost, whether it
-- committed. The attempt released its task if the task is available with the same claim
-- count, or was claimed again since, and maintenance did not reclaim that attempt instead
-- (task_reclaim records a LeaseExpired error for it). Each task by key, in a scalar subquery.
SELECT a.id, a.claims
FROM unnest(:run_ids::uuid[], :ids::bigint[], :claims::int[], :attempts::int[])
    AS a (run_id, id, claims, attempt)
WHERE (SELECT (t.claims > a.claims OR (t.claims = a.claims AND t.state = 'available'))
              AND NOT t.errors @> jsonb_build_array(jsonb_build_object(
                  'attempt', a.attempt, 'type', 'LeaseExpired'))
       FROM __schema__.cyclone_tasks t WHERE t.run_id = a.run_id AND t.id = a.id);

-- name: attempts_failed(run_ids, nodes, errors)
-- Which of these attempts (run, node or NULL for a job, error record) failed their job or
-- node: after a failure write whose reply was lost, whether it committed. An error record
-- holds its attempt and the time it was made, so finding it kept is proof. Runs and steps by
-- key, in scalar subqueries.
SELECT a.run_id, a.node
FROM unnest(:run_ids::uuid[], :nodes::text[], :errors::text[]) AS a (run_id, node, error)
WHERE CASE WHEN a.node IS NULL
    THEN (SELECT r.state = 'failed' AND r.error = a.error::jsonb
          FROM __schema__.cyclone_runs r WHERE r.id = a.run_id)
    ELSE (SELECT s.state = 'failed' AND s.errors @> jsonb_build_array(a.error::jsonb)
          FROM __schema__.cyclone_steps s WHERE s.run_id = a.run_id AND s.node = a.node)
    END;

