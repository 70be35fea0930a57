-- Where Cyclone's tables live (cyclone/_services/layout.py): on plain PostgreSQL, or local
-- to a Citus coordinator. The catalog tables of Citus exist only where its extension is, so
-- each statement after the first runs only once that one found it.

-- name: layout_citus
SELECT extversion FROM pg_extension WHERE extname = 'citus';

-- name: layout_citus_node(schema)
-- This server's group in the cluster (0: the coordinator), whether this session's catalog
-- queries have Citus's shards filtered out, whether the schema was ever migrated, the
-- cluster's active primary nodes, and Cyclone's tables of the schema that Citus's metadata
-- holds, each as name:method (h: a hash-distributed table; n with replication model t: a
-- reference table; n with s: a table local to the coordinator).
SELECT (SELECT groupid FROM pg_dist_local_group) AS group_id,
       current_setting('citus.override_table_visibility')::bool AS hides_shards,
       to_regclass(format('%I.cyclone_migrations', :schema::text)) IS NOT NULL AS migrated,
       (SELECT count(*) FROM pg_dist_node WHERE isactive AND noderole = 'primary') AS nodes,
       ARRAY(SELECT c.relname || ':' || p.partmethod::text || p.repmodel::text
             FROM pg_dist_partition p
             JOIN pg_class c ON c.oid = p.logicalrelid
             JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = :schema AND c.relname LIKE 'cyclone\_%'
             ORDER BY c.relname) AS tables;

-- name: layout_two_phase_create
-- The table a transaction writes no row of to make Citus commit it in two phases (below),
-- made local to the coordinator in Citus's metadata.
CREATE TABLE IF NOT EXISTS __schema__.cyclone_two_phase (never int);

-- name: layout_two_phase_register
SELECT citus_add_local_table_to_metadata('__schema__.cyclone_two_phase');

-- name: layout_two_phase
-- Citus commits a transaction that wrote one worker node with a plain COMMIT sent to that
-- node before the coordinator commits, and counts no write of a plain coordinator table:
-- were the coordinator's commit to fail then, the node's rows would stay and Cyclone's go.
-- A write to a table in Citus's metadata that is local to the coordinator makes it prepare
-- every node the transaction wrote first, and commit them only once the coordinator has:
-- this statement is such a write, of no row.
UPDATE __schema__.cyclone_two_phase SET never = never WHERE false;
