"""``python -m cyclone``: the same as the ``cyclone`` command."""

from cyclone.cli import main

main()
