"""What ``mypy --strict`` says about code that calls Cyclone; checked by mypy, never run.

Each file is user code: ``assert_type`` pins what a call gives, and a ``# type: ignore[code]``
marks a call that must stay an error (``warn_unused_ignores`` fails the check if it is not).
``tests/unit/test_typing.py`` checks these files as a user's project would, outside the repo.
"""
