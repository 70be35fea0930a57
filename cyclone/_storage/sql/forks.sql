-- Forked runs: a new run of an ended run's graph that copies the nodes before the fork node
-- with their outputs and runs the fork node and what comes after it again; the links between
-- a fork and the run it came from.

-- name: run_fork(id, source, input, name, result_node, key, fork_node, node_names, node_kinds,
--     node_queues, node_max_attempts, node_deps, node_wait_timeouts, node_specs, node_copied,
--     edge_parents, edge_children, edge_conds)
-- needs: 0014
-- A fork of run :source (locked by the caller, ended): a run of the graph the node_* and
-- edge_* arrays give (the definition's, as workflow_insert takes them). Its :node_copied
-- nodes are copied from the source as they are there (completed with their outputs and
-- signals, or skipped), a map node with its items; its other nodes are pending, with
-- :node_deps re-run parents to wait for, for the caller's run_release to release those
-- with none. :input NULL keeps the source's input (as stored: sealed or not). A key taken
-- inserts nothing (the caller then compares the key's run with this fork).
WITH src AS (
    SELECT s.input, s.priority, s.group_key FROM __schema__.cyclone_runs s WHERE s.id = :source
), run AS (
    INSERT INTO __schema__.cyclone_runs AS r
        (id, name, job, input, result_node, key, nodes, remaining, priority, group_key,
         forked_from, forked_node)
    SELECT :id::uuid, :name::text, false, coalesce(:input::jsonb, src.input),
           :result_node::text, :key::text, cardinality(:node_names::text[]),
           cardinality(array_positions(:node_copied::bool[], false)),
           src.priority, src.group_key, :source::uuid, :fork_node::text
    FROM src
    /* fragment: submit_key_taken */
    RETURNING r.id
), node AS (
    SELECT * FROM unnest(:node_names::text[], :node_kinds::text[], :node_queues::text[],
                         :node_max_attempts::int[], :node_deps::int[],
                         :node_wait_timeouts::float8[], :node_specs::text[],
                         :node_copied::bool[])
        AS n (node, kind, queue, max_attempts, deps, wait_timeout, spec, copied)
), edge AS (
    SELECT * FROM unnest(:edge_parents::text[], :edge_children::text[], :edge_conds::text[])
        AS e (parent, child, cond)
), copied AS (  -- the copied nodes and their items, as the source has them
    INSERT INTO __schema__.cyclone_steps
        (run_id, node, kind, queue, priority, max_attempts, state, pending_deps, attempts,
         errors, output, signal, wait_timeout, finished_at, spec, map_of, item, input, items,
         items_left, next_item, skips, child_run)
    SELECT run.id, s.node, s.kind, s.queue, s.priority, s.max_attempts,
           CASE WHEN s.state = 'skipped' THEN 'skipped'
                WHEN s.state = 'failed' THEN 'failed'  -- an item of a settling map
                ELSE 'completed' END,
           0, s.attempts, s.errors, s.output, s.signal, s.wait_timeout, s.finished_at, s.spec,
           s.map_of, s.item, s.input, s.items, s.items_left, s.next_item, s.skips, s.child_run
    FROM run, __schema__.cyclone_steps s
    WHERE s.run_id = :source
      AND coalesce(s.map_of, s.node) IN (SELECT n.node FROM node n WHERE n.copied)
), fresh AS (  -- the re-run nodes, pending
    INSERT INTO __schema__.cyclone_steps
        (run_id, node, kind, queue, priority, max_attempts, state, pending_deps, wait_timeout,
         spec, skips)
    SELECT run.id, n.node, n.kind, n.queue, src.priority, n.max_attempts, 'pending', n.deps,
           n.wait_timeout, n.spec::jsonb,
           -- its copied parents that did not take their edge to it, as node_advance counts
           (SELECT count(*)::int FROM edge e
            JOIN node pn ON pn.node = e.parent AND pn.copied
            JOIN __schema__.cyclone_steps p ON p.run_id = :source AND p.node = e.parent
            WHERE e.child = n.node
              AND (p.state = 'skipped'
                   OR e.cond IS NOT NULL AND e.cond::jsonb IS DISTINCT FROM p.output))
    FROM run, src, node n
    WHERE NOT n.copied
), edges AS (
    INSERT INTO __schema__.cyclone_edges (run_id, parent, child, cond)
    SELECT run.id, e.parent, e.child, e.cond::jsonb FROM run, edge e
)
SELECT id FROM run;

-- name: run_fork_links(run_id)
-- needs: 0014
-- Where a run came from (what 'from': the run it was forked from and the node it re-ran
-- from) and the runs forked from it (what 'fork', oldest first, at most 1,000: by
-- idx_runs_forked).
SELECT 'from' AS what, r.forked_from AS run_id, r.forked_node AS node
FROM __schema__.cyclone_runs r
WHERE r.id = :run_id AND r.forked_from IS NOT NULL
UNION ALL
(SELECT 'fork', f.id, f.forked_node FROM __schema__.cyclone_runs f
 WHERE f.forked_from = :run_id ORDER BY f.id LIMIT 1000);
