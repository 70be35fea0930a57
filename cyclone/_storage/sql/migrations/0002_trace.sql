-- The trace context of the code that enqueued or submitted a run, so that its handlers'
-- spans join the same trace (see cyclone.otel).
ALTER TABLE __schema__.cyclone_runs ADD COLUMN trace jsonb;
