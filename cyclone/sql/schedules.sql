-- Schedules (see migrations/0007_schedules.sql). A worker fires a row when it declares the
-- schedule (the array of declared names) or, for a dynamic row, serves its target (the array
-- of served kinds and workflows): only then does it hold what a run needs (the input
-- function, the workflow's graph). A "now" parameter, where taken, overrides now() when not
-- NULL, so that tests can move the clock.

-- name: schedule_declare_many
-- Upsert a worker's declared schedules. A changed timing or policy moves next_at to the one
-- computed from the new timing; an unchanged one keeps its place, so a restart neither
-- skips nor repeats a slot. Pausing is the operators' and survives a deploy.
INSERT INTO __schema__.cyclone_schedules AS s
    (name, target, job, cron, every, start_at, tz, catch_up, catch_up_window, overlap, input,
     dynamic, declared_until, next_at)
SELECT d.name, d.target, d.job, d.cron, d.every, d.start_at, d.tz, d.catch_up, d.win,
       d.overlap, d.input::jsonb, false, now() + make_interval(secs => $1), d.next_at
FROM unnest($2::text[], $3::text[], $4::bool[], $5::text[],
            $6::interval[], $7::timestamptz[], $8::text[], $9::text[],
            $10::interval[], $11::text[], $12::text[], $13::timestamptz[])
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
    updated_at = now();

-- name: schedule_refresh
-- Keep a running worker's declarations alive.
UPDATE __schema__.cyclone_schedules SET declared_until = now() + make_interval(secs => $1)
WHERE name = ANY($2::text[]) AND NOT dynamic;

-- name: schedule_next_due
-- When this worker's timer must wake: the first due slot or trigger of a schedule it fires,
-- the first run deadline and the first wait timeout (each read off its index), and the
-- database's clock, which every process shares whatever its own says.
SELECT (SELECT min(least(CASE WHEN NOT s.paused THEN s.next_at END, s.triggered_at))
        FROM __schema__.cyclone_schedules s
        WHERE (s.name = ANY($1::text[]) AND NOT s.dynamic)
           OR (s.dynamic AND s.target = ANY($2::text[]))) AS schedule_due,
       (SELECT min(deadline) FROM __schema__.cyclone_runs
        WHERE deadline IS NOT NULL AND state = 'pending') AS deadline_due,
       (SELECT min(wait_until) FROM __schema__.cyclone_steps
        WHERE state = 'waiting' AND wait_until IS NOT NULL) AS wait_due,
       coalesce($3::timestamptz, now()) AS now;

-- name: schedule_claim_due
-- The due schedules this worker fires, locked until its firing transaction ends. SKIP LOCKED:
-- another worker firing one now has it; it advances next_at before it commits. With the
-- state of each schedule's last run, for the overlap policy.
SELECT s.name, s.target, s.job, s.cron, s.every, s.start_at, s.tz, s.catch_up,
       s.catch_up_window, s.overlap, s.input::text AS input, s.dynamic, s.paused, s.next_at,
       s.triggered_at, r.state AS last_state, coalesce($1::timestamptz, now()) AS now
FROM __schema__.cyclone_schedules s
LEFT JOIN __schema__.cyclone_runs r ON r.id = s.last_run_id
WHERE ((s.name = ANY($2::text[]) AND NOT s.dynamic)
       OR (s.dynamic AND s.target = ANY($3::text[])))
  AND ((NOT s.paused AND s.next_at <= coalesce($1::timestamptz, now()))
       OR s.triggered_at IS NOT NULL)
ORDER BY s.name
LIMIT $4
FOR UPDATE OF s SKIP LOCKED;

-- name: schedule_job_insert_many
-- Standalone jobs of one kind, one per slot key; a key that already has its run inserts
-- nothing (the same guarantee as submit_once: idx_runs_submit_key, in every run state).
WITH run AS (
    INSERT INTO __schema__.cyclone_runs AS r
        (id, name, job, input, queue, key, nodes, remaining, priority, max_attempts)
    SELECT i.id, $1, true, i.input::jsonb, $2, i.key, 1, 1, $3, $4
    FROM unnest($5::uuid[], $6::text[], $7::text[]) AS i (id, input, key)
    ON CONFLICT (name, key) WHERE key IS NOT NULL DO NOTHING
    RETURNING r.id, r.key
), task AS (
    INSERT INTO __schema__.cyclone_tasks (run_id, kind, queue, priority, max_attempts)
    SELECT id, $1, $2, $3, $4 FROM run
)
SELECT id, key FROM run;

-- name: schedule_advance
-- After a firing pass: the next unfired slot, the newest run made, and the trigger it
-- served cleared (unless a newer trigger came meanwhile).
UPDATE __schema__.cyclone_schedules SET
    next_at = $1,
    last_slot = CASE WHEN $2::timestamptz IS NULL THEN last_slot
                     ELSE greatest(last_slot, $2) END,
    last_run_id = coalesce($3, last_run_id),
    triggered_at = CASE WHEN triggered_at = $4 THEN NULL ELSE triggered_at END
WHERE name = $5;

-- name: schedule_list
SELECT name, target, job, cron, every, start_at, tz, catch_up, catch_up_window, overlap,
       input::text AS input, dynamic, declared_until, paused, next_at, last_slot, last_run_id,
       triggered_at, created_at, updated_at, now() AS now
FROM __schema__.cyclone_schedules
WHERE $1::text IS NULL OR name = $1
ORDER BY name;

-- name: schedule_lock
SELECT name, cron, every, start_at, tz, dynamic, declared_until > now() AS declared, now() AS now
FROM __schema__.cyclone_schedules WHERE name = $1 FOR UPDATE;

-- name: schedule_set_paused
-- Pause, or resume from the next slot after now (missed slots of a pause are not run).
UPDATE __schema__.cyclone_schedules
SET paused = $1, next_at = coalesce($2, next_at), updated_at = now()
WHERE name = $3;

-- name: schedule_trigger
-- Ask the workers that fire this schedule to run it now; a trigger not yet fired is kept,
-- so two quick triggers make one run.
UPDATE __schema__.cyclone_schedules
SET triggered_at = coalesce(triggered_at, now())
WHERE name = $1
RETURNING triggered_at;

-- name: schedule_create
INSERT INTO __schema__.cyclone_schedules
    (name, target, job, cron, every, start_at, tz, catch_up, catch_up_window, overlap, input,
     dynamic, next_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10,
        $11::jsonb, true, $12)
ON CONFLICT (name) DO NOTHING
RETURNING name;

-- name: schedule_update
UPDATE __schema__.cyclone_schedules SET
    target = $1, job = $2, cron = $3, every = $4, start_at = $5,
    tz = $6, catch_up = $7, catch_up_window = $8, overlap = $9,
    input = $10::jsonb, next_at = $11, updated_at = now()
WHERE name = $12 AND dynamic;

-- name: schedule_delete
DELETE FROM __schema__.cyclone_schedules WHERE name = $1;
