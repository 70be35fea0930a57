-- Applying migrations (cyclone.Client.migrate): under a lock per schema, the versions not
-- yet recorded in the schema's cyclone_migrations table are applied in order.

-- name: migrations_lock(schema)
-- One migrating transaction per schema at a time. Tried, not waited for: a session waiting in
-- a statement holds a snapshot, and a concurrent index build waits for every snapshot older
-- than its own, so a migrator waiting for the lock of one building an index would deadlock.
SELECT pg_try_advisory_xact_lock(1668899692, hashtext(:schema));

-- name: migrations_lock_timeout(timeout)
-- For the rest of the migrating transaction, give up a lock not granted within :timeout
-- (text, such as '1s'): a DDL statement waiting for its table's lock queues every claim,
-- enqueue and heartbeat behind it, so it waits a moment at most, and migrate tries again.
SELECT set_config('lock_timeout', :timeout, true);

-- name: schema_create
CREATE SCHEMA IF NOT EXISTS __schema__;

-- name: migrations_table
CREATE TABLE IF NOT EXISTS __schema__.cyclone_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: migrations_applied
SELECT version FROM __schema__.cyclone_migrations ORDER BY version;

-- name: migrations_record(version, name)
INSERT INTO __schema__.cyclone_migrations (version, name) VALUES (:version, :name);


-- name: migrations_session_lock(schema)
-- The same lock for a concurrent migration, which runs outside a transaction: held by the
-- session until migrations_session_unlock, tried rather than waited for (see migrations_lock).
SELECT pg_try_advisory_lock(1668899692, hashtext(:schema));

-- name: migrations_session_unlock(schema)
SELECT pg_advisory_unlock(1668899692, hashtext(:schema));

-- name: index_invalid(schema, index)
-- Whether the schema has an index of this name left invalid by a concurrent build that
-- failed (IF NOT EXISTS would keep it as it is).
SELECT EXISTS (
    SELECT FROM pg_index i
    JOIN pg_class c ON c.oid = i.indexrelid
    JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = :schema AND c.relname = :index AND NOT i.indisvalid
);
