-- Progress and streams (docs/progress.md): appending to a run's stream and reporting a
-- node's progress, each in a short statement of its own outside the completion transaction,
-- and reading both.

-- name: stream_append(run_id, node, attempt, items)
-- needs: 0017
-- Append :items (a JSON array) to the run's stream, unless the run ended. Bumping the run's
-- stream_head locks its row until commit: appends take turns, so offsets commit in order
-- and without gaps, and an append racing the run's end waits for it and then appends
-- nothing (the run is no longer pending), so a reader that saw the run ended has seen
-- every item. Returns the offsets given, none if the run ended or is gone.
WITH head AS (
    UPDATE __schema__.cyclone_runs
    SET stream_head = stream_head + jsonb_array_length(:items::jsonb)
    WHERE id = :run_id::uuid AND state = 'pending'
    RETURNING stream_head - jsonb_array_length(:items::jsonb) AS last
)
INSERT INTO __schema__.cyclone_streams (run_id, seq, node, attempt, value)
SELECT :run_id::uuid, h.last + i.n, :node::text, :attempt::int, i.value
FROM head h, jsonb_array_elements(:items::jsonb) WITH ORDINALITY AS i (value, n)
RETURNING seq;

-- name: stream_read(run_id, after, node, limit)
-- needs: 0017
-- Up to :limit items of the run's stream past offset :after (of :node only, unless NULL),
-- in order, with the run's stored state and last offset, in one snapshot: a run seen ended
-- here had every item of its stream committed (stream_append). No item: one row whose seq
-- is NULL; no row: the run is not visible.
SELECT r.state, r.stream_head AS head, s.seq, s.node, s.attempt, s.value::text AS value, s.created_at
FROM __schema__.cyclone_runs r
LEFT JOIN LATERAL (
    SELECT * FROM __schema__.cyclone_streams x
    WHERE x.run_id = r.id AND x.seq > :after::bigint AND (:node::text IS NULL OR x.node = :node)
    ORDER BY x.seq LIMIT :limit
) s ON true
WHERE r.id = :run_id
ORDER BY s.seq;

-- name: progress_set(run_id, node, attempt, value)
-- needs: 0017
-- Overwrite a node's progress with :value, unless a later attempt of it already reported
-- (an attempt that lost its lease writes on until it notices). Nothing if the run is gone.
INSERT INTO __schema__.cyclone_progress AS p (run_id, node, attempt, value, updated_at)
SELECT r.id, :node::text, :attempt::int, :value::jsonb, __now__
FROM __schema__.cyclone_runs r WHERE r.id = :run_id
ON CONFLICT (run_id, node) DO UPDATE
SET attempt = excluded.attempt, value = excluded.value, writes = p.writes + 1,
    updated_at = excluded.updated_at
WHERE p.attempt <= excluded.attempt;

-- name: progress_get(run_id)
-- needs: 0017
-- The latest progress of each node of the run, by node; no row: the run is not visible, one
-- row whose node is NULL: nothing reported yet.
SELECT p.node, p.attempt, p.value::text AS value, p.writes, p.updated_at
FROM __schema__.cyclone_runs r
LEFT JOIN __schema__.cyclone_progress p ON p.run_id = r.id
WHERE r.id = :run_id
ORDER BY p.node;
