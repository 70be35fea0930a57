-- Claiming work: a worker takes available tasks of a queue (within its flow control) and
-- keeps them by heartbeats. A task is owned by the attempt that claimed it, named by
-- (task id, claims); every later write to it is fenced by that pair (owned_tasks).

-- fragment: owned_tasks
-- The task of each attempt c (run_id, id, claims), locked, while c still owns it: running
-- under the same claim count; a task reclaimed or cancelled meanwhile matches nothing. One
-- by one in a LATERAL subquery with FOR UPDATE: a nested loop over the keys, in c's order
-- (task-id order, so that two batches lock their common tasks in the same order).
CROSS JOIN LATERAL (
    SELECT t.run_id, t.id, t.errors FROM __schema__.cyclone_tasks t
    WHERE t.run_id = c.run_id AND t.id = c.id AND t.claims = c.claims
      AND t.state = 'running'
    FOR UPDATE
) t

-- fragment: sequence_turn
-- Task t's turn in its sequence: no earlier task of the sequence is live (the sequence's
-- rows are its live tasks: available, running, or failed and blocking it).
(t.sequence_key IS NULL OR NOT EXISTS (
    SELECT 1 FROM __schema__.cyclone_tasks h
    WHERE h.kind = t.kind AND h.sequence_key = t.sequence_key AND h.id < t.id))

-- fragment: unexpired
-- Task t has not expired: a job past its expires_at never starts; the maintenance sweep
-- (job_expire) ends it. A test of the row already read, so a task without an expiry costs
-- the claim nothing more.
(t.expires_at IS NULL OR t.expires_at > __now__)

-- fragment: running_by_lease
-- Task r is running, in a form the lease index serves (running tasks only have a lease): the
-- state is said too, so that a plan without statistics does not take every task for running.
r.state = 'running' AND r.lease_until BETWEEN '-infinity' AND 'infinity'

-- fragment: bucket_tokens
-- The tokens in the rate bucket of the one queue or kind row in scope (its columns named
-- bare): what it held at refilled_at, refilled evenly at rate per per seconds since, up to
-- rate. The claim spends them; node_explain tells when the next one is due.
least(rate, tokens + greatest(0, extract(epoch FROM __now__ - refilled_at)) * rate / per)

-- fragment: claim_chosen
-- Claim the tasks of CTE chosen (run_id, id), each locked by the statement already: running
-- under a lease, its attempt and claim count bumped (the claim count fences every later
-- write of this attempt), with what the worker needs to run it. A started job no longer
-- expires (its expiry goes): a retry of it waits in the queue as long as it must.
UPDATE __schema__.cyclone_tasks t
SET state = 'running', attempt = t.attempt + 1, claims = t.claims + 1,
    lease_until = __now__ + make_interval(secs => :lease), worker = :worker,
    started_at = __now__, expires_at = NULL
FROM chosen, async_commit
WHERE t.run_id = chosen.run_id AND t.id = chosen.id
  AND t.run_id = ANY (ARRAY(SELECT run_id FROM chosen))
RETURNING t.id, t.run_id, t.node, t.kind, t.attempt, t.max_attempts, t.claims, t.group_key,
    -- The claimed tasks' runs, by key again (one read for the three columns); an item
    -- node's task carries its own input.
    (SELECT ARRAY[r.name, coalesce(t.input, r.input)::text, r.trace::text]
     FROM __schema__.cyclone_runs r WHERE r.id = t.run_id) AS run,
    -- The outputs of its parents that completed (a skipped one has none).
    (SELECT jsonb_object_agg(e.parent, s.output)::text
     FROM __schema__.cyclone_edges e
     JOIN __schema__.cyclone_steps s ON s.run_id = e.run_id AND s.node = e.parent
     WHERE e.run_id = t.run_id AND e.child = t.node AND s.state = 'completed') AS deps

-- name: task_claim(queue, kinds, limit, lease, worker, workflows)
-- Claim up to :limit available tasks of one queue for kinds this worker serves. SKIP LOCKED
-- lets workers claim side by side; a sequenced task is claimable only in its turn
-- (sequence_turn). The claim commits without waiting for its WAL flush: a claim lost in a
-- crash only makes the task available again, which is what a crash does to it anyway.
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
-- Running tasks are counted through the lease index (running_by_lease), and only when a
-- limit or the turns need them. A per-key rate counts each key's starts in its window
-- from cyclone_key_starts, which the same claims write and prune under the same lock. The
-- claims' clocks (now(): when each transaction began) need not follow their lock order: a
-- claim that began before another committed may take its snapshot after it. Starts are
-- therefore pruned a second after they leave the window, so that a claim whose clock is up
-- to a second behind the last one's still counts every start in its own window.
-- After the tasks, one row with a NULL id may follow. When a limit held the claim back, its
-- retry_in is how many seconds until it can start more (0: at once; NULL: when a task ends).
-- When the queue uses no flow control in this snapshot (what task_claim_plain checks), its
-- plain is true: the claims after this one can be the plain claim's.
WITH async_commit AS (
    SELECT set_config('synchronous_commit', 'off', true)
), seen AS MATERIALIZED (  -- the queue's row in this statement's snapshot; none: no limits
    SELECT q.paused, q.version,
        q.concurrency IS NOT NULL OR q.rate IS NOT NULL OR q.key_concurrency IS NOT NULL
            OR q.key_rate IS NOT NULL AS limited
    FROM __schema__.cyclone_queues q WHERE q.queue = :queue
), gate AS MATERIALIZED (  -- a limited queue's row, locked: its newest version
    SELECT q.version, q.concurrency, q.key_concurrency, q.rate, q.per, q.key_rate, q.key_per,
        /* fragment: bucket_tokens */ AS tokens
    FROM __schema__.cyclone_queues q
    WHERE q.queue = :queue AND (SELECT s.limited AND NOT s.paused FROM seen s)
    FOR NO KEY UPDATE
), kind_seen AS MATERIALIZED (  -- the limited kinds among those served, in the snapshot
    SELECT k.kind, k.version FROM __schema__.cyclone_kind_limits k
    WHERE k.kind = ANY (:kinds::text[]) AND (k.concurrency IS NOT NULL OR k.rate IS NOT NULL)
      AND NOT coalesce((SELECT s.paused FROM seen s), false)
), kind_gate AS MATERIALIZED (  -- their rows, locked in kind order (after the queue's)
    SELECT k.kind, k.version, k.concurrency, k.rate, k.per,
        /* fragment: bucket_tokens */ AS tokens
    FROM __schema__.cyclone_kind_limits k
    WHERE k.kind = ANY (ARRAY(SELECT kind FROM kind_seen))
      -- Lock order: the queue's row before the kinds' rows. Always true, this count cannot
      -- be decided before gate has been read, and so has locked the queue's row.
      AND (SELECT count(*) FROM gate) >= 0
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
                   WHERE /* fragment: running_by_lease */ AND r.kind = g.kind) END,
            floor(g.tokens)))::int AS free
    FROM kind_gate g
), allow AS MATERIALIZED (  -- what the queue may start now: none if paused or stale
    SELECT CASE WHEN coalesce((SELECT s.paused FROM seen s), false) OR (SELECT stale FROM stale)
        THEN 0
        ELSE greatest(0, least(:limit,
            (SELECT CASE WHEN g.concurrency IS NOT NULL THEN g.concurrency
                 - (SELECT count(*) FROM __schema__.cyclone_tasks r
                    WHERE /* fragment: running_by_lease */ AND r.queue = :queue) END
             FROM gate g),
            (SELECT floor(g.tokens) FROM gate g)))::int
        END AS n
), keyed AS MATERIALIZED (  -- the first group key with available tasks, if any: one probe
    SELECT t.group_key AS key FROM __schema__.cyclone_tasks t
    WHERE t.state = 'available' AND t.queue = :queue AND t.group_key > ''
      AND (SELECT n FROM allow) > 0
    ORDER BY t.group_key LIMIT 1
), keys AS MATERIALIZED (  -- the keys with available tasks: one claim index probe each
    WITH RECURSIVE k (key) AS (
        (SELECT t.group_key FROM __schema__.cyclone_tasks t
         WHERE t.state = 'available' AND t.queue = :queue AND EXISTS (SELECT 1 FROM keyed)
         ORDER BY t.group_key LIMIT 1)
        UNION ALL
        SELECT (SELECT t.group_key FROM __schema__.cyclone_tasks t
                WHERE t.state = 'available' AND t.queue = :queue AND t.group_key > k.key
                ORDER BY t.group_key LIMIT 1)
        FROM k WHERE k.key IS NOT NULL
    )
    SELECT key FROM k WHERE key IS NOT NULL
    UNION ALL  -- a queue without keyed work: its one group, without looking further
    SELECT '' WHERE (SELECT n FROM allow) > 0 AND NOT EXISTS (SELECT 1 FROM keyed)
), running AS MATERIALIZED (  -- the queue's running tasks by key, if the turns need them
    SELECT r.group_key AS key, count(*) AS n FROM __schema__.cyclone_tasks r
    WHERE /* fragment: running_by_lease */ AND r.queue = :queue
      AND ((SELECT count(*) FROM keys) > 1
           OR (SELECT g.key_concurrency FROM gate g) IS NOT NULL)
    GROUP BY r.group_key
), recent AS MATERIALIZED (  -- each key's starts in its rate's window, if it has one
    SELECT s.group_key AS key, count(*) AS n, min(s.at) AS oldest
    FROM __schema__.cyclone_key_starts s
    WHERE s.queue = :queue AND (SELECT g.key_rate FROM gate g) IS NOT NULL
      AND s.at > __now__ - make_interval(secs => (SELECT g.key_per FROM gate g))
    GROUP BY s.group_key
), room AS MATERIALIZED (  -- each key's running tasks, and what its own limits leave
    SELECT k.key, coalesce(r.n, 0) AS running,
        CASE WHEN k.key <> '' THEN least(g.key_concurrency - coalesce(r.n, 0),
                                         g.key_rate - coalesce(s.n, 0)) END AS free,
        CASE WHEN k.key <> '' AND s.n >= g.key_rate  -- until its oldest start leaves
            THEN extract(epoch FROM s.oldest + make_interval(secs => g.key_per) - __now__)
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
        SELECT * FROM (
            SELECT t.run_id, t.id, t.kind, t.priority, t.available_at
            FROM __schema__.cyclone_tasks t
            WHERE t.state = 'available' AND t.queue = :queue AND t.group_key = u.key
              AND t.available_at <= __now__ AND t.kind = ANY (:kinds::text[])
              AND /* fragment: unexpired */
              -- A failed run starts nothing more, not even a node whose attempt failed or
              -- whose lease expired after the run failed; retry_all re-opens the run and so
              -- the task. A node's input may need its workflow's input function: only
              -- workers that know the workflow take its nodes.
              AND (SELECT r.state = 'pending'
                          AND (t.node IS NULL OR r.name = ANY (:workflows::text[]))
                   FROM __schema__.cyclone_runs r WHERE r.id = t.run_id)
              AND /* fragment: sequence_turn */
            ORDER BY t.priority DESC, t.available_at, t.id
            -- CLAIM_MAX (cyclone/_storage/queries/claim.py), a constant: the planner costs this scan
            -- for at most that many rows. Under a limit it cannot know (the share below) it
            -- costs a tenth of every available task, so that a backlog of 50,000 crossed
            -- PostgreSQL's jit_above_cost and every claim was compiled (0.8 ms became 124).
            LIMIT 1000
            FOR UPDATE OF t SKIP LOCKED  -- only the rows the share below takes are locked
        ) c
        LIMIT least(u.free, ceil((SELECT n FROM allow)::float8 / (SELECT count(*) FROM turns)))
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
), unused AS MATERIALIZED (  -- no flow control in use: not paused, unlimited, no keyed work
    SELECT NOT coalesce((SELECT s.paused OR s.limited FROM seen s), false)
        AND NOT EXISTS (SELECT 1 FROM kind_seen) AND NOT EXISTS (SELECT 1 FROM keyed) AS plain
), claimed AS (
    /* fragment: claim_chosen */
), counted AS (  -- a limited queue's row: a new version, the bucket less what started
    UPDATE __schema__.cyclone_queues q
    SET version = q.version + 1, refilled_at = __now__,
        tokens = CASE WHEN q.rate IS NOT NULL THEN g.tokens - c.n ELSE 0 END
    FROM gate g, (SELECT count(*) AS n FROM claimed) c
    WHERE q.queue = :queue AND c.n > 0
    RETURNING q.rate, q.per, q.tokens
), logged AS (  -- a per-key rate's starts, and the end of those out of every window
    INSERT INTO __schema__.cyclone_key_starts (queue, group_key, at)
    SELECT :queue, c.group_key, __now__ FROM claimed c, gate g
    WHERE g.key_rate IS NOT NULL AND c.group_key <> ''
), pruned AS (  -- a second after they leave the window: see below
    DELETE FROM __schema__.cyclone_key_starts s
    WHERE s.queue = :queue AND (SELECT g.key_rate FROM gate g) IS NOT NULL
      AND s.at <= __now__ - make_interval(secs => (SELECT g.key_per FROM gate g) + 1)
), kinds_counted AS (  -- likewise for each limited kind that started work
    UPDATE __schema__.cyclone_kind_limits k
    SET version = k.version + 1, refilled_at = __now__,
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
    WHERE (SELECT count(*) FROM claimed) < :limit
      AND ((SELECT stale FROM stale) OR EXISTS (SELECT 1 FROM gate)
           OR EXISTS (SELECT 1 FROM kind_gate)
           OR ((SELECT count(*) FROM turns) > 1 AND (SELECT count(*) FROM claimed) > 0))
)
SELECT id, run_id, node, kind, attempt, max_attempts, claims,
    run[1] AS name, run[2] AS input, run[3] AS trace, deps, NULL::float8 AS retry_in,
    NULL::bool AS plain
FROM claimed
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, retry_in, false
FROM held
UNION ALL  -- never beside a row of held: a limit, a pause or keyed work is flow control
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, true
FROM unused WHERE plain;

-- name: task_claim_plain(queue, kinds, limit, lease, worker, workflows)
-- task_claim for a queue whose flow control is not in use, which is most queues: not paused,
-- no limit on it or on a kind served, no keyed work available. Then task_claim would take
-- the first :limit tasks of the one group '' in claim order, which this does with a third of
-- the executor's work (the turns, shares and counts are what cost). If any of that is in use
-- in this statement's snapshot, it claims nothing and returns one row with a NULL id: the
-- caller then claims with task_claim. A change of limits that commits during the claim is
-- not seen by it, as for task_claim, which reads an unlimited queue's row unlocked too.
--
-- The scan stops at CLAIM_MAX rows as in task_claim, and the limit is a subquery: the
-- planner estimates a custom plan like the generic one, so the plan cache settles on the
-- generic plan instead of planning every claim afresh (which took longer than running it).
WITH async_commit AS (
    SELECT set_config('synchronous_commit', 'off', true)
), plain AS MATERIALIZED (
    SELECT NOT EXISTS (
            SELECT 1 FROM __schema__.cyclone_queues q
            WHERE q.queue = :queue
              AND (q.paused OR q.concurrency IS NOT NULL OR q.rate IS NOT NULL
                   OR q.key_concurrency IS NOT NULL OR q.key_rate IS NOT NULL))
        AND NOT EXISTS (
            SELECT 1 FROM __schema__.cyclone_kind_limits k
            WHERE k.kind = ANY (:kinds::text[])
              AND (k.concurrency IS NOT NULL OR k.rate IS NOT NULL))
        AND (  -- task_claim's probe for keyed work: by the claim index's order, one probe
            SELECT t.group_key FROM __schema__.cyclone_tasks t
            WHERE t.state = 'available' AND t.queue = :queue AND t.group_key > ''
            ORDER BY t.group_key LIMIT 1) IS NULL AS ok
), chosen AS MATERIALIZED (
    SELECT c.run_id, c.id FROM (
        SELECT t.run_id, t.id
        FROM __schema__.cyclone_tasks t
        WHERE t.state = 'available' AND t.queue = :queue AND t.group_key = ''
          AND t.available_at <= __now__ AND t.kind = ANY (:kinds::text[])
          AND /* fragment: unexpired */
          AND (SELECT r.state = 'pending' AND (t.node IS NULL OR r.name = ANY (:workflows::text[]))
               FROM __schema__.cyclone_runs r WHERE r.id = t.run_id)
          AND /* fragment: sequence_turn */
          AND (SELECT ok FROM plain)
        ORDER BY t.priority DESC, t.available_at, t.id
        LIMIT 1000
        FOR UPDATE OF t SKIP LOCKED  -- only the rows the limit below takes are locked
    ) c
    LIMIT (SELECT :limit::int)
), claimed AS (
    /* fragment: claim_chosen */
)
SELECT id, run_id, node, kind, attempt, max_attempts, claims,
    run[1] AS name, run[2] AS input, run[3] AS trace, deps
FROM claimed
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
WHERE NOT (SELECT ok FROM plain);

-- name: task_heartbeat(run_ids, ids, claims, lease)
-- Extend the leases of tasks this worker still owns; a task missing from the result was
-- cancelled or reclaimed, and its handler must stop. No WAL flush wait, as for claims.
WITH async_commit AS (
    SELECT set_config('synchronous_commit', 'off', true)
), mine AS (
    SELECT t.run_id, t.id
    FROM (SELECT * FROM unnest(:run_ids::uuid[], :ids::bigint[], :claims::int[])
              AS c (run_id, id, claims)
          ORDER BY c.id) c
    /* fragment: owned_tasks */
)
UPDATE __schema__.cyclone_tasks t SET lease_until = __now__ + make_interval(secs => :lease)
FROM mine, async_commit
WHERE t.run_id = mine.run_id AND t.id = mine.id
  AND t.run_id = ANY (ARRAY(SELECT run_id FROM mine))
RETURNING t.id, t.claims;

-- name: task_pending_work(kinds, workflows)
-- Whether a worker serving :kinds and :workflows has work running, or claimable now by the
-- rules of task_claim (for draining in tests); runs are read by key, as there.
SELECT EXISTS (
    SELECT 1 FROM __schema__.cyclone_tasks t
    WHERE t.kind = ANY (:kinds::text[])
      AND (t.state = 'running'
           OR (t.state = 'available' AND t.available_at <= __now__
               AND /* fragment: unexpired */ AND /* fragment: sequence_turn */))
      AND (SELECT (t.state = 'running' OR r.state = 'pending')
                  AND (t.node IS NULL OR r.name = ANY (:workflows::text[]))
           FROM __schema__.cyclone_runs r WHERE r.id = t.run_id)
);

