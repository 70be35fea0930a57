-- Maintenance: the small services that rescue and tidy. Expired leases (a worker that died
-- or stalled), wait nodes past their timeout and runs past their deadline are found here and
-- ended by the same fenced transitions as any outcome; retention purges ended runs; workers
-- record their presence. Each finder reads a bounded batch off an index.

-- fragment: lock_free
-- Whether no session holds the liveness lock that the presence row w names.
NOT EXISTS (
    SELECT 1 FROM pg_locks l
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
      AND l.classid = 1668899693 AND l.objid = w.liveness::oid
      AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database()))

-- fragment: lost_workers
-- lost (the presence rows of the workers taken for dead): a live row names the advisory
-- lock its worker's own session holds (liveness), no session holds it now, and either it
-- has stayed free past the worker's grace (lock_free_since, set by workers_unlocked), or
-- the caller knows the process is gone (:dead), or the row is of a release that keeps no
-- grace. Read from pg_locks by the statement that acts on it, so a worker that takes its
-- lock again before claiming (presence.py) never has its new claims taken for lost.
lost AS (
    SELECT w.* FROM __schema__.cyclone_workers w
    WHERE w.liveness IS NOT NULL AND w.expires_at >= __now__
      AND (w.grace IS NULL OR w.id = ANY (:dead::text[])
           OR w.lock_free_since + make_interval(secs => w.grace) <= __now__)
      AND /* fragment: lock_free */
)

-- fragment: evidence
-- What a released attempt's error records of its worker (w, a presence row or NULL) and of
-- its release (t, its task): who held it, when it was last heard of, who released it.
jsonb_strip_nulls(jsonb_build_object(
    'worker', t.worker, 'host', w.host, 'pid', w.pid, 'backend', w.backend,
    'last_seen', w.seen_at, 'lock_free_since', w.lock_free_since, 'grace', w.grace,
    'lease_until', t.lease_until, 'released_by', :by::text, 'released_at', __now__))

-- name: workers_unlocked
-- The live workers whose liveness lock no session holds now, with what a peer needs to
-- tell a death from a dropped connection (machine and pid) and when their grace ends.
-- Marks when each was first seen so: a worker that takes its lock again writes its new
-- backend (worker_relock), and a mark whose snapshot saw the old backend is then skipped
-- on the row's recheck, so it never dates a lock that is held.
WITH free AS (
    SELECT w.id, w.backend FROM __schema__.cyclone_workers w
    WHERE w.liveness IS NOT NULL AND w.expires_at >= __now__ AND /* fragment: lock_free */
), marked AS (
    UPDATE __schema__.cyclone_workers w SET lock_free_since = __now__
    FROM free f
    WHERE w.id = f.id AND w.lock_free_since IS NULL AND w.backend IS NOT DISTINCT FROM f.backend
    RETURNING w.id, w.lock_free_since
)
SELECT w.id, w.machine, w.pid, w.grace,
       coalesce(m.lock_free_since, w.lock_free_since) AS lock_free_since, __now__ AS now
FROM free f
JOIN __schema__.cyclone_workers w ON w.id = f.id
LEFT JOIN marked m ON m.id = f.id
ORDER BY w.id;

-- name: workers_lost(dead)
-- The workers taken for dead (lost_workers): what maintenance asks before task_rescue.
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

-- name: task_reclaim(limit, by)
-- Tasks whose lease expired (their worker died or stalled), attempts left: taken back
-- (reclaim_expired), the lost attempt recorded as a LeaseExpired error with the evidence.
WITH expired AS (
    SELECT t.run_id, t.id,
           (SELECT r.state = 'pending' FROM __schema__.cyclone_runs r WHERE r.id = t.run_id)
               AS open,
           coalesce(t.worker, '?') AS lost_by, true AS timed_out,
           t.errors || (jsonb_build_object(
               'attempt', t.attempt, 'type', 'LeaseExpired', 'at', __now__,
               'reason', 'lease_expired',
               'message', 'the lease expired: worker ' || coalesce(t.worker, '?')
                          || ' stopped renewing it')
               || /* fragment: evidence */) AS errors
    FROM __schema__.cyclone_tasks t
    LEFT JOIN __schema__.cyclone_workers w ON w.id = t.worker
    WHERE t.state = 'running' AND t.lease_until < __now__ AND t.attempt < t.max_attempts
    ORDER BY t.id
    LIMIT :limit
    FOR UPDATE OF t SKIP LOCKED
/* fragment: reclaim_expired */

-- name: task_rescue(limit, dead, by)
-- The tasks of lost workers (lost_workers), attempts left: taken back (reclaim_expired),
-- the lost attempt recorded as a WorkerLost error with the evidence, and each lost worker's
-- row marked released (should it turn out alive, it says so). Each lost worker's running
-- tasks by a scan of their own, and none at all while no worker is lost, the usual case.
WITH /* fragment: lost_workers */, marked AS (
    UPDATE __schema__.cyclone_workers m SET released_at = __now__, released_by = :by
    FROM lost WHERE m.id = lost.id AND m.released_at IS NULL
), expired AS (
    SELECT t.run_id, t.id,
           (SELECT r.state = 'pending' FROM __schema__.cyclone_runs r WHERE r.id = t.run_id)
               AS open,
           t.worker AS lost_by, false AS timed_out,
           t.errors || (jsonb_build_object(
               'attempt', t.attempt, 'type', 'WorkerLost', 'at', __now__,
               'reason', 'worker_lost',
               'message', 'worker ' || t.worker || ' was lost: its session with the '
                          || 'database ended (the process died, or stayed cut off past '
                          || 'its grace)')
               || /* fragment: evidence */) AS errors
    FROM lost w
    CROSS JOIN LATERAL (
        SELECT t.* FROM __schema__.cyclone_tasks t
        WHERE t.worker = w.id AND t.state = 'running' AND t.lease_until IS NOT NULL
          AND t.attempt < t.max_attempts
        ORDER BY t.id
        LIMIT :limit
        FOR UPDATE OF t SKIP LOCKED
    ) t
/* fragment: reclaim_expired */

-- name: task_expired_exhausted(limit, by)
-- Tasks whose lease expired on their last attempt: the caller fails them as any last
-- attempt, with the evidence.
SELECT t.id, t.claims, t.run_id, t.node, t.kind, t.queue, t.attempt, t.max_attempts,
       t.worker, false AS lost, /* fragment: evidence */::text AS evidence
FROM __schema__.cyclone_tasks t
LEFT JOIN __schema__.cyclone_workers w ON w.id = t.worker
WHERE t.state = 'running' AND t.lease_until < __now__ AND t.attempt >= t.max_attempts
ORDER BY t.id LIMIT :limit;

-- name: task_lost_exhausted(limit, dead, by)
-- The tasks of lost workers (lost_workers) on their last attempt: the caller fails them by
-- their fence alone (their leases have not run out), as task_rescue reads them.
WITH /* fragment: lost_workers */
SELECT t.id, t.claims, t.run_id, t.node, t.kind, t.queue, t.attempt, t.max_attempts,
       t.worker, true AS lost, /* fragment: evidence */::text AS evidence
FROM lost w
CROSS JOIN LATERAL (
    SELECT * FROM __schema__.cyclone_tasks t
    WHERE t.worker = w.id AND t.state = 'running' AND t.lease_until IS NOT NULL
      AND t.attempt >= t.max_attempts
    ORDER BY t.id LIMIT :limit
) t;

-- name: wait_expire_due(limit)
-- Wait nodes whose timeout passed, and sleep nodes whose wake time came (:sleep; the caller
-- wakes them, sleep.sql).
SELECT run_id, node, spec ? 'sleep' AS sleep FROM __schema__.cyclone_steps
WHERE state = 'waiting' AND wait_until IS NOT NULL AND wait_until <= __now__
ORDER BY wait_until LIMIT :limit;

-- name: wait_expire(run_id, node, error)
-- End one wait node whose timeout passed (its run locked by the caller): completed with its
-- spec's on_timeout as output (a node waiting for all of its events: the events that came
-- laid over it), else failed. Returns its new state.
UPDATE __schema__.cyclone_steps
SET state = CASE WHEN spec ? 'on_timeout' THEN 'completed' ELSE 'failed' END,
    output = CASE WHEN (spec->'events'->>'all')::bool
                       AND jsonb_typeof(spec->'on_timeout') = 'object'
                  THEN spec->'on_timeout' || coalesce(signal, '{}'::jsonb)
                  ELSE spec->'on_timeout' END,
    errors = CASE WHEN spec ? 'on_timeout' THEN errors ELSE errors || :error::jsonb END,
    wait_until = NULL, finished_at = __now__
WHERE run_id = :run_id AND node = :node AND state = 'waiting' AND wait_until <= __now__
RETURNING state;

-- name: run_deadline_due(limit)
SELECT id, job FROM __schema__.cyclone_runs
WHERE deadline IS NOT NULL AND deadline <= __now__ AND state = 'pending'
ORDER BY deadline LIMIT :limit;

-- name: job_expire(limit)
-- needs: 0012
-- Up to :limit jobs whose task passed its expires_at without starting: the task goes and
-- the run ends expired (its unique= key, held by pending runs only, is free). Only a task
-- that never started has an expiry (the claim clears it; cyclone_tasks_expires_unstarted),
-- so the index on it finds them all. The task is locked first, SKIP LOCKED, and its expiry
-- read again under the lock: a claim that took it meanwhile cleared it, so a task ends
-- either claimed or expired, never both. Lock order of a job: its task, then its run (the
-- run is written because of the task). A sequenced job's next task gets its turn: its
-- queue is returned to wake.
WITH due AS (
    SELECT t.run_id, t.id FROM __schema__.cyclone_tasks t
    WHERE t.expires_at <= __now__ AND t.node IS NULL
    ORDER BY t.expires_at
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM __schema__.cyclone_tasks t USING due d
    WHERE t.run_id = d.run_id AND t.id = d.id
      AND t.run_id = ANY (ARRAY(SELECT run_id FROM due))
    RETURNING t.run_id, t.kind, t.queue, t.sequence_key
)
UPDATE __schema__.cyclone_runs r SET state = 'expired', finished_at = __now__
FROM gone g
WHERE r.id = g.run_id AND r.state = 'pending'
RETURNING r.id AS run_id, g.kind, g.queue, g.sequence_key IS NOT NULL AS sequenced;

-- name: retention_declare(names, completed, failed, cancelled, expired, known)
-- needs: 0012
-- A worker's retention of its own per name (the names' ages in seconds, one element per
-- name; NULL: kept forever), written for the client-wide sweep of every worker to skip;
-- and the rows of the :known names (the kinds and workflows this worker defines) that no
-- longer have one deleted, so those go back to the client's retention.
WITH own AS (
    SELECT * FROM unnest(:names::text[], :completed::float8[], :failed::float8[],
                         :cancelled::float8[], :expired::float8[])
        AS n (name, completed, failed, cancelled, expired)
), dropped AS (
    DELETE FROM __schema__.cyclone_retention k
    WHERE k.name = ANY (:known::text[]) AND k.name <> ALL (:names::text[])
)
INSERT INTO __schema__.cyclone_retention AS k
    (name, completed, failed, cancelled, expired, updated_at)
SELECT n.name, make_interval(secs => n.completed), make_interval(secs => n.failed),
       make_interval(secs => n.cancelled), make_interval(secs => n.expired), __now__
FROM own n
ON CONFLICT (name) DO UPDATE
SET completed = excluded.completed, failed = excluded.failed, cancelled = excluded.cancelled,
    expired = excluded.expired, updated_at = excluded.updated_at
WHERE (k.completed, k.failed, k.cancelled, k.expired)
      IS DISTINCT FROM (excluded.completed, excluded.failed, excluded.cancelled, excluded.expired);

-- name: run_purge(before, states, names, others, limit)
-- Delete up to :limit terminal runs in the :states that ended :before, with their steps and
-- edges: runs of the :names (NULL: of any name), and with :others only those whose name has
-- no retention of its own (cyclone_retention: the workers that define it purge it by its
-- own ages). SKIP LOCKED: a run being retried is left for later. A run whose node still runs
-- (a failed workflow lets running nodes finish) stays, and so does a failed sequenced job
-- that blocks its sequence until retried or cancelled. An available task of a failed run
-- (a retry that raced run_fail: see task_retry_many) goes with the run.
WITH doomed AS (
    SELECT id FROM __schema__.cyclone_runs r
    WHERE state = ANY (:states::text[]) AND state <> 'pending' AND finished_at < :before
      AND (:names::text[] IS NULL OR r.name = ANY (:names::text[]))
      AND NOT (:others::bool AND EXISTS (
          SELECT 1 FROM __schema__.cyclone_retention k WHERE k.name = r.name))
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

-- name: worker_present(worker, host, pid, queues, kinds, workflows, ttl, liveness, backend, machine, grace)
-- Record this worker as live for :ttl more seconds, with what it claims, the advisory lock
-- its session holds (:liveness, or NULL), that session's backend, where its pid means a
-- process (:machine) and its grace; and delete the rows of other workers that expired (died
-- or stalled): one statement per heartbeat. A row that named another lock was a process
-- before this one under the same id: what peers noted of that one's lock is forgotten. No
-- WAL flush wait: a row lost in a crash is written again by the next heartbeat.
WITH async_commit AS (
    SELECT set_config('synchronous_commit', 'off', true)
), swept AS (
    DELETE FROM __schema__.cyclone_workers WHERE expires_at < __now__ AND id <> :worker
)
INSERT INTO __schema__.cyclone_workers AS w
    (id, host, pid, queues, kinds, workflows, expires_at, liveness, backend, machine, grace)
SELECT :worker, :host, :pid, :queues::text[], :kinds::text[], :workflows::text[],
       __now__ + make_interval(secs => :ttl), :liveness, :backend, :machine, :grace
FROM async_commit
ON CONFLICT (id) DO UPDATE
SET seen_at = __now__, expires_at = excluded.expires_at, queues = excluded.queues,
    kinds = excluded.kinds, workflows = excluded.workflows, liveness = excluded.liveness,
    host = excluded.host, pid = excluded.pid, backend = excluded.backend,
    machine = excluded.machine, grace = excluded.grace,
    lock_free_since = CASE WHEN w.liveness IS NOT DISTINCT FROM excluded.liveness
                           THEN w.lock_free_since END,
    released_at = CASE WHEN w.liveness IS NOT DISTINCT FROM excluded.liveness
                       THEN w.released_at END,
    released_by = CASE WHEN w.liveness IS NOT DISTINCT FROM excluded.liveness
                       THEN w.released_by END;

-- name: worker_twin(worker, key)
-- Whether another live worker already runs under :worker: its presence row is live and
-- names a liveness lock other than :key that a session still holds.
SELECT EXISTS (
    SELECT 1 FROM __schema__.cyclone_workers w
    WHERE w.id = :worker AND w.expires_at >= __now__ AND w.liveness <> :key
      AND NOT /* fragment: lock_free */
);

-- name: worker_liveness_hold(key)
-- Take this worker's liveness lock on its own session, for as long as the session lives
-- (lost_workers); false while another session still holds it.
SELECT pg_try_advisory_lock(1668899693, :key);

-- name: worker_relock(worker, key)
-- Take the liveness lock again on a new session (the last one ended while the worker
-- lived), and on success write the new backend and forget that the lock was seen free; the
-- row's release by a peer meanwhile, if any, is returned and forgotten too.
WITH held AS (
    SELECT pg_try_advisory_lock(1668899693, :key) AS ok
), was AS (
    SELECT w.released_at, w.released_by FROM __schema__.cyclone_workers w, held
    WHERE w.id = :worker AND held.ok
), relocked AS (
    UPDATE __schema__.cyclone_workers w
    SET backend = pg_backend_pid(), lock_free_since = NULL, released_at = NULL,
        released_by = NULL
    FROM held WHERE w.id = :worker AND w.liveness = :key AND held.ok
)
SELECT held.ok, was.released_at, was.released_by FROM held LEFT JOIN was ON true;

-- name: worker_leave(worker)
-- A worker stopping gracefully removes its row.
DELETE FROM __schema__.cyclone_workers WHERE id = :worker;

-- name: worker_list
-- The live workers, newest first; the few rows of a table swept by every heartbeat.
SELECT id, host, pid, queues, kinds, workflows, started_at, seen_at
FROM __schema__.cyclone_workers
WHERE expires_at >= __now__
ORDER BY started_at DESC, id;


-- name: worker_alive(worker, key)
-- A worker that lives but has no liveness session yet (it cannot connect one) says so
-- through its pool: peers count its grace again from their next look.
UPDATE __schema__.cyclone_workers SET lock_free_since = NULL
WHERE id = :worker AND liveness = :key AND lock_free_since IS NOT NULL;
