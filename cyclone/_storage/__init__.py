"""Storage: the SQL loader, the named statements and migrations (``sql/``) and the typed
functions that send them (``queries``)."""
