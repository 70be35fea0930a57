"""Services: what a client is made of (connections and transactions, NOTIFY after commit,
the LISTEN connection, run reads and actions, queue settings, multi-statement
transitions, start-up checks, metrics hooks), on asyncpg and on psycopg."""
