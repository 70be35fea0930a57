-- Advancing workflow runs. A transition of a run decides on the run's state, so it first
-- locks the run rows (run_lock_many, in a statement of its own), then touches tasks and
-- steps: a completed node counts its children down and releases those left with none
-- (their tasks queued in the same transaction); wait nodes complete by their signal; a run
-- fails (parking what it has not started) or re-opens.

-- name: run_lock_many(run_ids)
-- Lock runs in id order: the first lock of every multi-row transition of workflow runs (see
-- the lock order in README.md). In a statement of its own, so that the next statement's
-- snapshot sees every commit made before the lock was granted.
SELECT id, state FROM __schema__.cyclone_runs
WHERE id = ANY (:run_ids::uuid[]) ORDER BY id FOR UPDATE;

-- name: node_advance(run_ids, nodes)
-- After nodes completed (runs locked by the caller, so their states are current): count down
-- each child's dependencies, release the children left with none while the run is open,
-- count the run down and complete it at zero. Returns the queues that got work, signalled
-- wait nodes that became reachable (the caller finishes them and advances again), and runs
-- that ended.
WITH done AS (
    SELECT * FROM unnest(:run_ids::uuid[], :nodes::text[]) AS d (run_id, node)
), released AS (
    UPDATE __schema__.cyclone_steps c
    SET pending_deps = c.pending_deps - x.n,
        state = CASE WHEN c.pending_deps = x.n AND x.open
                     THEN CASE WHEN c.kind IS NULL THEN 'waiting' ELSE 'queued' END
                     ELSE c.state END,
        wait_until = CASE WHEN c.pending_deps = x.n AND x.open AND c.kind IS NULL
                          THEN __now__ + make_interval(secs => c.wait_timeout) END
    FROM (
        SELECT e.run_id, e.child, count(*)::int AS n,
               bool_and((SELECT r.state = 'pending' FROM __schema__.cyclone_runs r
                         WHERE r.id = d.run_id)) AS open
        FROM done d
        -- Each completed node's edges by key, one look-up per node (OFFSET 0 keeps the
        -- subquery from being flattened into a join): as a join, the planner rated a hash
        -- join over a scan of every edge in the history cheaper than the look-ups (with
        -- 20,000 finished runs, 7 of the statement's 14 ms for 100 nodes). The children
        -- are then updated by key alone: an anchor on the batch's runs here was scanned
        -- once per child, which made a batch cost its square.
        CROSS JOIN LATERAL (
            SELECT e.run_id, e.child FROM __schema__.cyclone_edges e
            WHERE e.run_id = d.run_id AND e.parent = d.node
            OFFSET 0
        ) e
        GROUP BY e.run_id, e.child
    ) x
    WHERE c.run_id = x.run_id AND c.node = x.child
    RETURNING c.run_id, c.node, c.kind, c.queue, c.priority, c.max_attempts, c.state,
              c.pending_deps, c.signal IS NOT NULL AS signalled
), queued AS (
    INSERT INTO __schema__.cyclone_tasks
        (run_id, node, kind, queue, priority, max_attempts, group_key)
    SELECT run_id, node, kind, queue, priority, max_attempts,
           coalesce((SELECT r.group_key FROM __schema__.cyclone_runs r WHERE r.id = run_id), '')
    FROM released WHERE state = 'queued' AND pending_deps = 0
), counted AS (
    UPDATE __schema__.cyclone_runs r
    SET remaining = r.remaining - x.n,
        state = CASE WHEN r.state = 'pending' AND r.remaining = x.n
                     THEN 'completed' ELSE r.state END,
        finished_at = CASE WHEN r.state = 'pending' AND r.remaining = x.n
                           THEN __now__ ELSE r.finished_at END
    FROM (SELECT run_id, count(*)::int AS n FROM done GROUP BY run_id) x
    -- The anchor gives the planner the batch's runs to read by key (one bitmap scan),
    -- where a stale plan hashed the batch against a scan of every run; read once (an
    -- InitPlan), it must not become the inner side of a loop (test_plans.py pins both).
    WHERE r.id = x.run_id AND r.id = ANY (ARRAY(SELECT run_id FROM done))
    RETURNING r.id, r.state
)
SELECT 'queue' AS what, queue AS value, NULL::uuid AS run_id, NULL::text AS node
FROM released WHERE state = 'queued' AND pending_deps = 0
UNION ALL
SELECT 'signalled', NULL, run_id, node
FROM released WHERE state = 'waiting' AND pending_deps = 0 AND signalled
UNION ALL
SELECT 'ended', state, id, NULL FROM counted WHERE state <> 'pending';

-- name: wait_complete_many(run_ids, nodes)
-- Signalled wait nodes complete with their signal as output. Each node by key, one look-up
-- per node (OFFSET 0, as in node_advance): as a join, statistics that knew of no waiting
-- node made a batch of 300 a hash join over a scan of every step in the history.
WITH signalled AS (
    SELECT s.run_id, s.node
    FROM unnest(:run_ids::uuid[], :nodes::text[]) AS w (run_id, node)
    CROSS JOIN LATERAL (
        SELECT s.run_id, s.node FROM __schema__.cyclone_steps s
        WHERE s.run_id = w.run_id AND s.node = w.node AND s.state = 'waiting'
          AND s.signal IS NOT NULL
        OFFSET 0
    ) s
)
UPDATE __schema__.cyclone_steps s
SET state = 'completed', output = s.signal, wait_until = NULL, finished_at = __now__
FROM signalled w
WHERE s.run_id = w.run_id AND s.node = w.node  -- and the guard again, for the row it writes
  AND s.state = 'waiting' AND s.signal IS NOT NULL
RETURNING s.run_id, s.node;

-- name: wait_signal(run_id, node, payload)
-- Store a wait node's signal; the caller holds the run's lock. Returns the node's state.
UPDATE __schema__.cyclone_steps SET signal = :payload::jsonb
WHERE run_id = :run_id AND node = :node AND kind IS NULL AND signal IS NULL
RETURNING state;

-- name: node_get(run_id, node)
SELECT kind, signal IS NOT NULL AS signalled FROM __schema__.cyclone_steps
WHERE run_id = :run_id AND node = :node;

-- name: run_release(run_id)
-- Queue the nodes of an open run (locked by the caller) whose dependencies are all done:
-- after a re-open. Returns the queues that got work and the signalled wait nodes.
WITH open_run AS (
    SELECT id FROM __schema__.cyclone_runs WHERE id = :run_id AND state = 'pending'
), released AS (
    UPDATE __schema__.cyclone_steps s
    SET state = CASE WHEN s.kind IS NULL THEN 'waiting' ELSE 'queued' END,
        wait_until = CASE WHEN s.kind IS NULL
                          THEN __now__ + make_interval(secs => s.wait_timeout) END
    WHERE s.run_id IN (SELECT id FROM open_run) AND s.state = 'pending' AND s.pending_deps = 0
    RETURNING s.run_id, s.node, s.kind, s.queue, s.priority, s.max_attempts, s.attempts,
              s.errors, s.signal IS NOT NULL AS signalled
), queued AS (
    -- A released node's task carries its attempts and errors so far (a parked node goes on
    -- where it stopped; a failed one was reset to none), so the history survives.
    INSERT INTO __schema__.cyclone_tasks
        (run_id, node, kind, queue, priority, max_attempts, attempt, errors, group_key)
    SELECT run_id, node, kind, queue, priority, max_attempts, attempts, errors,
           coalesce((SELECT r.group_key FROM __schema__.cyclone_runs r WHERE r.id = run_id), '')
    FROM released
    WHERE kind IS NOT NULL
)
SELECT kind IS NULL AS wait, queue, node, signalled FROM released;

-- name: run_fail(run_id, error, drop_running)
-- Fail a pending run (locked by the caller) so that it starts nothing more: drop its
-- unclaimed tasks (:drop_running: running ones too, whose handlers are then cancelled) and
-- park their steps; a retry releases them again.
WITH r AS (
    UPDATE __schema__.cyclone_runs
    SET state = 'failed', error = :error::jsonb, finished_at = __now__
    WHERE id = :run_id AND state = 'pending'
    RETURNING id
), doomed AS (
    SELECT t.run_id, t.id FROM __schema__.cyclone_tasks t
    WHERE t.run_id IN (SELECT id FROM r) AND (t.state = 'available' OR :drop_running::bool)
    ORDER BY t.id
    FOR UPDATE
), dropped AS (
    DELETE FROM __schema__.cyclone_tasks t USING doomed d
    WHERE t.run_id = d.run_id AND t.id = d.id
    RETURNING t.node, t.attempt, t.errors
)
UPDATE __schema__.cyclone_steps s SET state = 'pending', wait_until = NULL,
    attempts = coalesce((SELECT d.attempt FROM dropped d WHERE d.node = s.node), s.attempts),
    errors = coalesce((SELECT d.errors FROM dropped d WHERE d.node = s.node), s.errors)
WHERE s.run_id IN (SELECT id FROM r)
  AND (s.node IN (SELECT node FROM dropped) OR s.state = 'waiting');

-- name: run_reopen(run_id, node)
-- Re-open a failed run (locked by the caller), resetting its failed nodes (:node: only that
-- node) with a fresh attempt budget. The run re-opens once no failed node is left.
WITH reset AS (
    UPDATE __schema__.cyclone_steps
    SET state = 'pending', attempts = 0, finished_at = NULL
    WHERE run_id = :run_id AND state = 'failed' AND (:node::text IS NULL OR node = :node)
    RETURNING node
), reopened AS (
    UPDATE __schema__.cyclone_runs r
    SET state = 'pending', error = NULL, finished_at = NULL
    WHERE r.id = :run_id AND r.state = 'failed'
      AND NOT EXISTS (
          SELECT 1 FROM __schema__.cyclone_steps s
          WHERE s.run_id = :run_id AND s.state = 'failed'
            AND s.node NOT IN (SELECT node FROM reset))
    RETURNING r.id
)
SELECT (SELECT count(*)::int FROM reset) AS reset, EXISTS (SELECT 1 FROM reopened) AS reopened;

