-- Wait nodes (the steps with no kind): storing a signal, completing the nodes whose
-- signal (or every one of their events) is in, and why a signal was refused. A wait node's
-- timeout is in maintenance.sql (wait_expire); node_advance and run_release report the
-- signalled wait nodes they make reachable, for wait_complete_many.

-- fragment: wait_all_came
-- A node waiting for all of its events has every one of them.
          AND (NOT coalesce((s.spec->'events'->>'all')::bool, false)
               OR s.signal ?& ARRAY(SELECT jsonb_array_elements_text(s.spec->'events'->'names')))

-- name: wait_complete_many(run_ids, nodes)
-- Signalled wait nodes complete with their signal as output (one waiting for all of its
-- events once it has every one). Each node by key, one look-up
-- per node (OFFSET 0, as in node_advance): as a join, statistics that knew of no waiting
-- node made a batch of 300 a hash join over a scan of every step in the history.
WITH signalled AS (
    SELECT s.run_id, s.node
    FROM unnest(:run_ids::uuid[], :nodes::text[]) AS w (run_id, node)
    CROSS JOIN LATERAL (
        SELECT s.run_id, s.node FROM __schema__.cyclone_steps s
        WHERE s.run_id = w.run_id AND s.node = w.node AND s.state = 'waiting'
          AND s.signal IS NOT NULL
/* fragment: wait_all_came */
        OFFSET 0
    ) s
)
UPDATE __schema__.cyclone_steps s
SET state = 'completed', output = s.signal, wait_until = NULL, finished_at = __now__
FROM signalled w
WHERE s.run_id = w.run_id AND s.node = w.node  -- and the guard again, for the row it writes
  AND s.state = 'waiting' AND s.signal IS NOT NULL
/* fragment: wait_all_came */
RETURNING s.run_id, s.node;

-- name: wait_signal(run_id, node, payload, event)
-- Store a wait node's signal; the caller holds the run's lock. A plain wait node takes one
-- signal without :event; a node waiting for events takes a declared :event: any of them
-- the first (stored as {"name", "payload"}), all of them each once (stored by name in one
-- object). A node a timeout completed takes none. Returns the node's state; no row if
-- nothing was stored (node_get says why).
UPDATE __schema__.cyclone_steps
SET signal = CASE WHEN :event::text IS NULL THEN :payload::jsonb
                  WHEN (spec->'events'->>'all')::bool
                  THEN coalesce(signal, '{}'::jsonb)
                       || jsonb_build_object(:event::text, :payload::jsonb)
                  ELSE jsonb_build_object('name', :event::text, 'payload', :payload::jsonb) END
WHERE run_id = :run_id AND node = :node AND kind IS NULL AND state <> 'completed'
  AND CASE WHEN :event::text IS NULL THEN signal IS NULL AND NOT coalesce(spec ? 'events', false)
           ELSE spec->'events'->'names' ? :event::text
                AND (signal IS NULL OR (spec->'events'->>'all')::bool AND NOT signal ? :event::text)
      END
RETURNING state;

-- name: node_get(run_id, node)
-- A node's kind, state and events, what it was signalled (the event an any-of wait node
-- took), for the errors of a refused signal and retry.
SELECT kind, state, signal IS NOT NULL AS signalled,
       ARRAY(SELECT jsonb_array_elements_text(spec->'events'->'names')) AS events,
       CASE WHEN NOT (spec->'events'->>'all')::bool THEN signal->>'name' END AS took
FROM __schema__.cyclone_steps
WHERE run_id = :run_id AND node = :node;
