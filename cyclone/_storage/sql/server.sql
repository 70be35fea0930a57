-- What a worker or command asks about the server it reached before it starts
-- (cyclone/_services/pooler.py): which backend serves it, and what that backend holds.

-- name: server_backend_pid
SELECT pg_backend_pid();

-- name: server_statement_exists(name)
SELECT EXISTS (SELECT FROM pg_prepared_statements WHERE name = :name);
