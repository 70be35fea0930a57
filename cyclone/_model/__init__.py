"""Definitions: what users declare and read (steps, workflows, schedules, options,
keys, the codec, errors, states, run handles). Nothing here sends a statement."""
