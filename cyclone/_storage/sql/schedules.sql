-- Schedules (see migrations/0007_schedules.sql). A worker fires a row when it declares the
-- schedule (the array of declared names) or, for a dynamic row, serves its target (the array
-- of served kinds and workflows): only then does it hold what a run needs (the input
-- function, the workflow's graph). A :now parameter, where taken, stands for the clock when
-- not NULL, so that tests can move the time of a firing pass.

-- name: schedule_declare_many(lease, names, targets, jobs, crons, everys, start_ats, tzs,
--     catch_ups, windows, overlaps, inputs, next_ats)
-- Upsert a worker's declared schedules. A changed timing or policy moves next_at to the one
-- computed from the new timing; an unchanged one keeps its place, so a restart neither
-- skips nor repeats a slot. Pausing is the operators' and survives a deploy.
INSERT INTO __schema__.cyclone_schedules AS s
    (name, target, job, cron, every, start_at, tz, catch_up, catch_up_window, overlap, input,
     dynamic, declared_until, next_at)
SELECT d.name, d.target, d.job, d.cron, d.every, d.start_at, d.tz, d.catch_up, d.win,
       d.overlap, d.input::jsonb, false, __now__ + make_interval(secs => :lease), d.next_at
FROM unnest(:names::text[], :targets::text[], :jobs::bool[], :crons::text[],
            :everys::interval[], :start_ats::timestamptz[], :tzs::text[], :catch_ups::text[],
            :windows::interval[], :overlaps::text[], :inputs::text[], :next_ats::timestamptz[])
    AS d (name, target, job, cron, every, start_at, tz, catch_up, win, overlap, input, next_at)
ORDER BY d.name
ON CONFLICT (name) DO UPDATE SET
    target = excluded.target, job = excluded.job, cron = excluded.cron, every = excluded.every,
    start_at = excluded.start_at, tz = excluded.tz, catch_up = excluded.catch_up,
    catch_up_window = excluded.catch_up_window, overlap = excluded.overlap,
    input = excluded.input, dynamic = false, declared_until = excluded.declared_until,
    next_at = CASE WHEN (s.cron, s.every, s.start_at, s.tz)
                        IS DISTINCT FROM (excluded.cron, excluded.every, excluded.start_at,
                                          excluded.tz)
                   THEN excluded.next_at ELSE s.next_at END,
    updated_at = __now__;

-- name: schedule_refresh(lease, declared)
-- Keep a running worker's declarations alive.
UPDATE __schema__.cyclone_schedules SET declared_until = __now__ + make_interval(secs => :lease)
WHERE name = ANY(:declared::text[]) AND NOT dynamic;

-- name: schedule_next_due(declared, targets, now)
-- When this worker's timer must wake: the first due slot or trigger of a schedule it fires,
-- the first run deadline and the first wait timeout (each read off its index), and the
-- database's clock, which every process shares whatever its own says.
SELECT (SELECT min(least(CASE WHEN NOT s.paused THEN s.next_at END, s.triggered_at))
        FROM __schema__.cyclone_schedules s
        WHERE (s.name = ANY(:declared::text[]) AND NOT s.dynamic)
           OR (s.dynamic AND s.target = ANY(:targets::text[]))) AS schedule_due,
       (SELECT min(deadline) FROM __schema__.cyclone_runs
        WHERE deadline IS NOT NULL AND state = 'pending') AS deadline_due,
       (SELECT min(wait_until) FROM __schema__.cyclone_steps
        WHERE state = 'waiting' AND wait_until IS NOT NULL) AS wait_due,
       coalesce(:now::timestamptz, __now__) AS now;

-- name: schedule_claim_due(now, declared, targets, limit)
-- The due schedules this worker fires, locked until its firing transaction ends. SKIP LOCKED:
-- another worker firing one now has it; it advances next_at before it commits. With the
-- state of each schedule's last run, for the overlap policy.
SELECT s.name, s.target, s.job, s.cron, s.every, s.start_at, s.tz, s.catch_up,
       s.catch_up_window, s.overlap, s.input::text AS input, s.dynamic, s.paused, s.next_at,
       s.triggered_at, r.state AS last_state, coalesce(:now::timestamptz, __now__) AS now
FROM __schema__.cyclone_schedules s
LEFT JOIN __schema__.cyclone_runs r ON r.id = s.last_run_id
WHERE ((s.name = ANY(:declared::text[]) AND NOT s.dynamic)
       OR (s.dynamic AND s.target = ANY(:targets::text[])))
  AND ((NOT s.paused AND s.next_at <= coalesce(:now::timestamptz, __now__))
       OR s.triggered_at IS NOT NULL)
ORDER BY s.name
LIMIT :limit
FOR UPDATE OF s SKIP LOCKED;

-- name: schedule_job_insert_many(kind, queue, priority, max_attempts, ids, inputs, keys)
-- Standalone jobs of one kind, one per slot key (:inputs one JSON array, an element per
-- key, as in job_insert_many); a key that already has its run inserts nothing (the same
-- guarantee as submit_once: idx_runs_submit_key, in every run state).
WITH run AS (
    INSERT INTO __schema__.cyclone_runs AS r
        (id, name, job, input, queue, key, nodes, remaining, priority, max_attempts)
    SELECT i.id, :kind, true, i.input, :queue, i.key, 1, 1, :priority, :max_attempts
    FROM ROWS FROM (unnest(:ids::uuid[]), jsonb_array_elements(:inputs::jsonb),
                    unnest(:keys::text[])) AS i (id, input, key)
    /* fragment: submit_key_taken */
    RETURNING r.id, r.key
), task AS (
    INSERT INTO __schema__.cyclone_tasks (run_id, kind, queue, priority, max_attempts)
    SELECT id, :kind, :queue, :priority, :max_attempts FROM run
)
SELECT id, key FROM run;

-- name: schedule_advance(next_at, last_slot, last_run_id, triggered_at, name)
-- After a firing pass: the next unfired slot, the newest run made, and the trigger it
-- served cleared (unless a newer trigger came meanwhile).
UPDATE __schema__.cyclone_schedules SET
    next_at = :next_at,
    last_slot = CASE WHEN :last_slot::timestamptz IS NULL THEN last_slot
                     ELSE greatest(last_slot, :last_slot) END,
    last_run_id = coalesce(:last_run_id, last_run_id),
    triggered_at = CASE WHEN triggered_at = :triggered_at THEN NULL ELSE triggered_at END
WHERE name = :name;

-- name: schedule_list(name)
SELECT name, target, job, cron, every, start_at, tz, catch_up, catch_up_window, overlap,
       input::text AS input, dynamic, declared_until, paused, next_at, last_slot, last_run_id,
       triggered_at, created_at, updated_at, __now__ AS now
FROM __schema__.cyclone_schedules
WHERE :name::text IS NULL OR name = :name
ORDER BY name;

-- name: schedule_lock(name)
SELECT name, cron, every, start_at, tz, dynamic, declared_until > __now__ AS declared,
       __now__ AS now
FROM __schema__.cyclone_schedules WHERE name = :name FOR UPDATE;

-- name: schedule_set_paused(paused, next_at, name)
-- Pause, or resume from the next slot after now (missed slots of a pause are not run).
UPDATE __schema__.cyclone_schedules
SET paused = :paused, next_at = coalesce(:next_at, next_at), updated_at = __now__
WHERE name = :name;

-- name: schedule_trigger(name)
-- Ask the workers that fire this schedule to run it now; a trigger not yet fired is kept,
-- so two quick triggers make one run.
UPDATE __schema__.cyclone_schedules
SET triggered_at = coalesce(triggered_at, __now__)
WHERE name = :name
RETURNING triggered_at;

-- name: schedule_create(name, target, job, cron, every, start_at, tz, catch_up,
--     catch_up_window, overlap, input, next_at)
INSERT INTO __schema__.cyclone_schedules
    (name, target, job, cron, every, start_at, tz, catch_up, catch_up_window, overlap, input,
     dynamic, next_at)
VALUES (:name, :target, :job, :cron, :every, :start_at, :tz, :catch_up, :catch_up_window, :overlap,
        :input::jsonb, true, :next_at)
ON CONFLICT (name) DO NOTHING
RETURNING name;

-- name: schedule_update(target, job, cron, every, start_at, tz, catch_up, catch_up_window,
--     overlap, input, next_at, name)
UPDATE __schema__.cyclone_schedules SET
    target = :target, job = :job, cron = :cron, every = :every, start_at = :start_at,
    tz = :tz, catch_up = :catch_up, catch_up_window = :catch_up_window, overlap = :overlap,
    input = :input::jsonb, next_at = :next_at, updated_at = __now__
WHERE name = :name AND dynamic;

-- name: schedule_delete(name)
DELETE FROM __schema__.cyclone_schedules WHERE name = :name;
