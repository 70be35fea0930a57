-- Telling a dead worker from a dropped connection, and the evidence of each rescue
-- (docs/operations.md, "When a worker dies"). A worker's liveness lock may be free for a
-- moment while it lives (its session was cut and it takes the lock again on a new one), so
-- its peers release its tasks only once the lock has stayed free for its grace, or at once
-- when they know its process is gone. All nullable: adding them rewrites nothing, and the
-- previous release's workers keep writing their rows without them (their tasks are then
-- released as that release did: as soon as their lock is free).
ALTER TABLE __schema__.cyclone_workers
    ADD COLUMN backend integer,            -- the server pid of its liveness session
    ADD COLUMN machine text,               -- where its pid names a process: boot and pid namespace
    ADD COLUMN grace real,                 -- seconds its lock may stay free before a release
    ADD COLUMN lock_free_since timestamptz, -- when a peer first saw its lock free; NULL while held
    ADD COLUMN released_at timestamptz,    -- when a peer last released its tasks as lost
    ADD COLUMN released_by text;           -- and which worker did
