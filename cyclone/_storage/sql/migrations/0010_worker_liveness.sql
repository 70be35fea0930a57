-- Rescue by liveness (docs/operations.md, "When a worker dies"): a worker holds a
-- session-level advisory lock for as long as it lives, on a session of its own, and names
-- the lock in its presence row. When no session holds the lock named by a live row, the
-- worker's session ended: its peers release its tasks at once instead of waiting out their
-- leases. NULL for a worker that holds none (an older release, or one without a session of
-- its own behind a pooler): its tasks wait for their leases, as before. Nullable: adding it
-- rewrites nothing, and the previous release's workers keep writing their rows without it.
ALTER TABLE __schema__.cyclone_workers ADD COLUMN liveness integer;
