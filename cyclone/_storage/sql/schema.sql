-- Applying migrations (cyclone.Client.migrate): under a lock per schema, the versions not
-- yet recorded in the schema's cyclone_migrations table are applied in order.

-- name: migrations_lock(schema)
SELECT pg_advisory_xact_lock(1668899692, hashtext(:schema));

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

