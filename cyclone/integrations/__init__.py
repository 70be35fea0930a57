"""Glue for the transactions an application already has: SQLAlchemy sessions and Django.

Nothing here needs importing: ``*_tx`` calls recognise a SQLAlchemy session or connection and
Django's connection themselves (docs/integrations.md).
"""
