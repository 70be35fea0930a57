-- Debounced and throttled enqueues (docs/debounce.md): a job whose key may send the call to
-- the key's run instead of making one. Statements of their own, so that the plain inserts
-- of insert.sql stay as they are.

-- fragment: debounce_waiting
-- The key's waiting task: a debounced job's task that no claim ever took (idx_tasks_debounce).
t.kind = :kind AND t.debounce_key = :debounce_key AND t.claims = 0 AND t.state = 'available'

-- name: job_debounce(id, input, kind, queue, priority, max_attempts, deadline, trace,
--     group_key, debounce_key, delay, max_wait, push)
-- needs: 0013
-- Push the key's waiting run back and give it :input, or make a new run that waits :delay.
-- pushed: with :push, the waiting task, locked. A claim that holds it makes this wait; once
-- the claim commits the task no longer has claims = 0 and matches nothing (the run started:
-- a new one is made). While this transaction holds it, claims skip it (SKIP LOCKED). Its
-- start moves to :delay from now, never past its first enqueue plus :max_wait (NULL: no
-- cap; least() ignores it). The input goes on the task as well: a claim that locks the task
-- after this commits reads the task as committed but the run as of its own snapshot, and it
-- hands over the task's input before the run's.
-- replaced: the pushed run's input; the run row after its task, the job lock order.
-- task, run: none waiting: a new job, unless an enqueue of the key inserted its task first.
-- The unique index is the arbiter (its predicate repeated here): ON CONFLICT waits for that
-- enqueue to commit or roll back, then inserts nothing if it committed, and the caller sends
-- this again, which then finds the task that enqueue made.
-- Returns the run's id, whether this made it, and whether it is claimable already (a push
-- capped by max_wait, or no delay), which is when a wakeup is worth sending.
WITH pushed AS (
    UPDATE __schema__.cyclone_tasks t
    SET available_at = least(__now__ + make_interval(secs => :delay),
                             t.debounce_since + make_interval(secs => :max_wait)),
        input = :input::jsonb
    WHERE /* fragment: debounce_waiting */ AND :push::bool
    RETURNING t.run_id, t.available_at
), replaced AS (
    UPDATE __schema__.cyclone_runs r SET input = :input::jsonb
    FROM pushed p WHERE r.id = p.run_id
), task AS (
    INSERT INTO __schema__.cyclone_tasks AS t
        (run_id, kind, queue, priority, available_at, max_attempts, group_key, debounce_key,
         debounce_since)
    SELECT :id, :kind, :queue, :priority, __now__ + make_interval(secs => :delay),
           :max_attempts, coalesce(:group_key, ''), :debounce_key, __now__
    WHERE NOT EXISTS (SELECT FROM pushed)
    ON CONFLICT (kind, debounce_key) WHERE debounce_key IS NOT NULL AND claims = 0
    DO NOTHING
    RETURNING t.run_id, t.available_at
), run AS (
    INSERT INTO __schema__.cyclone_runs
        (id, name, job, input, queue, nodes, remaining, priority, max_attempts, deadline, trace,
         group_key)
    SELECT task.run_id, :kind, true, :input::jsonb, :queue, 1, 1, :priority, :max_attempts,
           :deadline, :trace::jsonb, :group_key
    FROM task
)
SELECT w.run_id AS id, w.created, w.available_at <= __now__ AS due
FROM (SELECT run_id, false AS created, available_at FROM pushed
      UNION ALL
      SELECT run_id, true, available_at FROM task) w;

-- name: job_debounce_find(kind, debounce_key)
-- needs: 0013
-- The key's waiting run and its input, for a merge: its task locked until the transaction
-- ends, so that the merged input goes to the run whose input was merged. The task's input
-- once a push gave it one (as locked: its latest), else the run's, which no push changed.
SELECT t.run_id,
       coalesce(t.input, (SELECT r.input FROM __schema__.cyclone_runs r WHERE r.id = t.run_id))
           ::text AS input
FROM __schema__.cyclone_tasks t
WHERE /* fragment: debounce_waiting */
FOR UPDATE OF t;

-- name: job_throttle(id, input, kind, queue, priority, max_attempts, deadline, trace,
--     group_key, throttle_key, period)
-- needs: 0013
-- slot: the key's row, inserted by its first enqueue and taken over by the first one after
-- :period. ON CONFLICT locks the row (an enqueue of the key waits for this one to commit or
-- roll back) and judges its latest version, whatever this statement's snapshot: of two
-- enqueues of a key, exactly one opens its period.
-- run, task: the new job, runnable at once, only when this call opened the period; else
-- nothing, and the caller reads which run holds it (job_throttle_find).
WITH slot AS (
    INSERT INTO __schema__.cyclone_throttles AS s (kind, key, run_id, opened)
    VALUES (:kind, :throttle_key, :id, __now__)
    ON CONFLICT (kind, key) DO UPDATE SET run_id = excluded.run_id, opened = excluded.opened
    WHERE s.opened <= __now__ - make_interval(secs => :period)
    RETURNING s.run_id
), run AS (
    INSERT INTO __schema__.cyclone_runs
        (id, name, job, input, queue, nodes, remaining, priority, max_attempts, deadline, trace,
         group_key)
    SELECT slot.run_id, :kind, true, :input::jsonb, :queue, 1, 1, :priority, :max_attempts,
           :deadline, :trace::jsonb, :group_key
    FROM slot
), task AS (
    INSERT INTO __schema__.cyclone_tasks
        (run_id, kind, queue, priority, available_at, max_attempts, group_key)
    SELECT slot.run_id, :kind, :queue, :priority, __now__, :max_attempts,
           coalesce(:group_key, '')
    FROM slot
)
SELECT count(*)::int FROM slot;

-- name: job_throttle_find(kind, throttle_key)
-- needs: 0013
-- The run that opened the key's current period.
SELECT run_id FROM __schema__.cyclone_throttles WHERE kind = :kind AND key = :throttle_key;
