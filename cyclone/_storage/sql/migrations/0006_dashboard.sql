-- Finished workflow nodes by the time they ended, for the dashboard's per-minute completions
-- and failures (throughput_minutes) and the stats' last minute, without reading every step
-- ever kept. One entry per node that ends; jobs are counted from idx_runs_finished.
CREATE INDEX idx_steps_finished ON __schema__.cyclone_steps (finished_at)
    WHERE state IN ('completed', 'failed') AND kind IS NOT NULL;
