-- Why a run's work is not running (client.explain): the facts each open node's reason is
-- told from. Read-only and by key, never a scan of the history: the run's steps, edges and
-- tasks by its id; for a claimable task, its queue's and kind's rows, the live workers (a
-- few rows) and the running tasks through the lease index (running tasks only, as many as
-- the workers' slots), as the claim counts them (claim.sql).

-- fragment: bucket_due
-- When the rate bucket b (rate, per, tokens: bucket_tokens) holds a whole token again;
-- NULL while it holds one.
CASE WHEN b.tokens < 1 THEN __now__ + make_interval(secs => (1 - b.tokens) * b.per / b.rate) END

-- name: node_explain(run_id, limit)
-- Each node of pending run :run_id that is not done (a job's one node, named after its
-- kind), at most :limit of them in run_nodes' order, and how many there are (open). A map's
-- item not released yet is left out: its map node, waiting on its items, tells of it.
WITH run AS MATERIALIZED (
    SELECT r.id, r.name, r.job, r.queue, r.created_at FROM __schema__.cyclone_runs r
    WHERE r.id = :run_id AND r.state = 'pending'
), n AS MATERIALIZED (  -- the open nodes, each with its task if it has one
    SELECT n.*, t.id AS task_id, t.state AS task_state, t.priority, t.group_key,
        t.sequence_key, t.available_at, t.attempt, t.max_attempts, t.worker, t.lease_until,
        t.started_at, (t.errors -> -1)::text AS last_error,
        t.state = 'available' AND t.available_at <= __now__ AS claimable,
        count(*) OVER () AS open
    FROM (
        SELECT run.name AS node, run.name AS kind, 'queued' AS state, NULL::text AS map_of,
            NULL::int AS item, NULL::uuid AS child_run, NULL::timestamptz AS wait_until,
            NULL::int AS items, NULL::int AS items_left, run.queue, NULL::text AS workflow
        FROM run WHERE run.job
        UNION ALL
        SELECT s.node, s.kind, s.state, s.map_of, s.item, s.child_run, s.wait_until, s.items,
            s.items_left, s.queue, run.name
        FROM run JOIN __schema__.cyclone_steps s ON s.run_id = run.id
        WHERE NOT run.job AND s.state IN ('pending', 'queued', 'waiting')
          AND NOT (s.map_of IS NOT NULL AND s.state = 'pending')
    ) n
    LEFT JOIN LATERAL (  -- a job's task has no node; a node's task has its name
        SELECT * FROM __schema__.cyclone_tasks t
        WHERE t.run_id = :run_id AND (t.node = n.node OR (t.node IS NULL AND n.workflow IS NULL))
    ) t ON true
    WHERE n.state <> 'queued' OR t.id IS NOT NULL
    ORDER BY coalesce(n.map_of, n.node), n.item NULLS FIRST, n.node
    LIMIT :limit
)
SELECT c.node, c.kind, c.state, c.queue, c.workflow, c.open, c.task_state, c.claimable,
    c.available_at, c.attempt, c.max_attempts, c.last_error, c.worker, c.lease_until,
    c.lease_until < __now__ AS lease_expired, c.started_at,
    c.group_key, c.child_run, c.wait_until, c.items, c.items_left,
    -- pending: its parents not done yet
    CASE WHEN c.state = 'pending' THEN ARRAY(
        SELECT e.parent FROM __schema__.cyclone_edges e
        JOIN __schema__.cyclone_steps p ON p.run_id = e.run_id AND p.node = e.parent
        WHERE e.run_id = :run_id AND e.child = c.node AND p.state NOT IN ('completed', 'skipped')
        ORDER BY e.parent) END AS parents,
    -- waiting: since its last parent ended (the run's creation for a root node)
    CASE WHEN c.state = 'waiting' THEN coalesce(
        (SELECT max(p.finished_at) FROM __schema__.cyclone_edges e
         JOIN __schema__.cyclone_steps p ON p.run_id = e.run_id AND p.node = e.parent
         WHERE e.run_id = :run_id AND e.child = c.node),
        (SELECT run.created_at FROM run)) END AS waiting_since,
    (SELECT /* fragment: reported_state */ FROM __schema__.cyclone_runs r
     WHERE r.id = c.child_run) AS child_state,
    w.host, w.pid, w.queues, w.kinds, w.workflows, w.worker_started_at, w.seen_at, w.live,
    w.held, w.release_at,
    f.paused, f.served, f.queue_concurrency, f.queue_running, f.kind_concurrency,
    f.kind_running, f.key_concurrency, f.key_running, f.queue_rate, f.queue_per,
    f.queue_rate_until, f.kind_rate, f.kind_per, f.kind_rate_until, f.key_rate, f.key_per,
    f.key_rate_until, f.ahead, h.holders, s.blocker, s.blocker_state
FROM n c
LEFT JOIN LATERAL (  -- running: its worker's presence row, if it is still there
    SELECT w.host, w.pid, w.queues, w.kinds, w.workflows, w.started_at AS worker_started_at,
        w.seen_at, w.expires_at >= __now__ AS live,
        -- Its liveness lock held (lock_free, maintenance.sql); NULL: the worker names no
        -- lock, and its tasks wait for their leases.
        CASE WHEN w.liveness IS NOT NULL THEN NOT /* fragment: lock_free */ END AS held,
        -- With its lock free, its peers release its tasks once the lock has stayed free for
        -- its grace since one of them first saw it free; at once without a grace.
        coalesce(w.lock_free_since, __now__) + make_interval(secs => coalesce(w.grace, 0))
            AS release_at
    FROM __schema__.cyclone_workers w
    WHERE w.id = c.worker AND c.task_state = 'running'
) w ON true
LEFT JOIN LATERAL (  -- claimable now: what the claim would hold it back by
    SELECT coalesce(q.paused, false) AS paused, /* fragment: served */ AS served,
        q.concurrency AS queue_concurrency,
        CASE WHEN q.concurrency IS NOT NULL THEN (
            SELECT count(*) FROM __schema__.cyclone_tasks r
            WHERE /* fragment: running_by_lease */ AND r.queue = c.queue) END AS queue_running,
        k.concurrency AS kind_concurrency,
        CASE WHEN k.concurrency IS NOT NULL THEN (
            SELECT count(*) FROM __schema__.cyclone_tasks r
            WHERE /* fragment: running_by_lease */ AND r.kind = c.kind) END AS kind_running,
        CASE WHEN c.group_key <> '' THEN q.key_concurrency END AS key_concurrency,
        CASE WHEN c.group_key <> '' AND q.key_concurrency IS NOT NULL THEN (
            SELECT count(*) FROM __schema__.cyclone_tasks r
            WHERE /* fragment: running_by_lease */ AND r.queue = c.queue
              AND r.group_key = c.group_key) END AS key_running,
        q.rate AS queue_rate, q.per AS queue_per,
        (SELECT /* fragment: bucket_due */
         FROM (SELECT rate, per, /* fragment: bucket_tokens */ AS tokens
               FROM __schema__.cyclone_queues WHERE queue = c.queue AND rate IS NOT NULL) b
        ) AS queue_rate_until,
        k.rate AS kind_rate, k.per AS kind_per,
        (SELECT /* fragment: bucket_due */
         FROM (SELECT rate, per, /* fragment: bucket_tokens */ AS tokens
               FROM __schema__.cyclone_kind_limits WHERE kind = c.kind AND rate IS NOT NULL) b
        ) AS kind_rate_until,
        CASE WHEN c.group_key <> '' THEN q.key_rate END AS key_rate, q.key_per,
        -- A key at its rate: until its oldest start in the window leaves it, as the claim says.
        CASE WHEN c.group_key <> '' AND q.key_rate IS NOT NULL THEN (
            SELECT CASE WHEN count(*) >= q.key_rate
                   THEN min(s.at) + make_interval(secs => q.key_per) END
            FROM __schema__.cyclone_key_starts s
            WHERE s.queue = c.queue AND s.group_key = c.group_key
              AND s.at > __now__ - make_interval(secs => q.key_per)) END AS key_rate_until,
        -- The claimable tasks of its group that a worker serves and that the claim takes
        -- before it (priority, then age), counted up to 1000: each part a range of the
        -- claim index, so that a long backlog behind it is never read.
        (SELECT count(*) FROM (
            SELECT a.queue, a.kind,
                CASE WHEN a.node IS NOT NULL THEN (
                    SELECT x.name FROM __schema__.cyclone_runs x WHERE x.id = a.run_id) END
                    AS workflow
            FROM (
                (SELECT a.run_id, a.node, a.queue, a.kind FROM __schema__.cyclone_tasks a
                 WHERE a.state = 'available' AND a.queue = c.queue
                   AND a.group_key = c.group_key AND a.priority > c.priority
                   AND a.available_at <= __now__
                 LIMIT 1000)
                UNION ALL
                (SELECT a.run_id, a.node, a.queue, a.kind FROM __schema__.cyclone_tasks a
                 WHERE a.state = 'available' AND a.queue = c.queue
                   AND a.group_key = c.group_key AND a.priority = c.priority
                   AND (a.available_at, a.id) < (c.available_at, c.task_id)
                 LIMIT 1000)
            ) a
            LIMIT 1000
         ) c WHERE /* fragment: served */) AS ahead
    FROM (SELECT) one
    LEFT JOIN __schema__.cyclone_queues q ON q.queue = c.queue
    LEFT JOIN __schema__.cyclone_kind_limits k ON k.kind = c.kind
    WHERE c.claimable
) f ON true
LEFT JOIN LATERAL (  -- claimable but sequenced: the first live task of its sequence before it
    SELECT h.run_id AS blocker, h.state AS blocker_state FROM __schema__.cyclone_tasks h
    WHERE c.claimable AND h.kind = c.kind AND h.sequence_key = c.sequence_key
      AND h.id < c.task_id
    ORDER BY h.id LIMIT 1
) s ON true
LEFT JOIN LATERAL (  -- the runs whose running tasks hold the first full concurrency limit
    SELECT ARRAY(
        SELECT r.run_id FROM __schema__.cyclone_tasks r
        WHERE /* fragment: running_by_lease */
          AND CASE WHEN f.queue_running >= f.queue_concurrency THEN r.queue = c.queue
                   WHEN f.kind_running >= f.kind_concurrency THEN r.kind = c.kind
                   ELSE r.queue = c.queue AND r.group_key = c.group_key END
        ORDER BY r.id LIMIT 10) AS holders
    WHERE f.queue_running >= f.queue_concurrency OR f.kind_running >= f.kind_concurrency
       OR f.key_running >= f.key_concurrency
) h ON true
ORDER BY coalesce(c.map_of, c.node), c.item NULLS FIRST, c.node;
