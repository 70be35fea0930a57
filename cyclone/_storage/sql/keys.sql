-- Sealed payloads (cyclone.Keyring): how many values each key seals, and re-sealing under
-- the current key (client.keys.rotate). A batch is picked and rewritten in one short
-- transaction of its own. The pick locks its rows FOR NO KEY UPDATE SKIP LOCKED, so it
-- never waits (no lock order to keep with the pipeline's), and a worker writing one of its
-- rows meanwhile waits for the rewrite's commit and then writes over the re-sealed row,
-- never under it; a row locked elsewhere is left for the next pass. NO KEY: inserts that
-- reference a picked run (its next tasks) do not wait for the batch. Each pick walks the
-- table from a cursor (:after, a ctid), not from the start.

-- name: sealed_count()
-- needs: 0009
-- The sealed values in every payload column, per key id.
SELECT k #>> '{}' AS key_id, count(*) AS n
FROM (SELECT jsonb_build_array(input, output, error, errors) AS p
      FROM __schema__.cyclone_runs
      UNION ALL
      SELECT jsonb_build_array(input, output, signal, errors) FROM __schema__.cyclone_steps
      UNION ALL
      SELECT jsonb_build_array(input, errors) FROM __schema__.cyclone_tasks
      UNION ALL
      SELECT jsonb_build_array(input) FROM __schema__.cyclone_schedules) t,
     jsonb_path_query(t.p, 'strict $.**."$cyclone.sealed"') AS k
GROUP BY 1 ORDER BY 1;

-- name: run_sealed_pick(current, after, batch)
-- needs: 0009
-- Up to :batch runs after the cursor holding a value sealed with a key other than :current.
SELECT r.ctid::text AS cursor, r.id, r.input::text AS input, r.output::text AS output,
       r.error::text AS error, r.errors::text AS errors
FROM __schema__.cyclone_runs r
WHERE r.ctid > :after::text::tid
  AND jsonb_path_exists(jsonb_build_array(r.input, r.output, r.error, r.errors),
                        'strict $.** ? (@."$cyclone.sealed" != $k)',
                        jsonb_build_object('k', :current::text))
ORDER BY r.ctid LIMIT :batch
FOR NO KEY UPDATE SKIP LOCKED;

-- name: run_sealed_write(ids, inputs, outputs, errors, error_lists)
-- needs: 0009
-- The picked runs' payloads, re-sealed (their rows locked by the pick, in this transaction).
UPDATE __schema__.cyclone_runs r
SET input = d.input::jsonb, output = d.output::jsonb, error = d.error::jsonb,
    errors = d.errors::jsonb
FROM unnest(:ids::uuid[], :inputs::text[], :outputs::text[], :errors::text[],
            :error_lists::text[]) AS d (id, input, output, error, errors)
WHERE r.id = d.id;

-- name: step_sealed_pick(current, after, batch)
-- needs: 0009
-- As run_sealed_pick, for nodes: input (a map item's), output, signal and errors.
SELECT s.ctid::text AS cursor, s.run_id, s.node, s.input::text AS input,
       s.output::text AS output, s.signal::text AS signal, s.errors::text AS errors
FROM __schema__.cyclone_steps s
WHERE s.ctid > :after::text::tid
  AND jsonb_path_exists(jsonb_build_array(s.input, s.output, s.signal, s.errors),
                        'strict $.** ? (@."$cyclone.sealed" != $k)',
                        jsonb_build_object('k', :current::text))
ORDER BY s.ctid LIMIT :batch
FOR NO KEY UPDATE SKIP LOCKED;

-- name: step_sealed_write(run_ids, nodes, inputs, outputs, signals, errors)
-- needs: 0009
UPDATE __schema__.cyclone_steps s
SET input = d.input::jsonb, output = d.output::jsonb, signal = d.signal::jsonb,
    errors = d.errors::jsonb
FROM unnest(:run_ids::uuid[], :nodes::text[], :inputs::text[], :outputs::text[],
            :signals::text[], :errors::text[]) AS d (run_id, node, input, output, signal, errors)
WHERE s.run_id = d.run_id AND s.node = d.node;

-- name: task_sealed_pick(current, after, batch)
-- needs: 0009
-- As run_sealed_pick, for tasks: input (a node task's own) and errors.
SELECT t.ctid::text AS cursor, t.run_id, t.id, t.input::text AS input,
       t.errors::text AS errors
FROM __schema__.cyclone_tasks t
WHERE t.ctid > :after::text::tid
  AND jsonb_path_exists(jsonb_build_array(t.input, t.errors),
                        'strict $.** ? (@."$cyclone.sealed" != $k)',
                        jsonb_build_object('k', :current::text))
ORDER BY t.ctid LIMIT :batch
FOR NO KEY UPDATE SKIP LOCKED;

-- name: task_sealed_write(run_ids, ids, inputs, errors)
-- needs: 0009
UPDATE __schema__.cyclone_tasks t
SET input = d.input::jsonb, errors = d.errors::jsonb
FROM unnest(:run_ids::uuid[], :ids::bigint[], :inputs::text[], :errors::text[])
    AS d (run_id, id, input, errors)
WHERE t.run_id = d.run_id AND t.id = d.id;

-- name: schedule_sealed_pick(current, after, batch)
-- needs: 0009
-- As run_sealed_pick, for stored schedules' inputs.
SELECT s.ctid::text AS cursor, s.name, s.input::text AS input
FROM __schema__.cyclone_schedules s
WHERE s.ctid > :after::text::tid
  AND jsonb_path_exists(s.input, 'strict $.** ? (@."$cyclone.sealed" != $k)',
                        jsonb_build_object('k', :current::text))
ORDER BY s.ctid LIMIT :batch
FOR NO KEY UPDATE SKIP LOCKED;

-- name: schedule_sealed_write(names, inputs)
-- needs: 0009
UPDATE __schema__.cyclone_schedules s SET input = d.input::jsonb
FROM unnest(:names::text[], :inputs::text[]) AS d (name, input)
WHERE s.name = d.name;
