-- Sleep nodes. A sleep node's attempt puts it to sleep (node_complete_many): waiting, its
-- wake time in wait_until, which the worker's timer watches with the wait nodes' timeouts
-- (wait_expire_due finds both). At its wake time it completes, its output the wake time.

-- name: sleep_wake_many(run_ids, nodes)
-- Complete sleep nodes whose wake time has come (runs locked by the caller), each with its
-- wake time as output (UTC, whatever the session's time zone); each node by key, one
-- look-up per node (OFFSET 0), as wait_complete_many. Returns them: the caller advances.
WITH due AS (
    SELECT s.run_id, s.node
    FROM unnest(:run_ids::uuid[], :nodes::text[]) AS w (run_id, node)
    CROSS JOIN LATERAL (
        SELECT s.run_id, s.node FROM __schema__.cyclone_steps s
        WHERE s.run_id = w.run_id AND s.node = w.node AND s.state = 'waiting'
          AND s.spec ? 'sleep' AND s.wait_until <= __now__
        OFFSET 0
    ) s
)
UPDATE __schema__.cyclone_steps s
SET state = 'completed', wait_until = NULL, finished_at = __now__,
    output = to_jsonb(to_char(s.wait_until AT TIME ZONE 'UTC',
                              'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))
FROM due w
WHERE s.run_id = w.run_id AND s.node = w.node  -- and the guard again, for the row it writes
  AND s.state = 'waiting' AND s.spec ? 'sleep' AND s.wait_until <= __now__
RETURNING s.run_id, s.node;
