-- Flow control (see migrations/0008_flow_control.sql and the claim in claim.sql): the rows
-- an operator changes. A change bumps the row's version, so a claim that counted running
-- tasks before it starts nothing and claims again; running work is never interrupted.
-- A changed rate starts its bucket empty: no burst follows a change. A per-key rate is a
-- sliding window over the starts log, which a change keeps: the window's starts still count.

-- name: queue_limits_set(queue, concurrency, rate, per, key_concurrency, key_rate, key_per)
-- Set (NULL: clear) a queue's limits, keeping whether it is paused. Clearing the per-key
-- rate drops its starts log (a queue's claims prune it only while it has the rate).
WITH cleared AS (
    DELETE FROM __schema__.cyclone_key_starts WHERE queue = :queue AND :key_rate::integer IS NULL
)
INSERT INTO __schema__.cyclone_queues AS q
    (queue, concurrency, rate, per, key_concurrency, key_rate, key_per)
VALUES (:queue, :concurrency, :rate, :per, :key_concurrency, :key_rate, :key_per)
ON CONFLICT (queue) DO UPDATE
SET concurrency = excluded.concurrency, rate = excluded.rate, per = excluded.per,
    key_concurrency = excluded.key_concurrency, key_rate = excluded.key_rate,
    key_per = excluded.key_per, version = q.version + 1, updated_at = __now__,
    tokens = CASE WHEN (q.rate, q.per) IS NOT DISTINCT FROM (excluded.rate, excluded.per)
                  THEN q.tokens ELSE 0 END,
    refilled_at = CASE WHEN (q.rate, q.per) IS NOT DISTINCT FROM (excluded.rate, excluded.per)
                       THEN q.refilled_at ELSE __now__ END;

-- name: queue_pause_set(queue, paused)
-- Pause (:paused true) or resume a queue; returns whether it was paused before.
WITH before AS (
    SELECT paused FROM __schema__.cyclone_queues WHERE queue = :queue
)
INSERT INTO __schema__.cyclone_queues AS q (queue, paused) VALUES (:queue, :paused)
ON CONFLICT (queue) DO UPDATE
SET paused = excluded.paused, version = q.version + 1, updated_at = __now__
RETURNING coalesce((SELECT paused FROM before), false) AS was_paused;

-- name: queue_list(queue)
-- Every queue with a setting (paused or a limit), by name; or the one named (:queue).
SELECT queue, paused, concurrency, rate, per, key_concurrency, key_rate, key_per
FROM __schema__.cyclone_queues
WHERE (:queue::text IS NULL OR queue = :queue)
  AND (paused OR concurrency IS NOT NULL OR rate IS NOT NULL OR key_concurrency IS NOT NULL
       OR key_rate IS NOT NULL)
ORDER BY queue;

-- name: queue_known(queue)
-- Whether queue :queue has a setting or a live worker claims from it (a few rows each, by key).
SELECT EXISTS (SELECT 1 FROM __schema__.cyclone_queues WHERE queue = :queue)
    OR EXISTS (SELECT 1 FROM __schema__.cyclone_workers w
               WHERE w.expires_at > __now__ AND :queue = ANY (w.queues));

-- name: kind_limits_set(kind, concurrency, rate, per)
-- Set (NULL: clear) a kind's limits, across every queue it runs on.
INSERT INTO __schema__.cyclone_kind_limits AS k (kind, concurrency, rate, per)
VALUES (:kind, :concurrency, :rate, :per)
ON CONFLICT (kind) DO UPDATE
SET concurrency = excluded.concurrency, rate = excluded.rate, per = excluded.per,
    version = k.version + 1, updated_at = __now__,
    tokens = CASE WHEN (k.rate, k.per) IS NOT DISTINCT FROM (excluded.rate, excluded.per)
                  THEN k.tokens ELSE 0 END,
    refilled_at = CASE WHEN (k.rate, k.per) IS NOT DISTINCT FROM (excluded.rate, excluded.per)
                       THEN k.refilled_at ELSE __now__ END;

-- name: kind_limits_list
-- Every kind with a limit, by name.
SELECT kind, concurrency, rate, per FROM __schema__.cyclone_kind_limits
WHERE concurrency IS NOT NULL OR rate IS NOT NULL
ORDER BY kind;

