-- The insert path: standalone jobs and workflow runs, inserted in one statement each (in the
-- caller's transaction or on their own), and the wakeups sent once they are committed.
-- One statement per insert, whatever the options: each says the schema generation it needs
-- (README.md, "Schema generations").

-- name: sequence_lock(kind, sequence)
-- needs: 0001
-- Enqueuers of one sequence take turns until commit, so task ids (the sequence order) are
-- handed out in commit order and a claim never sees a later id before an earlier one.
SELECT pg_advisory_xact_lock(1668899693, hashtext(:kind || chr(31) || :sequence));

-- name: job_insert_many(ids, inputs, kind, queue, priority, process_at, max_attempts, sequence,
--     deadline, trace, channel, payload, group_key, expires_at)
-- needs: 0012
-- Standalone jobs: a run row and a task row each, tasks in input order (the sequence order).
-- :inputs is one JSON array, an element per job: one parameter for the batch, not an array
-- of texts that the client encodes element by element. :group_key (the group= option, or
-- NULL) goes on each run, and on each task ('' for none: the claim's fair turns).
-- :expires_at (the expires_at= or expires_in= option, or NULL) goes on each task.
-- :payload, when not NULL, is a wakeup to NOTIFY on :channel at the statement's commit: only
-- ever for an insert that commits on its own (Cyclone's autocommit statement, never a
-- caller's transaction), which saves the wakeup a statement and a connection of its own.
WITH run AS (
    INSERT INTO __schema__.cyclone_runs
        (id, name, job, input, queue, nodes, remaining, priority, max_attempts, deadline, trace,
         group_key)
    SELECT i.id, :kind, true, i.input, :queue, 1, 1, :priority, :max_attempts, :deadline,
           :trace::jsonb, :group_key
    FROM ROWS FROM (unnest(:ids::uuid[]), jsonb_array_elements(:inputs::jsonb)) AS i (id, input)
), task AS (
    INSERT INTO __schema__.cyclone_tasks
        (run_id, kind, queue, priority, available_at, max_attempts, sequence_key, group_key,
         expires_at)
    SELECT i.id, :kind, :queue, :priority, coalesce(:process_at, __now__), :max_attempts,
           :sequence, coalesce(:group_key, ''), :expires_at
    FROM unnest(:ids::uuid[]) WITH ORDINALITY AS i (id, ord)
    ORDER BY i.ord
)
SELECT pg_notify(:channel, :payload) WHERE :payload::text IS NOT NULL;

-- name: job_insert_unique(id, inputs, kind, queue, priority, process_at, max_attempts, sequence,
--     deadline, trace, channel, payload, unique_key, group_key, expires_at)
-- needs: 0012
-- One standalone job with a :unique_key (the rest as job_insert_many, for one job: :inputs
-- holds its input alone). A key held by an active (pending) run inserts nothing: the arbiter
-- is idx_runs_unique_key, whose predicate the ON CONFLICT must repeat; ON CONFLICT keeps
-- the caller's transaction usable where an error would abort it. Returns how many jobs it
-- inserted (0 or 1), and sends the wakeup only if it inserted one.
WITH run AS (
    INSERT INTO __schema__.cyclone_runs AS r
        (id, name, job, input, queue, unique_key, nodes, remaining, priority, max_attempts,
         deadline, trace, group_key)
    VALUES (:id, :kind, true, :inputs::jsonb -> 0, :queue, :unique_key, 1, 1, :priority,
            :max_attempts, :deadline, :trace::jsonb, :group_key)
    ON CONFLICT (name, unique_key) WHERE unique_key IS NOT NULL AND state = 'pending'
    DO NOTHING
    RETURNING r.id
), task AS (
    INSERT INTO __schema__.cyclone_tasks
        (run_id, kind, queue, priority, available_at, max_attempts, sequence_key, group_key,
         expires_at)
    SELECT id, :kind, :queue, :priority, coalesce(:process_at, __now__), :max_attempts, :sequence,
           coalesce(:group_key, ''), :expires_at
    FROM run
)
SELECT c.n, (SELECT pg_notify(:channel, :payload) WHERE :payload::text IS NOT NULL AND c.n > 0)
FROM (SELECT count(*)::int AS n FROM run) c;

-- name: job_find_unique(kind, unique_key)
-- needs: 0001
SELECT id FROM __schema__.cyclone_runs
WHERE name = :kind AND unique_key = :unique_key AND state = 'pending';

-- fragment: submit_key_taken
-- A submit key (submit_once, a schedule's slot) taken by a run in any state inserts nothing:
-- the arbiter is idx_runs_submit_key, whose predicate this must repeat.
ON CONFLICT (name, key) WHERE key IS NOT NULL DO NOTHING

-- fragment: workflow_run
-- run (id): a workflow run's row, or none when its submit key is taken.
run AS (
    INSERT INTO __schema__.cyclone_runs AS r
        (id, name, job, input, result_node, key, nodes, remaining, priority, deadline, trace,
         group_key)
    VALUES (:id, :name, false, :input::jsonb, :result_node, :key, :nodes, :nodes, :priority,
            :deadline, :trace::jsonb, :group_key)
    /* fragment: submit_key_taken */
    RETURNING r.id

-- name: workflow_insert(id, name, input, result_node, key, nodes, deadline, priority,
--     process_at, node_names, node_kinds, node_queues, node_max_attempts, node_deps,
--     node_wait_timeouts, node_specs, edge_parents, edge_children, edge_conds, trace,
--     group_key, grow_maps)
-- needs: 0009
-- A workflow run, its steps (one row per node: the node_* arrays, an element per node) and
-- its edges (the edge_* arrays) in one statement; the root steps get tasks, or wait. A key
-- already taken inserts nothing (submit_once then compares inputs). Each node's spec and
-- each edge's condition are JSON text, NULL for a plain step and an unconditional edge (a
-- workflow without map nodes, joins or branches has only NULLs there). :group_key goes on
-- the run (for the nodes queued later: see node_advance) and on each root task. With
-- :grow_maps (the input is a non-empty list, within the bounds the submit checked) a root
-- map node over the input grows its items here, as map_expand would; without, it waits for
-- the caller's map_expand in the same transaction.
WITH /* fragment: workflow_run */
), node AS (
    SELECT n.node, n.kind, n.queue, n.max_attempts, n.deps, n.wait_timeout,
           n.spec::jsonb AS spec,
           :grow_maps::bool AND n.deps = 0 AND n.spec::jsonb ? 'map'
               AND n.spec::jsonb->'map'->>'over' IS NULL AS grows,
           coalesce((n.spec::jsonb->'map'->>'max_parallel')::int, 2147483647) AS width
    FROM unnest(:node_names::text[], :node_kinds::text[], :node_queues::text[],
                :node_max_attempts::int[], :node_deps::int[], :node_wait_timeouts::float8[],
                :node_specs::text[])
        AS n (node, kind, queue, max_attempts, deps, wait_timeout, spec)
), steps AS (
    INSERT INTO __schema__.cyclone_steps
        (run_id, node, kind, queue, priority, max_attempts, state, pending_deps,
         wait_timeout, wait_until, spec, items, items_left, next_item)
    SELECT run.id, n.node, n.kind, n.queue, :priority, n.max_attempts,
           CASE WHEN n.deps > 0 THEN 'pending'
                WHEN n.kind IS NULL OR n.spec ? 'map' THEN 'waiting' ELSE 'queued' END,
           n.deps, n.wait_timeout,
           CASE WHEN n.deps = 0 AND n.kind IS NULL
                THEN __now__ + make_interval(secs => n.wait_timeout) END,
           n.spec, l.n, l.n, least(l.n, n.width)
    FROM run, node n
    LEFT JOIN (SELECT CASE WHEN :grow_maps::bool THEN jsonb_array_length(:input::jsonb) END
               AS n) l ON n.grows  -- guarded as in sized
), edges AS (
    INSERT INTO __schema__.cyclone_edges (run_id, parent, child, cond)
    SELECT run.id, e.parent, e.child, e.cond::jsonb
    FROM run, unnest(:edge_parents::text[], :edge_children::text[], :edge_conds::text[])
        AS e (parent, child, cond)
), tasks AS (
    INSERT INTO __schema__.cyclone_tasks
        (run_id, node, kind, queue, priority, available_at, max_attempts, group_key)
    SELECT run.id, n.node, n.kind, n.queue, :priority, coalesce(:process_at, __now__),
           n.max_attempts, coalesce(:group_key, '')
    FROM run, node n
    WHERE n.deps = 0 AND n.kind IS NOT NULL AND NOT coalesce(n.spec ? 'map', false)
), sized AS (  -- the root map nodes to grow, over the run input
    SELECT run.id AS run_id, n.node, n.kind, n.queue, :priority AS priority, n.max_attempts,
           n.spec, true AS open, coalesce(:group_key, '') AS group_key,
           l.list, jsonb_array_length(l.list) AS n, n.width,
           (n.spec->'map'->>'max_items')::int AS bound,
           coalesce(:process_at, __now__) AS available_at
    -- Guarded: with a parameter, a custom plan folds the call on a scalar input at planning.
    FROM run, node n, (SELECT CASE WHEN :grow_maps::bool THEN :input::jsonb END AS list) l
    WHERE n.grows
/* fragment: map_grow_items */
)
SELECT id FROM run;

-- name: workflow_insert_static(id, name, input, result_node, key, nodes, deadline, priority,
--     process_at, node_names, node_kinds, node_queues, node_max_attempts, node_deps,
--     node_wait_timeouts, edge_parents, edge_children, trace, group_key)
-- needs: 0008
-- workflow_insert for a workflow without map nodes, joins or branches (every spec and
-- condition NULL): the same rows, without the columns and the map growing that only those
-- use, which cost a plain submit a fifth of its time.
WITH /* fragment: workflow_run */
), node AS (
    SELECT * FROM unnest(:node_names::text[], :node_kinds::text[], :node_queues::text[],
                         :node_max_attempts::int[], :node_deps::int[],
                         :node_wait_timeouts::float8[])
        AS n (node, kind, queue, max_attempts, deps, wait_timeout)
), steps AS (
    INSERT INTO __schema__.cyclone_steps
        (run_id, node, kind, queue, priority, max_attempts, state, pending_deps,
         wait_timeout, wait_until)
    SELECT run.id, n.node, n.kind, n.queue, :priority, n.max_attempts,
           CASE WHEN n.deps > 0 THEN 'pending'
                WHEN n.kind IS NULL THEN 'waiting' ELSE 'queued' END,
           n.deps, n.wait_timeout,
           CASE WHEN n.deps = 0 AND n.kind IS NULL
                THEN __now__ + make_interval(secs => n.wait_timeout) END
    FROM run, node n
), edges AS (
    INSERT INTO __schema__.cyclone_edges (run_id, parent, child)
    SELECT run.id, e.parent, e.child
    FROM run, unnest(:edge_parents::text[], :edge_children::text[]) AS e (parent, child)
), tasks AS (
    INSERT INTO __schema__.cyclone_tasks
        (run_id, node, kind, queue, priority, available_at, max_attempts, group_key)
    SELECT run.id, n.node, n.kind, n.queue, :priority, coalesce(:process_at, __now__),
           n.max_attempts, coalesce(:group_key, '')
    FROM run, node n
    WHERE n.deps = 0 AND n.kind IS NOT NULL
)
SELECT id FROM run;

-- name: workflow_find_key(name, key, input)
-- needs: 0001
-- submit_once's slow path: the key's run, and whether its input equals this call's as jsonb
-- and the stored input (a sealed one, never equal as jsonb, is compared once opened).
SELECT id, input = :input::jsonb AS same_input, result_node, input::text AS input
FROM __schema__.cyclone_runs WHERE name = :name AND key = :key;

-- name: wakeup_notify(channel, payloads)
-- needs: 0001
-- One NOTIFY per payload, sent by Cyclone on its own connection, never in a caller's
-- transaction. Its commit need not wait for the WAL flush: a notification is a hint that
-- no crash has to keep, and the server serializes notifying commits until they are done.
SELECT pg_notify(:channel, p)
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit,
     unnest(:payloads::text[]) AS p;
