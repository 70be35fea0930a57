-- Forked runs (docs/workflows.md, "Forking a run"): a run made from another run's outputs,
-- re-running one node and what comes after it. Every column is new and nullable: adding them
-- rewrites nothing, and the previous release's statements leave them out.

-- A fork's origin: the run it was forked from and the node it re-ran from. The index finds a
-- run's forks (run.info().forks); it holds forked runs only, none when the migration runs.
ALTER TABLE __schema__.cyclone_runs
    ADD COLUMN forked_from uuid,
    ADD COLUMN forked_node text;
CREATE INDEX idx_runs_forked ON __schema__.cyclone_runs (forked_from)
    WHERE forked_from IS NOT NULL;
