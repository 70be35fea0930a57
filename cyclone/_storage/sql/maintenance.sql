-- Maintenance: the small services that rescue and tidy. Expired leases (a worker that died
-- or stalled), wait nodes past their timeout and runs past their deadline are found here and
-- ended by the same fenced transitions as any outcome; retention purges ended runs; workers
-- record their presence. Each finder reads a bounded batch off an index.

-- fragment: lost_workers
-- lost (id): the workers whose liveness session ended. A live presence row names the
-- advisory lock its worker's own session holds (liveness); no session holds it now. Read
-- from pg_locks by the statement that acts on it, so a worker that takes its lock again
-- before claiming (liveness.py) never has its new claims taken for lost.
lost AS (
    SELECT w.id FROM __schema__.cyclone_workers w
    WHERE w.liveness IS NOT NULL AND w.expires_at >= __now__
      AND NOT EXISTS (
          SELECT 1 FROM pg_locks l
          WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
            AND l.classid = 1668899693 AND l.objid = w.liveness::oid
            AND l.database = (SELECT d.oid FROM pg_database d
                              WHERE d.datname = current_database()))
)

-- name: workers_lost
-- The workers whose liveness session ended (lost_workers): what the rescue probe asks
-- every second before it runs task_rescue.
WITH /* fragment: lost_workers */
SELECT id FROM lost ORDER BY id;

-- fragment: reclaim_expired
-- The CTEs after expired (run_id, id, open, lost_by, timed_out, errors: running tasks
-- taken back from their worker, locked, and their errors with the lost attempt's): back to
-- available at once; parked instead if their run failed meanwhile, as in task_retry_many.
), parked AS (
    DELETE FROM __schema__.cyclone_tasks t USING expired e
    WHERE t.run_id = e.run_id AND t.id = e.id AND NOT e.open
      AND t.run_id = ANY (ARRAY(SELECT run_id FROM expired WHERE NOT open))
    RETURNING t.id, t.run_id, t.node, t.kind, t.attempt, t.max_attempts, e.errors, e.lost_by,
              e.timed_out
/* fragment: park_nodes */
), reclaimed AS (
    UPDATE __schema__.cyclone_tasks t
    SET state = 'available', available_at = __now__, lease_until = NULL, worker = NULL,
        errors = e.errors
    FROM expired e
    WHERE t.run_id = e.run_id AND t.id = e.id AND e.open
      AND t.run_id = ANY (ARRAY(SELECT run_id FROM expired WHERE open))
    RETURNING t.id, t.run_id, t.node, t.kind, t.attempt, t.max_attempts, t.queue, e.lost_by,
              e.timed_out
)
SELECT id, run_id, node, kind, attempt, max_attempts, queue, lost_by, timed_out FROM reclaimed
UNION ALL
SELECT id, run_id, node, kind, attempt, max_attempts, NULL, lost_by, timed_out FROM parked;

-- name: task_reclaim(limit)
-- Tasks whose lease expired (their worker died or stalled), attempts left: taken back
-- (reclaim_expired), the lost attempt recorded as a LeaseExpired error.
WITH expired AS (
    SELECT t.run_id, t.id,
           (SELECT r.state = 'pending' FROM __schema__.cyclone_runs r WHERE r.id = t.run_id)
               AS open,
           coalesce(t.worker, '?') AS lost_by, true AS timed_out,
           t.errors || jsonb_build_object(
               'attempt', t.attempt, 'type', 'LeaseExpired', 'at', __now__,
               'message', 'the lease expired: worker ' || coalesce(t.worker, '?')
                          || ' stopped renewing it') AS errors
    FROM __schema__.cyclone_tasks t
    WHERE t.state = 'running' AND t.lease_until < __now__ AND t.attempt < t.max_attempts
    ORDER BY t.id
    LIMIT :limit
    FOR UPDATE OF t SKIP LOCKED
/* fragment: reclaim_expired */

-- name: task_rescue(limit)
-- The tasks of lost workers (lost_workers), attempts left: taken back (reclaim_expired),
-- the lost attempt recorded as a WorkerLost error. Each lost worker's running tasks by a
-- scan of their own, and none at all while no worker is lost, the usual case.
WITH /* fragment: lost_workers */, expired AS (
    SELECT t.run_id, t.id,
           (SELECT r.state = 'pending' FROM __schema__.cyclone_runs r WHERE r.id = t.run_id)
               AS open,
           t.worker AS lost_by, false AS timed_out,
           t.errors || jsonb_build_object(
               'attempt', t.attempt, 'type', 'WorkerLost', 'at', __now__,
               'message', 'worker ' || t.worker || ' was lost: its session with the '
                          || 'database ended (the process died, or lost its connection)')
               AS errors
    FROM lost l
    CROSS JOIN LATERAL (
        SELECT t.* FROM __schema__.cyclone_tasks t
        WHERE t.worker = l.id AND t.state = 'running' AND t.lease_until IS NOT NULL
          AND t.attempt < t.max_attempts
        ORDER BY t.id
        LIMIT :limit
        FOR UPDATE OF t SKIP LOCKED
    ) t
/* fragment: reclaim_expired */

-- name: task_expired_exhausted(limit)
-- Tasks whose lease expired on their last attempt: the caller fails them as any last attempt.
SELECT id, claims, run_id, node, kind, queue, attempt, max_attempts, worker, false AS lost
FROM __schema__.cyclone_tasks
WHERE state = 'running' AND lease_until < __now__ AND attempt >= max_attempts
ORDER BY id LIMIT :limit;

-- name: task_lost_exhausted(limit)
-- The tasks of lost workers (lost_workers) on their last attempt: the caller fails them by
-- their fence alone (their leases have not run out), as task_rescue reads them.
WITH /* fragment: lost_workers */
SELECT t.id, t.claims, t.run_id, t.node, t.kind, t.queue, t.attempt, t.max_attempts,
       t.worker, true AS lost
FROM lost l
CROSS JOIN LATERAL (
    SELECT * FROM __schema__.cyclone_tasks t
    WHERE t.worker = l.id AND t.state = 'running' AND t.lease_until IS NOT NULL
      AND t.attempt >= t.max_attempts
    ORDER BY t.id LIMIT :limit
) t;

-- name: wait_expire_due(limit)
-- Wait nodes whose timeout passed.
SELECT run_id, node FROM __schema__.cyclone_steps
WHERE state = 'waiting' AND wait_until IS NOT NULL AND wait_until <= __now__
ORDER BY wait_until LIMIT :limit;

-- name: wait_expire(run_id, node, error)
-- Fail one wait node whose timeout passed (its run locked by the caller).
UPDATE __schema__.cyclone_steps
SET state = 'failed', errors = errors || :error::jsonb, wait_until = NULL, finished_at = __now__
WHERE run_id = :run_id AND node = :node AND state = 'waiting' AND wait_until <= __now__
RETURNING run_id;

-- name: run_deadline_due(limit)
SELECT id, job FROM __schema__.cyclone_runs
WHERE deadline IS NOT NULL AND deadline <= __now__ AND state = 'pending'
ORDER BY deadline LIMIT :limit;

-- name: run_purge(before, states, limit)
-- Delete up to :limit terminal runs in the :states that ended :before, with their steps and
-- edges. SKIP LOCKED: a run being retried is left for later. A run whose node still runs
-- (a failed workflow lets running nodes finish) stays, and so does a failed sequenced job
-- that blocks its sequence until retried or cancelled. An available task of a failed run
-- (a retry that raced run_fail: see task_retry_many) goes with the run.
WITH doomed AS (
    SELECT id FROM __schema__.cyclone_runs r
    WHERE state = ANY (:states::text[]) AND state <> 'pending' AND finished_at < :before
      AND NOT EXISTS (SELECT 1 FROM __schema__.cyclone_tasks t
                      WHERE t.run_id = r.id AND t.state <> 'available')
    ORDER BY finished_at
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
), tasks AS (  -- each by key: an IN (...) here was hashed over a scan of the history
    DELETE FROM __schema__.cyclone_tasks WHERE run_id = ANY (ARRAY(SELECT id FROM doomed))
), steps AS (
    DELETE FROM __schema__.cyclone_steps WHERE run_id = ANY (ARRAY(SELECT id FROM doomed))
), edges AS (
    DELETE FROM __schema__.cyclone_edges WHERE run_id = ANY (ARRAY(SELECT id FROM doomed))
), runs AS (
    DELETE FROM __schema__.cyclone_runs WHERE id = ANY (ARRAY(SELECT id FROM doomed))
    RETURNING id
)
SELECT count(*)::int FROM runs;

-- name: worker_present(worker, host, pid, queues, kinds, workflows, ttl, liveness)
-- Record this worker as live for :ttl more seconds, with what it claims and the advisory
-- lock its session holds (:liveness, or NULL), and delete the rows of other workers that
-- expired (died or stalled): one statement per heartbeat. No WAL flush wait: a row lost in
-- a crash is written again by the next heartbeat.
WITH async_commit AS (
    SELECT set_config('synchronous_commit', 'off', true)
), swept AS (
    DELETE FROM __schema__.cyclone_workers WHERE expires_at < __now__ AND id <> :worker
)
INSERT INTO __schema__.cyclone_workers AS w
    (id, host, pid, queues, kinds, workflows, expires_at, liveness)
SELECT :worker, :host, :pid, :queues::text[], :kinds::text[], :workflows::text[],
       __now__ + make_interval(secs => :ttl), :liveness
FROM async_commit
ON CONFLICT (id) DO UPDATE
SET seen_at = __now__, expires_at = excluded.expires_at, queues = excluded.queues,
    kinds = excluded.kinds, workflows = excluded.workflows, liveness = excluded.liveness;

-- name: worker_twin(worker, key)
-- Whether another live worker already runs under :worker: its presence row is live and
-- names a liveness lock other than :key that a session still holds.
SELECT EXISTS (
    SELECT 1 FROM __schema__.cyclone_workers w
    JOIN pg_locks l ON l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
        AND l.classid = 1668899693 AND l.objid = w.liveness::oid
        AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
    WHERE w.id = :worker AND w.expires_at >= __now__ AND w.liveness <> :key
);

-- name: worker_liveness_hold(key)
-- Take this worker's liveness lock on its own session, for as long as the session lives
-- (lost_workers); false while another session still holds it.
SELECT pg_try_advisory_lock(1668899693, :key);

-- name: worker_leave(worker)
-- A worker stopping gracefully removes its row.
DELETE FROM __schema__.cyclone_workers WHERE id = :worker;

-- name: worker_list
-- The live workers, newest first; the few rows of a table swept by every heartbeat.
SELECT id, host, pid, queues, kinds, workflows, started_at, seen_at
FROM __schema__.cyclone_workers
WHERE expires_at >= __now__
ORDER BY started_at DESC, id;

