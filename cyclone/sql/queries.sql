-- Every statement Cyclone sends at run time, by name. Loaded once at import; __schema__ is
-- replaced by the client's validated, quoted schema. JSON travels as text cast to jsonb and
-- comes back as ::text, so a caller's connection codecs never change it.
--
-- Lock order, so that concurrent transitions of one run never deadlock:
-- - a workflow run: the run row (by id), then its tasks (by task id), then its steps. Statements
--   that decide on the run's current state lock it in a statement of their own first
--   (run_lock_many), so the next statement's snapshot sees every commit before the lock.
-- - a standalone job: its task row, then its run row. Each job transition is one statement
--   in which the run row is touched only after, and because of, the task row; so the hot
--   completion path needs no lock statement of its own.
-- A job transition that decides on the run's state (cancel, deadline) first locks both in
--   that order in a statement of its own (job_lock), as workflows do with run_lock_many.
-- A job run and a workflow run are never the same run, so the two orders never meet.
--
-- Plans that statistics cannot turn: the run history only grows, and the task table changes
-- faster than ANALYZE follows, so a hot statement reaches its rows by key in forms the
-- planner can only plan one way. A run read per task is a scalar subquery (never turned into
-- a join, its condition rated one half whatever the statistics say). A batch's tasks are
-- locked one by one in a LATERAL subquery with FOR UPDATE (never pulled up: a nested loop
-- over the keys, in id order). A write to a batch's rows also matches
-- `key = ANY (ARRAY(SELECT ...))`: an index condition whose array the planner cannot size,
-- so it reads the rows by key whether the batch is 1 row or 1,000 and the table 10 or 10
-- million; a join alone would be hashed over a scan of the whole table once the batch looks
-- large beside it.

-- name: migrations_lock
SELECT pg_advisory_xact_lock(1668899692, hashtext($1));

-- name: schema_create
CREATE SCHEMA IF NOT EXISTS __schema__;

-- name: migrations_table
CREATE TABLE IF NOT EXISTS __schema__.cyclone_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: migrations_applied
SELECT version FROM __schema__.cyclone_migrations ORDER BY version;

-- name: migrations_record
INSERT INTO __schema__.cyclone_migrations (version, name) VALUES ($1, $2);

-- name: sequence_lock
-- Enqueuers of one sequence take turns until commit, so task ids (the sequence order) are
-- handed out in commit order and a claim never sees a later id before an earlier one.
SELECT pg_advisory_xact_lock(1668899693, hashtext($1 || chr(31) || $2));

-- name: job_insert_many
-- Standalone jobs: a run row and a task row each, tasks in input order (the sequence order).
-- $12, when not NULL, is a wakeup to NOTIFY on channel $11 at the statement's commit: only
-- ever for an insert that commits on its own (Cyclone's autocommit statement, never a
-- caller's transaction), which saves the wakeup a statement and a connection of its own.
WITH run AS (
    INSERT INTO __schema__.cyclone_runs
        (id, name, job, input, queue, nodes, remaining, priority, max_attempts, deadline, trace)
    SELECT i.id, $3, true, i.input::jsonb, $4, 1, 1, $5, $7, $9, $10::jsonb
    FROM unnest($1::uuid[], $2::text[]) AS i (id, input)
), task AS (
    INSERT INTO __schema__.cyclone_tasks
        (run_id, kind, queue, priority, available_at, max_attempts, sequence_key)
    SELECT i.id, $3, $4, $5, coalesce($6, now()), $7, $8
    FROM unnest($1::uuid[]) WITH ORDINALITY AS i (id, ord)
    ORDER BY i.ord
)
SELECT pg_notify($11, $12) WHERE $12::text IS NOT NULL;

-- name: job_insert_unique
-- One standalone job with a unique key ($13; the rest as job_insert_many, for one job, and
-- the wakeup only if it was inserted). A key held by an active run inserts nothing: ON
-- CONFLICT keeps the caller's transaction usable where an error would abort it.
WITH run AS (
    INSERT INTO __schema__.cyclone_runs AS r
        (id, name, job, input, queue, unique_key, nodes, remaining, priority, max_attempts,
         deadline, trace)
    VALUES ($1, $3, true, $2::jsonb, $4, $13, 1, 1, $5, $7, $9, $10::jsonb)
    ON CONFLICT (name, unique_key) WHERE unique_key IS NOT NULL AND state = 'pending'
    DO NOTHING
    RETURNING r.id
), task AS (
    INSERT INTO __schema__.cyclone_tasks
        (run_id, kind, queue, priority, available_at, max_attempts, sequence_key)
    SELECT id, $3, $4, $5, coalesce($6, now()), $7, $8 FROM run
)
SELECT c.n, (SELECT pg_notify($11, $12) WHERE $12::text IS NOT NULL AND c.n > 0)
FROM (SELECT count(*)::int AS n FROM run) c;

-- name: job_find_unique
SELECT id FROM __schema__.cyclone_runs
WHERE name = $1 AND unique_key = $2 AND state = 'pending';

-- fragment: workflow_nodes
-- The CTEs between a workflow insert's run and its root tasks ($8 priority, $10-$15 the nodes,
-- $16-$17 the edges): one row of cyclone_steps per node, one of cyclone_edges per edge.
), node AS (
    SELECT * FROM unnest($10::text[], $11::text[], $12::text[], $13::int[], $14::int[],
                         $15::float8[])
        AS n (node, kind, queue, max_attempts, deps, wait_timeout)
), steps AS (
    INSERT INTO __schema__.cyclone_steps
        (run_id, node, kind, queue, priority, max_attempts, state, pending_deps,
         wait_timeout, wait_until)
    SELECT run.id, n.node, n.kind, n.queue, $8, n.max_attempts,
           CASE WHEN n.deps > 0 THEN 'pending'
                WHEN n.kind IS NULL THEN 'waiting' ELSE 'queued' END,
           n.deps, n.wait_timeout,
           CASE WHEN n.deps = 0 AND n.kind IS NULL
                THEN now() + make_interval(secs => n.wait_timeout) END
    FROM run, node n
), edges AS (
    INSERT INTO __schema__.cyclone_edges (run_id, parent, child)
    SELECT run.id, e.parent, e.child
    FROM run, unnest($16::text[], $17::text[]) AS e (parent, child)

-- name: workflow_insert
-- A workflow run, its steps and its edges in one statement; roots get tasks (or wait).
-- A key already taken inserts nothing (submit_once then compares inputs).
WITH run AS (
    INSERT INTO __schema__.cyclone_runs AS r
        (id, name, job, input, result_node, key, nodes, remaining, priority, deadline, trace)
    VALUES ($1, $2, false, $3::jsonb, $4, $5, $6, $6, $8, $7, $18::jsonb)
    ON CONFLICT (name, key) WHERE key IS NOT NULL DO NOTHING
    RETURNING r.id
/* fragment: workflow_nodes */
), tasks AS (
    INSERT INTO __schema__.cyclone_tasks
        (run_id, node, kind, queue, priority, available_at, max_attempts)
    SELECT run.id, n.node, n.kind, n.queue, $8, coalesce($9, now()), n.max_attempts
    FROM run, node n
    WHERE n.deps = 0 AND n.kind IS NOT NULL
)
SELECT id FROM run;

-- name: workflow_find_key
-- submit_once's slow path: the key's run, and whether its input equals this call's as jsonb.
SELECT id, input = $3::jsonb AS same_input, result_node
FROM __schema__.cyclone_runs WHERE name = $1 AND key = $2;

-- name: task_claim
-- Claim up to $3 available tasks of one queue for kinds this worker serves. SKIP LOCKED lets
-- workers claim side by side; a sequenced task is claimable only while no earlier task of its
-- sequence is live (available, running, or failed and blocking). The claim commits without
-- waiting for its WAL flush: a claim lost in a crash only makes the task available again,
-- which is what a crash does to it anyway.
--
-- The tasks are chosen from cyclone_tasks alone, walking the claim index, and each one's run
-- is read by its key in a scalar subquery: PostgreSQL never turns a scalar subquery into a
-- join, and it rates a subquery's condition at one half whatever the statistics say. As a
-- join, a run history whose statistics know of no pending run (the usual state right after
-- a burst of enqueues: autovacuum analyzes the small task table long before the run
-- history) was planned as a scan of every run, then a sort.
--
-- Flow control (migration 0008, docs/flow-control.md), in the same statement. A paused
-- queue starts nothing. The tasks of each group key ('' for none) are taken in claim order,
-- the keys in turns: the keys with fewer running tasks first (ties in random order), every
-- key's first task, then every key's second. A queue without keyed work pays one probe of
-- the claim index for it, and one key alone counts nothing.
-- A limited queue's row (and a limited kind's) is locked, so that its claims take turns, and
-- each claim that starts work bumps its version. Running tasks are counted in this
-- statement's snapshot, which a claim committed while this one waited for the lock is not
-- in: so a claim whose snapshot saw an older version than the row it locked starts nothing
-- and says to claim again at once (a version equal to the snapshot's proves that every claim
-- of the queue is in the snapshot; a task that ended since is counted still, which is safe).
-- Running tasks are counted through the lease index (running tasks only: the state is said
-- too, so that a plan without statistics does not take every task for running), and only
-- when a limit or the turns need them. A per-key rate counts each key's starts in its window from
-- cyclone_key_starts, which the same claims write and prune under the same lock.
-- After the tasks, one row with a NULL id may follow, when a limit held the claim back:
-- retry_in is how many seconds until it can start more (0: at once; NULL: when a task ends).
WITH async_commit AS (
    SELECT set_config('synchronous_commit', 'off', true)
), seen AS MATERIALIZED (  -- the queue's row in this statement's snapshot; none: no limits
    SELECT q.paused, q.version,
        q.concurrency IS NOT NULL OR q.rate IS NOT NULL OR q.key_concurrency IS NOT NULL
            OR q.key_rate IS NOT NULL AS limited
    FROM __schema__.cyclone_queues q WHERE q.queue = $1
), gate AS MATERIALIZED (  -- a limited queue's row, locked: its newest version
    SELECT q.version, q.concurrency, q.key_concurrency, q.rate, q.per, q.key_rate, q.key_per,
        least(q.rate, q.tokens + greatest(0, extract(epoch FROM now() - q.refilled_at))
                                 * q.rate / q.per) AS tokens
    FROM __schema__.cyclone_queues q
    WHERE q.queue = $1 AND (SELECT s.limited AND NOT s.paused FROM seen s)
    FOR NO KEY UPDATE
), kind_seen AS MATERIALIZED (  -- the limited kinds among those served, in the snapshot
    SELECT k.kind, k.version FROM __schema__.cyclone_kind_limits k
    WHERE k.kind = ANY ($2::text[]) AND (k.concurrency IS NOT NULL OR k.rate IS NOT NULL)
      AND NOT coalesce((SELECT s.paused FROM seen s), false)
), kind_gate AS MATERIALIZED (  -- their rows, locked in kind order (after the queue's)
    SELECT k.kind, k.version, k.concurrency, k.rate, k.per,
        least(k.rate, k.tokens + greatest(0, extract(epoch FROM now() - k.refilled_at))
                                 * k.rate / k.per) AS tokens
    FROM __schema__.cyclone_kind_limits k
    -- (after the queue's row: the always-true count makes gate's lock come first)
    WHERE k.kind = ANY (ARRAY(SELECT kind FROM kind_seen)) AND (SELECT count(*) FROM gate) >= 0
    ORDER BY k.kind
    FOR NO KEY UPDATE
), stale AS MATERIALIZED (  -- a claim committed after this statement's snapshot was taken
    SELECT coalesce((SELECT s.limited AND NOT s.paused FROM seen s), false)
           AND (SELECT g.version FROM gate g) IS DISTINCT FROM (SELECT s.version FROM seen s)
        OR EXISTS (SELECT 1 FROM kind_seen s LEFT JOIN kind_gate g ON g.kind = s.kind
                   WHERE g.version IS DISTINCT FROM s.version) AS stale
), kind_free AS MATERIALIZED (  -- what each limited kind may start now
    SELECT g.kind, g.rate, g.per, g.tokens,
        greatest(0, least(
            CASE WHEN g.concurrency IS NOT NULL THEN g.concurrency
                - (SELECT count(*) FROM __schema__.cyclone_tasks r
                   WHERE r.state = 'running' AND r.lease_until BETWEEN '-infinity' AND 'infinity' AND r.kind = g.kind) END,
            floor(g.tokens)))::int AS free
    FROM kind_gate g
), allow AS MATERIALIZED (  -- what the queue may start now: none if paused or stale
    SELECT CASE WHEN coalesce((SELECT s.paused FROM seen s), false) OR (SELECT stale FROM stale)
        THEN 0
        ELSE greatest(0, least($3,
            (SELECT CASE WHEN g.concurrency IS NOT NULL THEN g.concurrency
                 - (SELECT count(*) FROM __schema__.cyclone_tasks r
                    WHERE r.state = 'running' AND r.lease_until BETWEEN '-infinity' AND 'infinity' AND r.queue = $1) END FROM gate g),
            (SELECT floor(g.tokens) FROM gate g)))::int
        END AS n
), keyed AS MATERIALIZED (  -- the first group key with available tasks, if any: one probe
    SELECT t.group_key AS key FROM __schema__.cyclone_tasks t
    WHERE t.state = 'available' AND t.queue = $1 AND t.group_key > ''
      AND (SELECT n FROM allow) > 0
    ORDER BY t.group_key LIMIT 1
), keys AS MATERIALIZED (  -- the keys with available tasks: one claim index probe each
    WITH RECURSIVE k (key) AS (
        (SELECT t.group_key FROM __schema__.cyclone_tasks t
         WHERE t.state = 'available' AND t.queue = $1 AND EXISTS (SELECT 1 FROM keyed)
         ORDER BY t.group_key LIMIT 1)
        UNION ALL
        SELECT (SELECT t.group_key FROM __schema__.cyclone_tasks t
                WHERE t.state = 'available' AND t.queue = $1 AND t.group_key > k.key
                ORDER BY t.group_key LIMIT 1)
        FROM k WHERE k.key IS NOT NULL
    )
    SELECT key FROM k WHERE key IS NOT NULL
    UNION ALL  -- a queue without keyed work: its one group, without looking further
    SELECT '' WHERE (SELECT n FROM allow) > 0 AND NOT EXISTS (SELECT 1 FROM keyed)
), running AS MATERIALIZED (  -- the queue's running tasks by key, if the turns need them
    SELECT r.group_key AS key, count(*) AS n FROM __schema__.cyclone_tasks r
    WHERE r.state = 'running' AND r.lease_until BETWEEN '-infinity' AND 'infinity' AND r.queue = $1
      AND ((SELECT count(*) FROM keys) > 1
           OR (SELECT g.key_concurrency FROM gate g) IS NOT NULL)
    GROUP BY r.group_key
), recent AS MATERIALIZED (  -- each key's starts in its rate's window, if it has one
    SELECT s.group_key AS key, count(*) AS n, min(s.at) AS oldest
    FROM __schema__.cyclone_key_starts s
    WHERE s.queue = $1 AND (SELECT g.key_rate FROM gate g) IS NOT NULL
      AND s.at > now() - make_interval(secs => (SELECT g.key_per FROM gate g))
    GROUP BY s.group_key
), room AS MATERIALIZED (  -- each key's running tasks, and what its own limits leave
    SELECT k.key, coalesce(r.n, 0) AS running,
        CASE WHEN k.key <> '' THEN least(g.key_concurrency - coalesce(r.n, 0),
                                         g.key_rate - coalesce(s.n, 0)) END AS free,
        CASE WHEN k.key <> '' AND s.n >= g.key_rate  -- until its oldest start leaves
            THEN extract(epoch FROM s.oldest + make_interval(secs => g.key_per) - now())
        END AS wait
    FROM keys k
    LEFT JOIN running r ON r.key = k.key
    LEFT JOIN recent s ON s.key = k.key
    LEFT JOIN gate g ON true
), turns AS MATERIALIZED (  -- up to n keys with room, in turn, each to take its share
    SELECT key, free, row_number() OVER (ORDER BY running, random()) AS turn
    FROM room WHERE free IS NULL OR free > 0
    ORDER BY running, random()
    LIMIT (SELECT n FROM allow)
), picked AS MATERIALIZED (
    SELECT u.turn, c.run_id, c.id, c.kind, c.priority, c.available_at
    FROM turns u
    CROSS JOIN LATERAL (
        SELECT t.run_id, t.id, t.kind, t.priority, t.available_at
        FROM __schema__.cyclone_tasks t
        WHERE t.state = 'available' AND t.queue = $1 AND t.group_key = u.key
          AND t.available_at <= now() AND t.kind = ANY ($2::text[])
          -- A failed run starts nothing more, not even a node whose attempt failed or whose
          -- lease expired after the run failed; retry_all re-opens the run and so the task.
          -- A node's input may need its workflow's input function: only workers that know
          -- the workflow take its nodes.
          AND (SELECT r.state = 'pending' AND (t.node IS NULL OR r.name = ANY ($6::text[]))
               FROM __schema__.cyclone_runs r WHERE r.id = t.run_id)
          AND (t.sequence_key IS NULL OR NOT EXISTS (
                SELECT 1 FROM __schema__.cyclone_tasks h
                WHERE h.kind = t.kind AND h.sequence_key = t.sequence_key AND h.id < t.id))
        ORDER BY t.priority DESC, t.available_at, t.id
        LIMIT least(u.free, ceil((SELECT n FROM allow)::float8 / (SELECT count(*) FROM turns)))
        FOR UPDATE OF t SKIP LOCKED
    ) c
), chosen AS MATERIALIZED (  -- in turns: every key's first task, then every key's second...
    SELECT p.run_id, p.id, p.rank, p.turn
    FROM (
        SELECT p.*, row_number() OVER (PARTITION BY p.kind ORDER BY p.rank, p.turn) AS nth
        FROM (
            SELECT p.*, row_number() OVER (
                PARTITION BY p.turn ORDER BY p.priority DESC, p.available_at, p.id) AS rank
            FROM picked p
        ) p
    ) p
    LEFT JOIN kind_free f ON f.kind = p.kind
    WHERE f.kind IS NULL OR p.nth <= f.free  -- within each limited kind's room
    ORDER BY p.rank, p.turn
    LIMIT (SELECT n FROM allow)
), claimed AS (
    UPDATE __schema__.cyclone_tasks t
    SET state = 'running', attempt = t.attempt + 1, claims = t.claims + 1,
        lease_until = now() + make_interval(secs => $4), worker = $5, started_at = now()
    FROM chosen, async_commit
    WHERE t.run_id = chosen.run_id AND t.id = chosen.id
      AND t.run_id = ANY (ARRAY(SELECT run_id FROM chosen))
    RETURNING t.id, t.run_id, t.node, t.kind, t.attempt, t.max_attempts, t.claims, t.group_key,
        -- The claimed tasks' runs, by key again (one read for the three columns).
        (SELECT ARRAY[r.name, r.input::text, r.trace::text]
         FROM __schema__.cyclone_runs r WHERE r.id = t.run_id) AS run,
        (SELECT jsonb_object_agg(e.parent, s.output)::text
         FROM __schema__.cyclone_edges e
         JOIN __schema__.cyclone_steps s ON s.run_id = e.run_id AND s.node = e.parent
         WHERE e.run_id = t.run_id AND e.child = t.node) AS deps
), counted AS (  -- a limited queue's row: a new version, the bucket less what started
    UPDATE __schema__.cyclone_queues q
    SET version = q.version + 1, refilled_at = now(),
        tokens = CASE WHEN q.rate IS NOT NULL THEN g.tokens - c.n ELSE 0 END
    FROM gate g, (SELECT count(*) AS n FROM claimed) c
    WHERE q.queue = $1 AND c.n > 0
    RETURNING q.rate, q.per, q.tokens
), logged AS (  -- a per-key rate's starts, and the end of those out of every window
    INSERT INTO __schema__.cyclone_key_starts (queue, group_key, at)
    SELECT $1, c.group_key, now() FROM claimed c, gate g
    WHERE g.key_rate IS NOT NULL AND c.group_key <> ''
), pruned AS (
    DELETE FROM __schema__.cyclone_key_starts s
    WHERE s.queue = $1 AND (SELECT g.key_rate FROM gate g) IS NOT NULL
      AND s.at <= now() - make_interval(secs => (SELECT g.key_per FROM gate g))
), kinds_counted AS (  -- likewise for each limited kind that started work
    UPDATE __schema__.cyclone_kind_limits k
    SET version = k.version + 1, refilled_at = now(),
        tokens = CASE WHEN k.rate IS NOT NULL THEN f.tokens - c.n ELSE 0 END
    FROM kind_free f, (SELECT kind, count(*) AS n FROM claimed GROUP BY kind) c
    WHERE k.kind = f.kind AND c.kind = f.kind
    RETURNING k.rate, k.per, k.tokens
), held AS (  -- whether a limit held the claim back, and until when
    SELECT CASE
        WHEN (SELECT stale FROM stale) THEN 0
        -- Keys took their shares and more may be waiting: claim again at once.
        WHEN (SELECT count(*) FROM turns) > 1 AND (SELECT count(*) FROM claimed) > 0
             AND (SELECT count(*) FROM claimed) < (SELECT n FROM allow) THEN 0
        ELSE (SELECT greatest(0, min(w.seconds)) FROM (
                  SELECT (1 - b.tokens) * b.per / b.rate AS seconds FROM (
                      SELECT rate, per, tokens FROM counted
                      UNION ALL SELECT rate, per, tokens FROM kinds_counted
                      UNION ALL SELECT rate, per, tokens FROM gate
                      WHERE NOT EXISTS (SELECT 1 FROM counted)
                      UNION ALL SELECT f.rate, f.per, f.tokens FROM kind_free f
                      WHERE NOT EXISTS (SELECT 1 FROM kinds_counted)) b
                  WHERE b.rate IS NOT NULL AND b.tokens < 1
                  UNION ALL  -- a key at its rate: until a start leaves its window
                  SELECT r.wait::float8 FROM room r WHERE r.wait IS NOT NULL) w)
        END AS retry_in
    WHERE (SELECT count(*) FROM claimed) < $3
      AND ((SELECT stale FROM stale) OR EXISTS (SELECT 1 FROM gate)
           OR EXISTS (SELECT 1 FROM kind_gate)
           OR ((SELECT count(*) FROM turns) > 1 AND (SELECT count(*) FROM claimed) > 0))
)
SELECT id, run_id, node, kind, attempt, max_attempts, claims,
    run[1] AS name, run[2] AS input, run[3] AS trace, deps, NULL::float8 AS retry_in
FROM claimed
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, retry_in FROM held;

-- name: task_heartbeat
-- Extend the leases of tasks this worker still owns; a task missing from the result was
-- cancelled or reclaimed, and its handler must stop. No WAL flush wait, as for claims.
WITH async_commit AS (
    SELECT set_config('synchronous_commit', 'off', true)
), mine AS (
    SELECT t.run_id, t.id
    FROM (SELECT * FROM unnest($1::uuid[], $2::bigint[], $3::int[]) AS h (run_id, id, claims)
          ORDER BY h.id) h
    CROSS JOIN LATERAL (
        SELECT t.run_id, t.id FROM __schema__.cyclone_tasks t
        WHERE t.run_id = h.run_id AND t.id = h.id AND t.claims = h.claims
          AND t.state = 'running'
        FOR UPDATE
    ) t
)
UPDATE __schema__.cyclone_tasks t SET lease_until = now() + make_interval(secs => $4)
FROM mine, async_commit
WHERE t.run_id = mine.run_id AND t.id = mine.id
  AND t.run_id = ANY (ARRAY(SELECT run_id FROM mine))
RETURNING t.id, t.claims;

-- name: task_pending_work
-- Whether a worker serving kinds $1 and workflows $2 has work running, or claimable now by
-- the rules of task_claim (for draining in tests); runs are read by key, as there.
SELECT EXISTS (
    SELECT 1 FROM __schema__.cyclone_tasks t
    WHERE t.kind = ANY ($1::text[])
      AND (t.state = 'running'
           OR (t.state = 'available' AND t.available_at <= now()
               AND (t.sequence_key IS NULL OR NOT EXISTS (
                    SELECT 1 FROM __schema__.cyclone_tasks h
                    WHERE h.kind = t.kind AND h.sequence_key = t.sequence_key
                      AND h.id < t.id))))
      AND (SELECT (t.state = 'running' OR r.state = 'pending')
                  AND (t.node IS NULL OR r.name = ANY ($2::text[]))
           FROM __schema__.cyclone_runs r WHERE r.id = t.run_id)
);

-- name: run_lock_many
SELECT id, state FROM __schema__.cyclone_runs
WHERE id = ANY ($1::uuid[]) ORDER BY id FOR UPDATE;

-- fragment: fenced_completions
-- The completions ($1 runs, $2 task ids, $3 claim counts, $4 outputs) whose task is still
-- running under the same claim, locked in task-id order, and their task rows deleted: a
-- task reclaimed or cancelled meanwhile matches nothing, and that completion is rejected.
WITH fenced AS (
    SELECT t.run_id, t.id, c.output
    FROM (SELECT * FROM unnest($1::uuid[], $2::bigint[], $3::int[], $4::text[])
              AS c (run_id, id, claims, output)
          ORDER BY c.id) c
    CROSS JOIN LATERAL (
        SELECT t.run_id, t.id FROM __schema__.cyclone_tasks t
        WHERE t.run_id = c.run_id AND t.id = c.id AND t.claims = c.claims
          AND t.state = 'running'
        FOR UPDATE
    ) t
), done AS (
    DELETE FROM __schema__.cyclone_tasks t USING fenced f
    WHERE t.run_id = f.run_id AND t.id = f.id
      AND t.run_id = ANY (ARRAY(SELECT run_id FROM fenced))

-- name: job_complete_many
-- Completed attempts of standalone jobs, in one statement (task rows, then their runs): the
-- task row goes, the run row takes the output. A task no longer owned by its attempt (reclaimed,
-- cancelled) matches nothing: that completion is rejected.
/* fragment: fenced_completions */
    RETURNING t.id, t.claims, t.run_id, t.attempt, t.errors, f.output
)
UPDATE __schema__.cyclone_runs r
SET state = 'completed', output = d.output::jsonb, remaining = 0, attempts = d.attempt,
    errors = d.errors, finished_at = now(), completed_task = d.id, completed_claims = d.claims
FROM done d
WHERE r.id = d.run_id AND r.state = 'pending' AND r.id = ANY (ARRAY(SELECT run_id FROM done))
RETURNING d.id, d.claims, r.id AS run_id;

-- name: attempts_completed
-- Which of these attempts (run, node or NULL for a job, task id, claim count) completed
-- their job or node: after a completion write whose reply was lost, whether it committed.
-- (task id, claims) names one attempt for good: ids are never reused, every claim counts up.
-- Each attempt's run or step by key (an EXISTS here is hashed over the whole history).
SELECT a.run_id, a.node
FROM unnest($1::uuid[], $2::text[], $3::bigint[], $4::int[]) AS a (run_id, node, task, claims)
WHERE CASE WHEN a.node IS NULL
    THEN (SELECT r.completed_task = a.task AND r.completed_claims = a.claims
          FROM __schema__.cyclone_runs r WHERE r.id = a.run_id)
    ELSE (SELECT s.completed_task = a.task AND s.completed_claims = a.claims
          FROM __schema__.cyclone_steps s WHERE s.run_id = a.run_id AND s.node = a.node)
    END;

-- name: node_finish_many
-- Completed attempts of workflow nodes (runs locked by the caller): fenced as above.
/* fragment: fenced_completions */
    RETURNING t.id, t.claims, t.run_id, t.node, t.attempt, t.errors, f.output
)
UPDATE __schema__.cyclone_steps s
SET state = 'completed', output = d.output::jsonb, attempts = d.attempt, errors = d.errors,
    finished_at = now(), completed_task = d.id, completed_claims = d.claims
FROM done d
WHERE s.run_id = d.run_id AND s.node = d.node
  AND s.run_id = ANY (ARRAY(SELECT run_id FROM done))
RETURNING d.id, d.claims, s.run_id, s.node;

-- name: wait_finish_many
-- Signalled wait nodes complete with their signal as output.
UPDATE __schema__.cyclone_steps s
SET state = 'completed', output = s.signal, wait_until = NULL, finished_at = now()
FROM unnest($1::uuid[], $2::text[]) AS w (run_id, node)
WHERE s.run_id = w.run_id AND s.node = w.node AND s.state = 'waiting' AND s.signal IS NOT NULL
RETURNING s.run_id, s.node;

-- name: node_advance
-- After nodes completed (runs locked by the caller, so their states are current): count down
-- each child's dependencies, release the children left with none while the run is open,
-- count the run down and complete it at zero. Returns the queues that got work, signalled
-- wait nodes that became reachable (the caller finishes them and advances again), and runs
-- that ended.
WITH done AS (
    SELECT * FROM unnest($1::uuid[], $2::text[]) AS d (run_id, node)
), released AS (
    UPDATE __schema__.cyclone_steps c
    SET pending_deps = c.pending_deps - x.n,
        state = CASE WHEN c.pending_deps = x.n AND x.open
                     THEN CASE WHEN c.kind IS NULL THEN 'waiting' ELSE 'queued' END
                     ELSE c.state END,
        wait_until = CASE WHEN c.pending_deps = x.n AND x.open AND c.kind IS NULL
                          THEN now() + make_interval(secs => c.wait_timeout) END
    FROM (
        SELECT e.run_id, e.child, count(*)::int AS n,
               bool_and((SELECT r.state = 'pending' FROM __schema__.cyclone_runs r
                         WHERE r.id = d.run_id)) AS open
        FROM done d
        JOIN __schema__.cyclone_edges e ON e.run_id = d.run_id AND e.parent = d.node
        GROUP BY e.run_id, e.child
    ) x
    WHERE c.run_id = x.run_id AND c.node = x.child
      AND c.run_id = ANY (ARRAY(SELECT run_id FROM done))
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
                           THEN now() ELSE r.finished_at END
    FROM (SELECT run_id, count(*)::int AS n FROM done GROUP BY run_id) x
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

-- name: task_retry_many
-- Attempts that failed with attempts left, or snoozed ($6: give the attempt back): the task
-- becomes available again after its delay, keeping the error of the attempt. If its run
-- failed meanwhile (a failed workflow lets running nodes finish), the node is parked as
-- run_fail parks unstarted ones: no available task is left in a run that starts nothing.
WITH fenced AS (
    SELECT t.run_id, t.id, c.delay, c.refund,
           (SELECT r.state = 'pending' FROM __schema__.cyclone_runs r WHERE r.id = t.run_id)
               AS open,
           CASE WHEN c.error IS NULL THEN t.errors ELSE t.errors || c.error::jsonb END AS errors
    FROM (SELECT * FROM unnest($1::uuid[], $2::bigint[], $3::int[], $4::float8[], $5::text[],
                               $6::bool[]) AS c (run_id, id, claims, delay, error, refund)
          ORDER BY c.id) c
    CROSS JOIN LATERAL (
        SELECT t.run_id, t.id, t.errors FROM __schema__.cyclone_tasks t
        WHERE t.run_id = c.run_id AND t.id = c.id AND t.claims = c.claims
          AND t.state = 'running'
        FOR UPDATE
    ) t
), parked AS (
    DELETE FROM __schema__.cyclone_tasks t USING fenced f
    WHERE t.run_id = f.run_id AND t.id = f.id AND NOT f.open
      AND t.run_id = ANY (ARRAY(SELECT run_id FROM fenced WHERE NOT open))
    RETURNING t.id, t.run_id, t.node, t.attempt - f.refund::int AS attempt, f.errors
), park AS (
    UPDATE __schema__.cyclone_steps s
    SET state = 'pending', attempts = p.attempt, errors = p.errors
    FROM parked p
    WHERE s.run_id = p.run_id AND s.node = p.node
      AND s.run_id = ANY (ARRAY(SELECT run_id FROM parked))
), retried AS (
    UPDATE __schema__.cyclone_tasks t
    SET state = 'available', available_at = now() + make_interval(secs => f.delay),
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

-- name: job_fail
-- A job's last attempt failed (task row, then run). A sequenced job keeps its task row,
-- failed, so that the rest of its sequence waits until it is retried or cancelled.
-- $5: only if the lease expired (maintenance, which read the task without a lock).
WITH gone AS (
    DELETE FROM __schema__.cyclone_tasks t
    WHERE t.run_id = $1 AND t.id = $2 AND t.claims = $3 AND t.state = 'running'
      AND t.sequence_key IS NULL AND (NOT $5::bool OR t.lease_until < now())
    RETURNING t.run_id, t.attempt, t.errors || $4::jsonb AS errors
), blocking AS (
    UPDATE __schema__.cyclone_tasks t
    SET state = 'failed', lease_until = NULL, worker = NULL, errors = t.errors || $4::jsonb
    WHERE t.run_id = $1 AND t.id = $2 AND t.claims = $3 AND t.state = 'running'
      AND t.sequence_key IS NOT NULL AND (NOT $5::bool OR t.lease_until < now())
    RETURNING t.run_id, t.attempt, t.errors
)
UPDATE __schema__.cyclone_runs r
SET state = 'failed', attempts = x.attempt, errors = x.errors, error = $4::jsonb,
    finished_at = now()
FROM (SELECT * FROM gone UNION ALL SELECT * FROM blocking) x
WHERE r.id = x.run_id AND r.state = 'pending'
RETURNING r.id;

-- name: node_fail
-- A workflow node's last attempt failed (its run locked by the caller): the node fails.
-- $5: only if the lease expired, as for job_fail.
WITH gone AS (
    DELETE FROM __schema__.cyclone_tasks t
    WHERE t.run_id = $1 AND t.id = $2 AND t.claims = $3 AND t.state = 'running'
      AND (NOT $5::bool OR t.lease_until < now())
    RETURNING t.run_id, t.node, t.attempt, t.errors
)
UPDATE __schema__.cyclone_steps s
SET state = 'failed', attempts = g.attempt, errors = g.errors || $4::jsonb, finished_at = now()
FROM gone g
WHERE s.run_id = g.run_id AND s.node = g.node
RETURNING s.run_id, s.node;

-- name: attempts_released
-- Which of these attempts (run, task id, claim count, attempt number) put their task back in
-- its queue (retry, snooze, hand-back): after such a write whose reply was lost, whether it
-- committed. The attempt released its task if the task is available with the same claim count,
-- or was claimed again since, and maintenance did not reclaim that attempt instead
-- (task_reclaim records a LeaseExpired error for it). Each task by key, in a scalar subquery.
SELECT a.id, a.claims
FROM unnest($1::uuid[], $2::bigint[], $3::int[], $4::int[]) AS a (run_id, id, claims, attempt)
WHERE (SELECT (t.claims > a.claims OR (t.claims = a.claims AND t.state = 'available'))
              AND NOT t.errors @> jsonb_build_array(jsonb_build_object(
                  'attempt', a.attempt, 'type', 'LeaseExpired'))
       FROM __schema__.cyclone_tasks t WHERE t.run_id = a.run_id AND t.id = a.id);

-- name: attempts_failed
-- Which of these attempts (run, node or NULL for a job, error record) failed their job or
-- node: after a failure write whose reply was lost, whether it committed. An error record
-- holds its attempt and the time it was made, so finding it kept is proof. Runs and steps by
-- key, in scalar subqueries.
SELECT a.run_id, a.node
FROM unnest($1::uuid[], $2::text[], $3::text[]) AS a (run_id, node, error)
WHERE CASE WHEN a.node IS NULL
    THEN (SELECT r.state = 'failed' AND r.error = a.error::jsonb
          FROM __schema__.cyclone_runs r WHERE r.id = a.run_id)
    ELSE (SELECT s.state = 'failed' AND s.errors @> jsonb_build_array(a.error::jsonb)
          FROM __schema__.cyclone_steps s WHERE s.run_id = a.run_id AND s.node = a.node)
    END;

-- name: wait_expire_due
-- Wait nodes whose timeout passed.
SELECT run_id, node FROM __schema__.cyclone_steps
WHERE state = 'waiting' AND wait_until IS NOT NULL AND wait_until <= now()
ORDER BY wait_until LIMIT $1;

-- name: wait_expire
-- Fail one wait node whose timeout passed (its run locked by the caller).
UPDATE __schema__.cyclone_steps
SET state = 'failed', errors = errors || $3::jsonb, wait_until = NULL, finished_at = now()
WHERE run_id = $1 AND node = $2 AND state = 'waiting' AND wait_until <= now()
RETURNING run_id;

-- name: run_fail
-- Fail a pending run (locked by the caller) so that it starts nothing more: drop its
-- unclaimed tasks ($3: running ones too, whose handlers are then cancelled) and park
-- their steps; a retry releases them again.
WITH r AS (
    UPDATE __schema__.cyclone_runs SET state = 'failed', error = $2::jsonb, finished_at = now()
    WHERE id = $1 AND state = 'pending'
    RETURNING id
), doomed AS (
    SELECT t.run_id, t.id FROM __schema__.cyclone_tasks t
    WHERE t.run_id IN (SELECT id FROM r) AND (t.state = 'available' OR $3::bool)
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

-- name: run_deadline_due
SELECT id, job FROM __schema__.cyclone_runs
WHERE deadline IS NOT NULL AND deadline <= now() AND state = 'pending'
ORDER BY deadline LIMIT $1;

-- name: task_reclaim
-- Tasks whose lease expired (their worker died or stalled), attempts left: back to
-- available at once, the lost attempt recorded as an error; parked instead if their run
-- failed meanwhile, as in task_retry_many.
WITH expired AS (
    SELECT t.run_id, t.id,
           (SELECT r.state = 'pending' FROM __schema__.cyclone_runs r WHERE r.id = t.run_id)
               AS open,
           coalesce(t.worker, '?') AS lost_by,
           t.errors || jsonb_build_object(
               'attempt', t.attempt, 'type', 'LeaseExpired', 'at', now(),
               'message', 'the lease expired: worker ' || coalesce(t.worker, '?')
                          || ' stopped renewing it') AS errors
    FROM __schema__.cyclone_tasks t
    WHERE t.state = 'running' AND t.lease_until < now() AND t.attempt < t.max_attempts
    ORDER BY t.id
    LIMIT $1
    FOR UPDATE OF t SKIP LOCKED
), parked AS (
    DELETE FROM __schema__.cyclone_tasks t USING expired e
    WHERE t.run_id = e.run_id AND t.id = e.id AND NOT e.open
      AND t.run_id = ANY (ARRAY(SELECT run_id FROM expired WHERE NOT open))
    RETURNING t.id, t.run_id, t.node, t.kind, t.attempt, t.max_attempts, e.errors, e.lost_by
), park AS (
    UPDATE __schema__.cyclone_steps s
    SET state = 'pending', attempts = p.attempt, errors = p.errors
    FROM parked p
    WHERE s.run_id = p.run_id AND s.node = p.node
      AND s.run_id = ANY (ARRAY(SELECT run_id FROM parked))
), reclaimed AS (
    UPDATE __schema__.cyclone_tasks t
    SET state = 'available', available_at = now(), lease_until = NULL, worker = NULL,
        errors = e.errors
    FROM expired e
    WHERE t.run_id = e.run_id AND t.id = e.id AND e.open
      AND t.run_id = ANY (ARRAY(SELECT run_id FROM expired WHERE open))
    RETURNING t.id, t.run_id, t.node, t.kind, t.attempt, t.max_attempts, t.queue, e.lost_by
)
SELECT id, run_id, node, kind, attempt, max_attempts, queue, lost_by FROM reclaimed
UNION ALL
SELECT id, run_id, node, kind, attempt, max_attempts, NULL, lost_by FROM parked;

-- name: task_expired_exhausted
-- Tasks whose lease expired on their last attempt: the caller fails them as any last attempt.
SELECT id, claims, run_id, node, kind, queue, attempt, max_attempts, worker
FROM __schema__.cyclone_tasks
WHERE state = 'running' AND lease_until < now() AND attempt >= max_attempts
ORDER BY id LIMIT $1;

-- name: run_cancel
-- Cancel a run (locked by the caller) that is pending, or failed (a failed sequenced job
-- blocks its sequence until cancelled). Handlers of dropped tasks stop at their next heartbeat.
WITH r AS (
    UPDATE __schema__.cyclone_runs SET state = 'cancelled', finished_at = now()
    WHERE id = $1 AND state IN ('pending', 'failed')
    RETURNING id
), doomed AS (
    SELECT t.run_id, t.id FROM __schema__.cyclone_tasks t
    WHERE t.run_id IN (SELECT id FROM r) ORDER BY t.id FOR UPDATE
), dropped AS (
    DELETE FROM __schema__.cyclone_tasks t USING doomed d
    WHERE t.run_id = d.run_id AND t.id = d.id
), steps AS (
    UPDATE __schema__.cyclone_steps SET state = 'cancelled', wait_until = NULL
    WHERE run_id IN (SELECT id FROM r) AND state NOT IN ('completed', 'failed')
)
SELECT count(*)::int FROM r;

-- name: run_reopen
-- Re-open a failed run (locked by the caller), resetting its failed nodes ($2: only that
-- node) with a fresh attempt budget. The run re-opens once no failed node is left.
WITH reset AS (
    UPDATE __schema__.cyclone_steps
    SET state = 'pending', attempts = 0, finished_at = NULL
    WHERE run_id = $1 AND state = 'failed' AND ($2::text IS NULL OR node = $2)
    RETURNING node
), reopened AS (
    UPDATE __schema__.cyclone_runs r
    SET state = 'pending', error = NULL, finished_at = NULL
    WHERE r.id = $1 AND r.state = 'failed'
      AND NOT EXISTS (
          SELECT 1 FROM __schema__.cyclone_steps s
          WHERE s.run_id = $1 AND s.state = 'failed' AND s.node NOT IN (SELECT node FROM reset))
    RETURNING r.id
)
SELECT (SELECT count(*)::int FROM reset) AS reset, EXISTS (SELECT 1 FROM reopened) AS reopened;

-- name: job_reopen
-- Re-open a failed job with a fresh attempt budget (task row, then run): revive its blocking
-- task if it kept one, else queue a new task once the run re-opened.
WITH revived AS (
    UPDATE __schema__.cyclone_tasks t
    SET state = 'available', attempt = 0, available_at = now()
    WHERE t.run_id = $1 AND t.state = 'failed'
    RETURNING t.id
), r AS (
    UPDATE __schema__.cyclone_runs
    SET state = 'pending', error = NULL, finished_at = NULL, attempts = 0
    WHERE id = $1 AND state = 'failed' AND (SELECT count(*) FROM revived) >= 0
    RETURNING id, name, queue, priority, max_attempts, errors, group_key
), queued AS (
    -- The new task carries the errors of earlier attempts, so the history survives.
    INSERT INTO __schema__.cyclone_tasks
        (run_id, kind, queue, priority, max_attempts, errors, group_key)
    SELECT id, name, queue, priority, max_attempts, errors, coalesce(group_key, '') FROM r
    WHERE NOT EXISTS (SELECT 1 FROM revived)
)
SELECT queue FROM r;

-- name: job_lock
-- Lock a job's task rows, then its run (the job order), in a statement of its own before
-- one that decides on the run's state. A retry that re-opened the run and queued a new task
-- meanwhile has committed once this returns, and the next statement's snapshot sees both;
-- without it, job_end would cancel the re-opened run and miss the new task.
WITH task AS (
    SELECT id FROM __schema__.cyclone_tasks WHERE run_id = $1 ORDER BY id FOR UPDATE
)
SELECT r.state FROM __schema__.cyclone_runs r
WHERE r.id = $1 AND (SELECT count(*) FROM task) >= 0
FOR UPDATE OF r;

-- name: job_end
-- Cancel a pending or failed job, or ($2 = 'failed') fail a pending one past its deadline.
-- Its task row is handled first (a running handler stops at its next heartbeat), then the
-- run; the subqueries make the run wait for the task, keeping the job lock order. A failing
-- sequenced job keeps its task row, failed, to block its sequence as any failure does; a
-- task already failed (its last attempt failed meanwhile) is left as it is.
WITH gone AS (
    DELETE FROM __schema__.cyclone_tasks
    WHERE run_id = $1 AND ($2 = 'cancelled' OR (sequence_key IS NULL AND state <> 'failed'))
    RETURNING attempt, errors
), blocking AS (
    UPDATE __schema__.cyclone_tasks
    SET state = 'failed', lease_until = NULL, worker = NULL
    WHERE run_id = $1 AND $2 = 'failed' AND sequence_key IS NOT NULL AND state <> 'failed'
    RETURNING attempt, errors
), task AS (  -- the job's attempt record, kept on the run
    SELECT attempt, errors FROM gone UNION ALL SELECT attempt, errors FROM blocking LIMIT 1
)
UPDATE __schema__.cyclone_runs r
SET state = $2, error = $3::jsonb, finished_at = now(),
    attempts = coalesce((SELECT attempt FROM task), r.attempts),
    errors = coalesce((SELECT errors FROM task), r.errors)
WHERE r.id = $1 AND (r.state = 'pending' OR (r.state = 'failed' AND $2 = 'cancelled'))
  AND (SELECT count(*) FROM task) >= 0
RETURNING r.id;

-- name: run_unique_holder
-- The active run holding the unique key of (failed) run $1.
SELECT f.name, f.unique_key, h.id AS holder
FROM __schema__.cyclone_runs f
JOIN __schema__.cyclone_runs h
  ON h.name = f.name AND h.unique_key = f.unique_key AND h.state = 'pending'
WHERE f.id = $1;

-- name: run_kind
SELECT job, name, state FROM __schema__.cyclone_runs WHERE id = $1;

-- name: run_release
-- Queue the nodes of an open run (locked by the caller) whose dependencies are all done:
-- after a re-open. Returns the queues that got work and the signalled wait nodes.
WITH open_run AS (
    SELECT id FROM __schema__.cyclone_runs WHERE id = $1 AND state = 'pending'
), released AS (
    UPDATE __schema__.cyclone_steps s
    SET state = CASE WHEN s.kind IS NULL THEN 'waiting' ELSE 'queued' END,
        wait_until = CASE WHEN s.kind IS NULL
                          THEN now() + make_interval(secs => s.wait_timeout) END
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

-- name: wait_signal
-- Store a wait node's signal; the caller holds the run's lock. Returns the node's state.
UPDATE __schema__.cyclone_steps SET signal = $3::jsonb
WHERE run_id = $1 AND node = $2 AND kind IS NULL AND signal IS NULL
RETURNING state;

-- name: step_get
SELECT kind, signal IS NOT NULL AS signalled FROM __schema__.cyclone_steps
WHERE run_id = $1 AND node = $2;

-- name: run_status
-- The state as reported: as run_list computes it, for one run.
SELECT CASE
    WHEN r.state <> 'pending' THEN r.state
    WHEN r.remaining < r.nodes THEN 'running'
    WHEN EXISTS (SELECT 1 FROM __schema__.cyclone_tasks t
                 WHERE t.run_id = r.id AND (t.state = 'running' OR t.attempt > 0))
        THEN 'running'
    ELSE 'pending' END AS state
FROM __schema__.cyclone_runs r WHERE r.id = $1;

-- name: run_result
SELECT r.state, r.job, r.result_node, r.error::text AS error,
    CASE WHEN r.job THEN r.output::text
         ELSE (SELECT s.output::text FROM __schema__.cyclone_steps s
               WHERE s.run_id = r.id AND s.node = r.result_node) END AS output
FROM __schema__.cyclone_runs r WHERE r.id = $1;

-- name: run_payload
-- A run's input and output (a job's, or its result node's) for run.info().
SELECT r.input::text AS input,
    CASE WHEN r.job THEN r.output::text
         ELSE (SELECT s.output::text FROM __schema__.cyclone_steps s
               WHERE s.run_id = r.id AND s.node = r.result_node) END AS output
FROM __schema__.cyclone_runs r WHERE r.id = $1;

-- name: run_list
-- Newest first; keyset pagination on the time-ordered id. Every filter is optional; the
-- state filter compares the state as reported (a pending run that started is running).
SELECT r.id, r.name, r.job, r.key, r.created_at, r.finished_at, r.error::text AS error,
    live.state
FROM __schema__.cyclone_runs r
CROSS JOIN LATERAL (
    SELECT CASE
        WHEN r.state <> 'pending' THEN r.state
        WHEN r.remaining < r.nodes THEN 'running'
        WHEN EXISTS (SELECT 1 FROM __schema__.cyclone_tasks t
                     WHERE t.run_id = r.id AND (t.state = 'running' OR t.attempt > 0))
            THEN 'running'
        ELSE 'pending' END AS state
) live
WHERE ($1::uuid IS NULL OR r.id = $1)
  AND ($2::text IS NULL OR r.name = $2)
  AND ($3::text IS NULL OR r.key = $3)
  AND ($4::timestamptz IS NULL OR r.created_at >= $4)
  AND ($5::timestamptz IS NULL OR r.created_at < $5)
  AND ($6::uuid IS NULL OR r.id < $6)
  AND ($7::text[] IS NULL OR live.state = ANY ($7))
ORDER BY r.id DESC
LIMIT $8;

-- name: run_nodes
-- Each node's state, by node name: a queued node's live task tells available, scheduled or
-- running.
SELECT s.node, s.kind,
    CASE WHEN s.state <> 'queued' THEN s.state
         WHEN t.state = 'running' THEN 'running'
         WHEN t.available_at > now() THEN 'scheduled'
         ELSE 'available' END AS state,
    coalesce(t.attempt, s.attempts) AS attempts,
    coalesce(t.errors, s.errors)::text AS errors
FROM __schema__.cyclone_steps s
LEFT JOIN __schema__.cyclone_tasks t ON t.run_id = s.run_id AND t.node = s.node
WHERE s.run_id = $1
UNION ALL
SELECT r.name, r.name,
    CASE WHEN t.state = 'running' THEN 'running'
         WHEN t.state = 'failed' THEN 'failed'
         WHEN t.available_at > now() THEN 'scheduled'
         WHEN t.id IS NOT NULL THEN 'available'
         ELSE r.state END,
    coalesce(t.attempt, r.attempts), coalesce(t.errors, r.errors)::text
FROM __schema__.cyclone_runs r
LEFT JOIN __schema__.cyclone_tasks t ON t.run_id = r.id
WHERE r.id = $1 AND r.job
ORDER BY node;

-- name: run_purge
-- Delete up to $3 terminal runs in the states $2 that ended before $1, with their steps and
-- edges. SKIP LOCKED: a run being retried is left for later. A run whose node still runs
-- (a failed workflow lets running nodes finish) stays, and so does a failed sequenced job
-- that blocks its sequence until retried or cancelled. An available task of a failed run
-- (a retry that raced run_fail: see task_retry_many) goes with the run.
WITH doomed AS (
    SELECT id FROM __schema__.cyclone_runs r
    WHERE state = ANY ($2::text[]) AND state <> 'pending' AND finished_at < $1
      AND NOT EXISTS (SELECT 1 FROM __schema__.cyclone_tasks t
                      WHERE t.run_id = r.id AND t.state <> 'available')
    ORDER BY finished_at
    LIMIT $3
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

-- name: run_edges
SELECT parent, child FROM __schema__.cyclone_edges WHERE run_id = $1 ORDER BY parent, child;

-- name: stats_queues
-- Per queue: tasks by state, how long the oldest claimable task has waited, the steps
-- completed in the last minute (jobs from runs, workflow nodes from steps), and the live
-- workers claiming from it. A queue with live workers and no work has a row of zeros.
WITH live AS (
    SELECT queue,
        count(*) FILTER (WHERE state = 'available' AND available_at <= now()) AS available,
        count(*) FILTER (WHERE state = 'available' AND available_at > now()) AS scheduled,
        count(*) FILTER (WHERE state = 'running') AS running,
        count(*) FILTER (WHERE state = 'running' AND lease_until < now()) AS expired,
        count(*) FILTER (WHERE state = 'failed') AS blocking,
        extract(epoch FROM now() - min(available_at)
            FILTER (WHERE state = 'available' AND available_at <= now())) AS oldest_seconds
    FROM __schema__.cyclone_tasks GROUP BY queue
), done AS (
    SELECT queue, count(*) AS completed FROM (
        SELECT queue FROM __schema__.cyclone_runs
        WHERE job AND state = 'completed' AND finished_at > now() - interval '1 minute'
        UNION ALL
        SELECT queue FROM __schema__.cyclone_steps
        WHERE state = 'completed' AND kind IS NOT NULL
          AND finished_at > now() - interval '1 minute'
    ) f GROUP BY queue
), served AS (
    SELECT q AS queue, count(*) AS workers
    FROM __schema__.cyclone_workers w, unnest(w.queues) AS q
    WHERE w.expires_at > now()
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
-- A worker serves a task by the rules of task_claim: its queue, its kind and, for a node,
-- its workflow (the same test as run_unserved). Tasks are grouped before the workers are
-- consulted, so the cost is one pass over the claimable tasks; a node's workflow is read
-- by key, run by run, never by scanning the run history.
WITH claimable AS (
    SELECT t.queue, t.kind,
        CASE WHEN t.node IS NOT NULL THEN
            (SELECT r.name FROM __schema__.cyclone_runs r WHERE r.id = t.run_id)
        END AS workflow,
        count(*)::int AS count
    FROM __schema__.cyclone_tasks t
    WHERE t.state = 'available' AND t.available_at <= now()
    GROUP BY 1, 2, 3
)
SELECT c.queue, c.kind, c.workflow, c.count FROM claimable c
WHERE NOT EXISTS (
    SELECT 1 FROM __schema__.cyclone_workers w
    WHERE w.expires_at > now() AND c.queue = ANY (w.queues) AND c.kind = ANY (w.kinds)
      AND (c.workflow IS NULL OR c.workflow = ANY (w.workflows)))
ORDER BY 1, 2, 3;

-- name: run_unserved
-- A run's claimable tasks that no live worker serves (the test of stats_unserved), to say
-- what a run.wait() that timed out was waiting for.
SELECT t.node, t.kind, t.queue
FROM __schema__.cyclone_tasks t
JOIN __schema__.cyclone_runs r ON r.id = t.run_id
WHERE t.run_id = $1 AND t.state = 'available' AND t.available_at <= now()
  AND NOT EXISTS (
    SELECT 1 FROM __schema__.cyclone_workers w
    WHERE w.expires_at > now() AND t.queue = ANY (w.queues) AND t.kind = ANY (w.kinds)
      AND (t.node IS NULL OR r.name = ANY (w.workflows)))
ORDER BY t.id;

-- name: worker_present
-- Record this worker as live for $7 more seconds, with what it claims, and delete the rows
-- of other workers that expired (died or stalled): one statement per heartbeat. No WAL
-- flush wait: a row lost in a crash is written again by the next heartbeat.
WITH async_commit AS (
    SELECT set_config('synchronous_commit', 'off', true)
), swept AS (
    DELETE FROM __schema__.cyclone_workers WHERE expires_at < now() AND id <> $1
)
INSERT INTO __schema__.cyclone_workers AS w
    (id, host, pid, queues, kinds, workflows, expires_at)
SELECT $1, $2, $3, $4::text[], $5::text[], $6::text[], now() + make_interval(secs => $7)
FROM async_commit
ON CONFLICT (id) DO UPDATE
SET seen_at = now(), expires_at = excluded.expires_at, queues = excluded.queues,
    kinds = excluded.kinds, workflows = excluded.workflows;

-- name: worker_leave
-- A worker stopping gracefully removes its row.
DELETE FROM __schema__.cyclone_workers WHERE id = $1;

-- name: worker_list
-- The live workers, newest first; the few rows of a table swept by every heartbeat.
SELECT id, host, pid, queues, kinds, workflows, started_at, seen_at
FROM __schema__.cyclone_workers
WHERE expires_at >= now()
ORDER BY started_at DESC, id;

-- name: wakeup_notify
-- One NOTIFY per payload, sent by Cyclone on its own connection, never in a caller's
-- transaction. Its commit need not wait for the WAL flush: a notification is a hint that
-- no crash has to keep, and the server serializes notifying commits until they are done.
SELECT pg_notify($1, p)
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit,
     unnest($2::text[]) AS p;
