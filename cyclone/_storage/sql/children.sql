-- Child runs: the transaction that completes a child node's attempt submits a run of another
-- workflow (keyed by the attempt's task; child_link after the insert), the node waits, and the
-- child run's end settles it (child_settle). Cancelling a run cancels its children
-- (run_children). Every transition here runs under run_lock_many, which holds the parents'
-- locks with their children's.

-- name: child_link(run_id, parent_run, parent_node)
-- Make run_id (written by this transaction) the child of the node, on the child's run row
-- and as the node's child_run (the parent run locked by the caller).
WITH child AS (
    UPDATE __schema__.cyclone_runs SET parent_run = :parent_run, parent_node = :parent_node
    WHERE id = :run_id
    RETURNING id
)
UPDATE __schema__.cyclone_steps s SET child_run = (SELECT id FROM child)
WHERE s.run_id = :parent_run AND s.node = :parent_node;

-- name: child_settle(run_ids)
-- Runs that ended (locked by the caller, their parents too) and are children: the parent
-- node waiting on each completes with the child's result (its result node's output, null
-- without one), or takes the child's end as a failed attempt: queued for a new attempt (and
-- a new child) while it has attempts left and its run is open, else failed. Returns what
-- each parent node became: 'completed' (the caller advances past it, or settles it on its
-- map node), 'queue' (its queue), or 'failed' with the error (the caller fails the parent
-- run, or settles the item of a map that settles all its items), with the node's map node
-- and whether that map settles.
WITH ended AS (
    SELECT r.id, r.name, r.state, r.parent_run, r.parent_node, r.error,
           /* fragment: run_output */ AS output,
           (SELECT p.state = 'pending' FROM __schema__.cyclone_runs p
            WHERE p.id = r.parent_run) AS open
    FROM unnest(:run_ids::uuid[]) AS e (id)
    CROSS JOIN LATERAL (
        SELECT * FROM __schema__.cyclone_runs r
        WHERE r.id = e.id AND r.parent_run IS NOT NULL
          AND r.state IN ('completed', 'failed', 'cancelled')
        OFFSET 0
    ) r
), settled AS (
    UPDATE __schema__.cyclone_steps s
    SET state = CASE WHEN e.state = 'completed' THEN 'completed'
                     WHEN s.attempts < s.max_attempts AND e.open THEN 'queued'
                     ELSE 'failed' END,
        output = CASE WHEN e.state = 'completed' THEN coalesce(e.output::jsonb, 'null') END,
        errors = CASE WHEN e.state = 'completed' THEN s.errors
                      ELSE s.errors || jsonb_build_array(jsonb_build_object(
                          'attempt', s.attempts,
                          'type', CASE WHEN e.state = 'failed' THEN 'ChildRunFailed'
                                       ELSE 'ChildRunCancelled' END,
                          'message', 'child run ' || e.id || ' of workflow ' || e.name || ' '
                              || e.state || coalesce(': ' || (e.error->>'type') || ': '
                                                     || (e.error->>'message'), ''),
                          'child_run', e.id,
                          'at', __now__)) END,
        finished_at = CASE WHEN e.state = 'completed' OR s.attempts >= s.max_attempts
                                OR NOT e.open THEN __now__ END
    FROM ended e
    WHERE s.run_id = e.parent_run AND s.node = e.parent_node
      AND s.state = 'waiting' AND s.child_run = e.id
    RETURNING s.run_id, s.node, s.kind, s.queue, s.priority, s.max_attempts, s.attempts,
              s.errors, s.state, s.map_of, s.input
), requeued AS (
    INSERT INTO __schema__.cyclone_tasks
        (run_id, node, kind, queue, priority, max_attempts, attempt, errors, input, group_key)
    SELECT s.run_id, s.node, s.kind, s.queue, s.priority, s.max_attempts, s.attempts, s.errors,
           s.input, coalesce((SELECT r.group_key FROM __schema__.cyclone_runs r WHERE r.id = s.run_id),
                    '')
    FROM settled s WHERE s.state = 'queued'
)
SELECT CASE WHEN state = 'queued' THEN 'queue' ELSE state END AS what,
       CASE WHEN state = 'queued' THEN queue WHEN state = 'failed' THEN (errors->-1)::text END
           AS value,
       run_id, node, map_of,
       coalesce((SELECT (m.spec->'map'->>'settle')::bool FROM __schema__.cyclone_steps m
                 WHERE m.run_id = settled.run_id AND m.node = settled.map_of), false) AS settles
FROM settled;

-- name: run_children(run_ids)
-- The child runs of these runs that have not ended: what cancelling them cancels too.
SELECT c.id FROM unnest(:run_ids::uuid[]) AS p (id)
CROSS JOIN LATERAL (
    SELECT r.id FROM __schema__.cyclone_runs r
    WHERE r.parent_run = p.id AND r.state = 'pending'
    OFFSET 0
) c;

-- name: child_insert_many(ids, names, inputs, result_nodes, keys, node_counts, traces,
--     parent_runs, parent_nodes, node_runs, node_names, node_kinds, node_queues,
--     node_max_attempts, node_deps, node_wait_timeouts, edge_runs, edge_parents,
--     edge_children)
-- The child runs of the child nodes whose attempts one batch completes (their parent runs
-- locked by the caller), in one statement: each as workflow_insert writes a run (one element
-- of the run arrays per run; the node_runs and edge_runs arrays say whose nodes and edges the
-- others are), linked to its parent node on both sides. Plain children only: the caller
-- submits one with map nodes, joins or branches by itself. A key already taken inserts
-- nothing for that run. Returns the runs written and the queues of their root tasks.
WITH run AS (
    INSERT INTO __schema__.cyclone_runs AS r
        (id, name, job, input, result_node, key, nodes, remaining, priority, trace,
         parent_run, parent_node)
    SELECT c.id, c.name, false, c.input::jsonb, c.result_node, c.key, c.nodes, c.nodes, 0,
           c.trace::jsonb, c.parent_run, c.parent_node
    FROM unnest(:ids::uuid[], :names::text[], :inputs::text[], :result_nodes::text[],
                :keys::text[], :node_counts::int[], :traces::text[], :parent_runs::uuid[],
                :parent_nodes::text[])
        AS c (id, name, input, result_node, key, nodes, trace, parent_run, parent_node)
    /* fragment: submit_key_taken */
    RETURNING r.id, r.parent_run, r.parent_node
), node AS (
    SELECT n.* FROM unnest(:node_runs::uuid[], :node_names::text[], :node_kinds::text[],
                           :node_queues::text[], :node_max_attempts::int[], :node_deps::int[],
                           :node_wait_timeouts::float8[])
        AS n (run_id, node, kind, queue, max_attempts, deps, wait_timeout)
    JOIN run ON run.id = n.run_id
), steps AS (
    INSERT INTO __schema__.cyclone_steps
        (run_id, node, kind, queue, priority, max_attempts, state, pending_deps,
         wait_timeout, wait_until)
    SELECT n.run_id, n.node, n.kind, n.queue, 0, n.max_attempts,
           CASE WHEN n.deps > 0 THEN 'pending'
                WHEN n.kind IS NULL THEN 'waiting' ELSE 'queued' END,
           n.deps, n.wait_timeout,
           CASE WHEN n.deps = 0 AND n.kind IS NULL
                THEN __now__ + make_interval(secs => n.wait_timeout) END
    FROM node n
), edges AS (
    INSERT INTO __schema__.cyclone_edges (run_id, parent, child)
    SELECT e.run_id, e.parent, e.child
    FROM unnest(:edge_runs::uuid[], :edge_parents::text[], :edge_children::text[])
        AS e (run_id, parent, child)
    JOIN run ON run.id = e.run_id
), tasks AS (
    INSERT INTO __schema__.cyclone_tasks
        (run_id, node, kind, queue, priority, available_at, max_attempts)
    SELECT n.run_id, n.node, n.kind, n.queue, 0, __now__, n.max_attempts
    FROM node n
    WHERE n.deps = 0 AND n.kind IS NOT NULL
), linked AS (
    UPDATE __schema__.cyclone_steps s SET child_run = run.id
    FROM run
    WHERE s.run_id = run.parent_run AND s.node = run.parent_node
)
SELECT 'run' AS what, id::text AS value FROM run
UNION ALL
SELECT DISTINCT 'queue', queue FROM node WHERE deps = 0 AND kind IS NOT NULL;
