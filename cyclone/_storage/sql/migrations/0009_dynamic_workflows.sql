-- Workflows shaped at run time (docs/workflows.md): map nodes, which grow one item node per
-- element of a list when they are reached; branches, edges taken only when their parent's
-- output is a given value, with skipped nodes; child nodes, which submit a run of another
-- workflow and complete with its result. Every column is new, nullable or of a constant
-- default: adding them rewrites nothing.

-- spec: a map node's settings ({"map": {...}}) or a node's join ({"join": "any", ...}); NULL
-- for a plain step or wait node. An item node has map_of (its map node), item (its index)
-- and input (its element). A map node counts its items: items (how many), items_left (not
-- settled yet), next_item (the index of the first one not released yet). skips counts the
-- parents that are done without taking their edge to the node. A child node has child_run:
-- the run it submitted last.
ALTER TABLE __schema__.cyclone_steps
    ADD COLUMN spec jsonb,
    ADD COLUMN map_of text,
    ADD COLUMN item integer,
    ADD COLUMN input jsonb,
    ADD COLUMN items integer,
    ADD COLUMN items_left integer,
    ADD COLUMN next_item integer,
    ADD COLUMN skips integer NOT NULL DEFAULT 0,
    ADD COLUMN child_run uuid;

-- A child run's parent: the run and the child node that submitted it. The index finds a run's
-- children (to cancel them with it); it holds child runs only.
ALTER TABLE __schema__.cyclone_runs
    ADD COLUMN parent_run uuid,
    ADD COLUMN parent_node text;
CREATE INDEX idx_runs_parent ON __schema__.cyclone_runs (parent_run, parent_node)
    WHERE parent_run IS NOT NULL;

-- skipped: a node not run, because a branch before it was not taken. NOT VALID: every row
-- holds one of the old states, which stay allowed, so the history is not scanned under the
-- migration's lock (new rows are checked all the same).
ALTER TABLE __schema__.cyclone_steps DROP CONSTRAINT cyclone_steps_state_check;
ALTER TABLE __schema__.cyclone_steps ADD CONSTRAINT cyclone_steps_state_check
    CHECK (state IN ('pending', 'queued', 'waiting', 'completed', 'failed', 'cancelled',
                     'skipped')) NOT VALID;

-- The parent output (as jsonb) that an edge is taken on; NULL: taken whenever the parent
-- completes.
ALTER TABLE __schema__.cyclone_edges ADD COLUMN cond jsonb;

-- An item node's task carries its element, which the claim hands over as the input.
ALTER TABLE __schema__.cyclone_tasks ADD COLUMN input jsonb;
