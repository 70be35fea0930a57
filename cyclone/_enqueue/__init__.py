"""The insert path: plans checked before any write, the targets that write them (Cyclone's
own statement, the caller's transaction, the completion transaction) and the wakeups
they send after commit."""
