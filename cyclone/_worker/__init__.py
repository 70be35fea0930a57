"""The worker: the claim loop, attempts, outcomes, leases, maintenance and the schedule
timer."""
