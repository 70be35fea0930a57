-- Advancing workflow runs. A transition of a run decides on the run's state, so it first
-- locks the run rows (run_lock_many, in a statement of its own), then touches tasks and
-- steps: a completed node counts its children down and releases those left with none
-- (their tasks queued in the same transaction), wait nodes waiting (waits.sql); a run
-- fails (parking what it has not started) or re-opens.

-- name: run_lock_many(run_ids)
-- Lock runs, and the runs they are children of, in id order: the first lock of every
-- multi-row transition of workflow runs (see the lock order in README.md). In a statement of
-- its own, so that the next statement's snapshot sees every commit made before the lock was
-- granted. (parent_run never changes, so it can be read before the lock.)
WITH RECURSIVE up (id) AS (
    SELECT unnest(:run_ids::uuid[])
    UNION
    SELECT r.parent_run FROM up
    CROSS JOIN LATERAL (
        SELECT r.parent_run FROM __schema__.cyclone_runs r WHERE r.id = up.id
        OFFSET 0
    ) r
    WHERE r.parent_run IS NOT NULL
)
SELECT id, state FROM __schema__.cyclone_runs
WHERE id = ANY (ARRAY(SELECT id FROM up)) ORDER BY id FOR UPDATE;

-- name: node_advance(run_ids, nodes, skipped)
-- After nodes completed or were skipped (:skipped; runs locked by the caller, so their states
-- are current): count down each child's dependencies and the edges not taken to it (a
-- skipped parent takes none; a conditional edge is taken only on its parent's output), and
-- release the children left with none while the run is open: skipped when their join says
-- so (all: an edge was not taken; any: none was), else a wait node waits, a map node waits
-- for its expansion (the caller's map_expand), and a step node is queued. Count the run down
-- and complete it at zero. Returns the queues that got work, signalled wait nodes that
-- became reachable, map nodes to expand and skipped nodes (the caller handles them and
-- advances again), and runs that ended (node 'child' for a child run, whose parent node the
-- caller settles).
WITH done AS (
    SELECT * FROM unnest(:run_ids::uuid[], :nodes::text[], :skipped::bool[])
        AS d (run_id, node, skipped)
), released AS (
    UPDATE __schema__.cyclone_steps c
    SET pending_deps = c.pending_deps - x.n,
        skips = c.skips + x.untaken,
        state = CASE WHEN c.pending_deps > x.n OR NOT x.open THEN c.state
                     WHEN CASE WHEN c.spec->>'join' = 'any'
                               THEN c.skips + x.untaken = (c.spec->>'parents')::int
                               ELSE c.skips + x.untaken > 0 END THEN 'skipped'
                     WHEN c.kind IS NULL OR c.spec ? 'map' THEN 'waiting'
                     ELSE 'queued' END,
        wait_until = CASE WHEN c.pending_deps = x.n AND x.open AND c.kind IS NULL
                          THEN __now__ + make_interval(secs => c.wait_timeout) END
    FROM (
        SELECT e.run_id, e.child, count(*)::int AS n,
               count(*) FILTER (WHERE NOT e.taken)::int AS untaken,
               bool_and((SELECT r.state = 'pending' FROM __schema__.cyclone_runs r
                         WHERE r.id = d.run_id)) AS open
        FROM done d
        -- Each completed node's edges by key, one look-up per node (OFFSET 0 keeps the
        -- subquery from being flattened into a join): as a join, the planner rated a hash
        -- join over a scan of every edge in the history cheaper than the look-ups (with
        -- 20,000 finished runs, 7 of the statement's 14 ms for 100 nodes). The children
        -- are then updated by key alone: an anchor on the batch's runs here was scanned
        -- once per child, which made a batch cost its square. The parent's output is read
        -- only for a conditional edge.
        CROSS JOIN LATERAL (
            SELECT e.run_id, e.child,
                   NOT d.skipped AND (e.cond IS NULL OR e.cond = (
                       -- a wait node for any of several events: the event's name
                       SELECT CASE WHEN NOT (p.spec->'events'->>'all')::bool
                                   THEN p.output->'name' ELSE p.output END
                       FROM __schema__.cyclone_steps p
                       WHERE p.run_id = d.run_id AND p.node = d.node)) AS taken
            FROM __schema__.cyclone_edges e
            WHERE e.run_id = d.run_id AND e.parent = d.node
            OFFSET 0
        ) e
        GROUP BY e.run_id, e.child
    ) x
    WHERE c.run_id = x.run_id AND c.node = x.child
    RETURNING c.run_id, c.node, c.kind, c.queue, c.priority, c.max_attempts, c.state,
              c.pending_deps, c.spec ? 'map' AS map, c.signal IS NOT NULL AS signalled
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
    RETURNING r.id, r.state, r.parent_run IS NOT NULL AS child
)
SELECT 'queue' AS what, queue AS value, NULL::uuid AS run_id, NULL::text AS node
FROM released WHERE state = 'queued' AND pending_deps = 0
UNION ALL
SELECT CASE WHEN state = 'skipped' THEN 'skipped'
            WHEN map THEN 'map' ELSE 'signalled' END, NULL, run_id, node
FROM released
WHERE pending_deps = 0 AND (state = 'skipped' OR state = 'waiting' AND (map OR signalled))
UNION ALL
SELECT 'ended', state, id, CASE WHEN child THEN 'child' END
FROM counted WHERE state <> 'pending';

-- fragment: map_release_items
-- The CTEs after chosen (run_id, node, open: item nodes to release, their run open or not):
-- each item node gets no dependency left; in an open run it is queued with a task that
-- carries its element, in one that is not it stays pending (parked), for a retry of the run
-- to release.
), freed AS (
    UPDATE __schema__.cyclone_steps s
    SET pending_deps = 0, state = CASE WHEN c.open THEN 'queued' ELSE 'pending' END
    FROM chosen c
    WHERE s.run_id = c.run_id AND s.node = c.node
      AND s.run_id = ANY (ARRAY(SELECT run_id FROM chosen))
    RETURNING s.run_id, s.node, s.kind, s.queue, s.priority, s.max_attempts, s.input, s.state
), item_tasks AS (
    INSERT INTO __schema__.cyclone_tasks
        (run_id, node, kind, queue, priority, max_attempts, input, group_key)
    SELECT f.run_id, f.node, f.kind, f.queue, f.priority, f.max_attempts, f.input,
           coalesce((SELECT r.group_key FROM __schema__.cyclone_runs r WHERE r.id = f.run_id),
                    '')
    FROM freed f WHERE f.state = 'queued'

-- fragment: map_grow_items
-- The CTEs after sized (run_id, node, kind, queue, priority, max_attempts, spec, open,
-- group_key, list, n, width, bound, available_at: map nodes to grow, and their lists): an
-- item node per element of a list within its bound, named map[i] and carrying its element;
-- the first width of them queued with tasks (claimable from available_at) in an open run,
-- the rest pending with one dependency (map_settle releases them in item order). The items
-- of a map over a child workflow are child nodes (their spec's "child").
), items AS (
    INSERT INTO __schema__.cyclone_steps
        (run_id, node, kind, queue, priority, max_attempts, state, pending_deps, map_of, item,
         input, spec)
    SELECT z.run_id, z.node || '[' || (e.i - 1) || ']', z.kind, z.queue, z.priority,
           z.max_attempts, CASE WHEN e.i <= z.width AND z.open THEN 'queued' ELSE 'pending' END,
           CASE WHEN e.i <= z.width THEN 0 ELSE 1 END, z.node, e.i - 1, e.value,
           CASE WHEN z.spec ? 'child' THEN jsonb_build_object('child', z.spec->'child') END
    FROM sized z CROSS JOIN LATERAL jsonb_array_elements(z.list) WITH ORDINALITY AS e (value, i)
    WHERE z.n <= z.bound
    RETURNING run_id, node, kind, queue, priority, max_attempts, state, input, map_of
), item_tasks AS (
    INSERT INTO __schema__.cyclone_tasks
        (run_id, node, kind, queue, priority, max_attempts, input, group_key, available_at)
    SELECT i.run_id, i.node, i.kind, i.queue, i.priority, i.max_attempts, i.input, z.group_key,
           z.available_at
    FROM items i JOIN sized z ON z.run_id = i.run_id AND z.node = i.map_of
    WHERE i.state = 'queued'

-- name: map_expand(run_ids, nodes, available_at)
-- Expand reached map nodes (waiting, not expanded yet; runs locked by the caller), all in
-- this one statement: an item node per element of the list (the run input, or the output of
-- the node named by the spec's "over": map_grow_items). An empty list completes its map
-- node at once; a list longer than max_items, or a value that is not a
-- list, fails it. Returns the queues that got work and the map nodes that completed (the
-- caller advances past them) or failed (the caller fails their runs).
WITH ready AS MATERIALIZED (  -- each map node and its run's facts, read once
    SELECT s.run_id, s.node, s.kind, s.queue, s.priority, s.max_attempts, s.spec,
           r.state = 'pending' AS open, coalesce(r.group_key, '') AS group_key,
           CASE WHEN s.spec->'map'->>'over' IS NULL THEN r.input
                ELSE (SELECT p.output FROM __schema__.cyclone_steps p
                      WHERE p.run_id = s.run_id AND p.node = s.spec->'map'->>'over') END
               AS list
    FROM unnest(:run_ids::uuid[], :nodes::text[]) AS w (run_id, node)
    CROSS JOIN LATERAL (
        SELECT * FROM __schema__.cyclone_steps s
        WHERE s.run_id = w.run_id AND s.node = w.node AND s.state = 'waiting'
          AND s.spec ? 'map' AND s.items IS NULL
        OFFSET 0
    ) s
    CROSS JOIN LATERAL (
        SELECT r.state, r.group_key, r.input FROM __schema__.cyclone_runs r
        WHERE r.id = s.run_id
        OFFSET 0
    ) r
), sized AS (
    SELECT r.*, CASE WHEN jsonb_typeof(r.list) = 'array' THEN jsonb_array_length(r.list) END
               AS n,
           coalesce((r.spec->'map'->>'max_parallel')::int, 2147483647) AS width,
           (r.spec->'map'->>'max_items')::int AS bound,
           coalesce(:available_at::timestamptz, __now__) AS available_at
    FROM ready r
/* fragment: map_grow_items */
), expanded AS (
    UPDATE __schema__.cyclone_steps s
    SET items = CASE WHEN z.n <= z.bound THEN z.n END, items_left = z.n,
        next_item = least(z.n, z.width),
        state = CASE WHEN z.n = 0 THEN 'completed'
                     WHEN z.n <= z.bound THEN s.state ELSE 'failed' END,
        output = CASE WHEN z.n = 0 THEN '[]'::jsonb END,
        errors = CASE WHEN z.n IS NULL OR z.n > z.bound
                      THEN s.errors || jsonb_build_array(jsonb_build_object(
                          'attempt', 0, 'type', 'MapTooLargeError',
                          'message', CASE WHEN z.n IS NULL
                              THEN 'map node ' || s.node || ' was given a JSON '
                                   || coalesce(jsonb_typeof(z.list), 'null')
                                   || ', not a list: return a list from the node it maps over'
                              ELSE 'map node ' || s.node || ' was given ' || z.n
                                   || ' items, over its max_items of ' || z.bound
                                   || ': raise max_items= or split the list' END,
                          'at', __now__))
                      ELSE s.errors END,
        finished_at = CASE WHEN z.n = 0 OR z.n IS NULL OR z.n > z.bound THEN __now__ END
    FROM sized z
    WHERE s.run_id = z.run_id AND s.node = z.node
      AND s.run_id = ANY (ARRAY(SELECT run_id FROM sized))
    RETURNING s.run_id, s.node, s.state, s.errors->-1 AS error
)
SELECT 'queue' AS what, queue AS value, NULL::uuid AS run_id, NULL::text AS node
FROM (SELECT DISTINCT queue FROM items WHERE state = 'queued') q
UNION ALL
SELECT state, error::text, run_id, node FROM expanded WHERE state IN ('completed', 'failed');

-- name: map_settle(run_ids, nodes)
-- Item nodes that completed, or failed in a map that settles all its items (runs locked by
-- the caller): count their map nodes down, release as many of the next items as settled
-- (in item order: max_parallel stays the cap), and complete a map node once all its items
-- are settled, its output their outputs in item order (a settling map's: each item's
-- {"value": ...} or {"error": ...}). Returns the queues that got work and the map nodes
-- that completed (the caller advances past them).
WITH settled AS (
    SELECT s.run_id, s.map_of, count(*)::int AS n
    FROM unnest(:run_ids::uuid[], :nodes::text[]) AS d (run_id, node)
    CROSS JOIN LATERAL (
        SELECT s.run_id, s.map_of FROM __schema__.cyclone_steps s
        WHERE s.run_id = d.run_id AND s.node = d.node AND s.map_of IS NOT NULL
        OFFSET 0
    ) s
    GROUP BY s.run_id, s.map_of
), maps AS (
    SELECT m.run_id, m.node, m.items, m.next_item, x.n,
           (SELECT r.state = 'pending' FROM __schema__.cyclone_runs r
            WHERE r.id = m.run_id) AS open
    FROM settled x
    CROSS JOIN LATERAL (
        SELECT m.run_id, m.node, m.items, m.next_item FROM __schema__.cyclone_steps m
        WHERE m.run_id = x.run_id AND m.node = x.map_of
        OFFSET 0
    ) m
), counted AS (
    UPDATE __schema__.cyclone_steps m
    SET items_left = m.items_left - x.n,
        next_item = least(m.items, m.next_item + x.n),
        state = CASE WHEN m.items_left = x.n THEN 'completed' ELSE m.state END,
        finished_at = CASE WHEN m.items_left = x.n THEN __now__ END,
        output = CASE WHEN m.items_left = x.n THEN (
            SELECT coalesce(jsonb_agg(
                       CASE WHEN NOT coalesce((m.spec->'map'->>'settle')::bool, false)
                            THEN i.output
                            WHEN i.state = 'completed'
                            THEN jsonb_build_object('value', i.output)
                            ELSE jsonb_build_object('error', i.errors->-1) END
                       ORDER BY i.item), '[]'::jsonb)
            FROM __schema__.cyclone_steps i
            WHERE i.run_id = m.run_id AND i.map_of = m.node) END
    FROM maps x
    WHERE m.run_id = x.run_id AND m.node = x.node
      AND m.run_id = ANY (ARRAY(SELECT run_id FROM maps))
    RETURNING m.run_id, m.node, m.state
), chosen AS (
    -- The items from the old next_item on, one per item settled, by key (their names).
    SELECT x.run_id, x.node || '[' || g.i || ']' AS node, x.open
    FROM maps x
    CROSS JOIN LATERAL generate_series(x.next_item, least(x.items, x.next_item + x.n) - 1)
        AS g (i)
/* fragment: map_release_items */
)
SELECT 'queue' AS what, queue AS value, NULL::uuid AS run_id, NULL::text AS node
FROM (SELECT DISTINCT queue FROM freed WHERE state = 'queued') q
UNION ALL
SELECT 'completed', NULL, run_id, node FROM counted WHERE state = 'completed';

-- name: run_release(run_id)
-- Release the nodes of an open run (locked by the caller) whose dependencies are all done,
-- after a re-open, as node_advance releases them: a node whose join says so is skipped, a
-- wait node waits, a map node not expanded yet waits for map_expand, and a step node (or an
-- item node) is queued. Returns what each released node became.
WITH open_run AS (
    SELECT id FROM __schema__.cyclone_runs WHERE id = :run_id AND state = 'pending'
), released AS (
    UPDATE __schema__.cyclone_steps s
    SET state = CASE WHEN CASE WHEN s.spec->>'join' = 'any'
                               THEN s.skips = (s.spec->>'parents')::int
                               ELSE s.skips > 0 END THEN 'skipped'
                     WHEN s.kind IS NULL OR s.spec ? 'map' THEN 'waiting'
                     ELSE 'queued' END,
        wait_until = CASE WHEN s.kind IS NULL
                          THEN __now__ + make_interval(secs => s.wait_timeout) END
    WHERE s.run_id IN (SELECT id FROM open_run) AND s.state = 'pending' AND s.pending_deps = 0
    RETURNING s.run_id, s.node, s.kind, s.queue, s.priority, s.max_attempts, s.attempts,
              s.errors, s.input, s.state, s.spec ? 'map' AS map, s.signal IS NOT NULL AS signalled
), queued AS (
    -- A released node's task carries its attempts and errors so far (a parked node goes on
    -- where it stopped; a failed one was reset to none), so the history survives.
    INSERT INTO __schema__.cyclone_tasks
        (run_id, node, kind, queue, priority, max_attempts, attempt, errors, input, group_key)
    SELECT run_id, node, kind, queue, priority, max_attempts, attempts, errors, input,
           coalesce((SELECT r.group_key FROM __schema__.cyclone_runs r WHERE r.id = run_id), '')
    FROM released
    WHERE state = 'queued'
)
SELECT CASE WHEN state = 'queued' THEN 'queue' WHEN state = 'skipped' THEN 'skipped'
            WHEN map THEN 'map' WHEN signalled THEN 'signalled' ELSE 'wait' END AS what,
       queue AS value, run_id, node
FROM released;

-- name: run_fail(run_id, error, drop_running)
-- Fail a pending run (locked by the caller) so that it starts nothing more: drop its
-- unclaimed tasks (:drop_running: running ones too, whose handlers are then cancelled) and
-- park their steps, and reachable wait nodes (a retry releases them again, and re-arms the
-- waits' timeouts); a map node waiting for its items goes on waiting.
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
  AND (s.node IN (SELECT node FROM dropped) OR s.state = 'waiting' AND s.kind IS NULL);

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

