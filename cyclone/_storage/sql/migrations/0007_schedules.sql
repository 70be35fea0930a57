-- Schedules: one row per schedule, declared in code by workers or created at run time.
--
-- A slot's run is not recorded here: it is the run whose key is schedule:<name>:<slot>, made
-- by a keyed insert on idx_runs_submit_key, so one run exists per slot whoever fires it. This
-- row only says which slot is next (next_at), so the timers know when to wake.
CREATE TABLE __schema__.cyclone_schedules (
    name            text PRIMARY KEY,
    target          text NOT NULL,            -- the step kind or workflow name each slot runs
    job             boolean NOT NULL,         -- a standalone job (else a workflow run)
    cron            text,                     -- five fields or an alias, read in tz
    every           interval,                 -- or slots start + k * every
    start_at        timestamptz,              -- every='s anchor (NULL: the Unix epoch)
    tz              text NOT NULL,
    catch_up        text NOT NULL CHECK (catch_up IN ('skip', 'latest', 'all')),
    catch_up_window interval,
    overlap         text NOT NULL CHECK (overlap IN ('allow', 'skip')),
    input           jsonb,                    -- NULL: declared with an input function
    -- Dynamic rows were created through the API and live until deleted; declared rows are
    -- fired only by workers that declare them, and say until when one did (declared_until).
    dynamic         boolean NOT NULL,
    declared_until  timestamptz,
    paused          boolean NOT NULL DEFAULT false,
    next_at         timestamptz NOT NULL,     -- the oldest slot not fired yet
    last_slot       timestamptz,              -- the newest slot a run was made for
    last_run_id     uuid,                     -- that run, for the overlap policy
    triggered_at    timestamptz,              -- a trigger not fired yet
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    CHECK ((cron IS NULL) <> (every IS NULL))
);
