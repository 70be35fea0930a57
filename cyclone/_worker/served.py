"""What a worker is configured to serve: refuse what it could never claim, and warn (once
per process) about what its configuration may not mean."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from cyclone._model.errors import InvalidInputError
from cyclone._model.steps import Step
from cyclone._model.workflows import Workflow, defined_workflows

logger = logging.getLogger("cyclone")

# Warnings about a worker's configuration already given in this process, said once each.
_WARNED: set[str] = set()


def gather(
    steps: Sequence[Step[Any, Any]], workflows: Sequence[Workflow[Any]]
) -> tuple[dict[str, Step[Any, Any]], dict[str, Step[Any, Any]], dict[str, Workflow[Any]]]:
    """What a worker given ``steps`` and ``workflows`` serves: the steps given themselves,
    every step by its name (the workflows' too), and every workflow by its name (a
    workflow's child workflows too: its child nodes wait on them)."""
    served: dict[str, Step[Any, Any]] = {}
    by_name: dict[str, Workflow[Any]] = {}

    def add(s: Step[Any, Any]) -> None:
        if not isinstance(s, Step):
            raise InvalidInputError(f"{s!r} is not a step with a handler")
        existing = served.get(s.name)
        if existing is not None and existing is not s:
            raise InvalidInputError(f"two different steps are named {s.name!r}")
        served[s.name] = s

    for s in steps:
        add(s)
    given = dict(served)
    for wf in [*workflows, *(child for parent in workflows for child in parent.children())]:
        if wf.name in by_name and by_name[wf.name] is not wf:
            raise InvalidInputError(f"two workflows named {wf.name!r}")
        by_name[wf.name] = wf
        for s in wf.steps():
            add(s)
    if not served:
        raise InvalidInputError("a worker needs at least one step or workflow")
    return given, served, by_name


def check_served(
    given: Mapping[str, Step[Any, Any]],
    queues: Mapping[str, int],
    workflows: Mapping[str, Workflow[Any]],
) -> None:
    """Refuse what a worker could never claim; warn (once) about what it may not mean.

    A queue in ``queues=`` that no step uses is allowed: jobs enqueued with ``queue=``
    run there.
    """
    for step in given.values():
        if step.queue not in queues:
            raise InvalidInputError(
                f"step {step.name!r} runs on queue {step.queue!r}, which queues= leaves "
                f"out: add {_entries([step.queue])} to queues=, or leave queues= unset"
            )
    for wf in workflows.values():
        used_queues = {s.queue for s in wf.steps()}
        missing = sorted(used_queues - set(queues))
        if missing and len(missing) == len(used_queues):
            raise InvalidInputError(
                f"workflow {wf.name!r} runs on {_names('queue', missing)}, which queues= "
                f"leaves out: add {_entries(missing)} to queues=, or leave queues= unset"
            )
        if missing:
            warn_once(
                f"worker serves workflow {wf.name!r} but queues= leaves out its "
                f"{_names('queue', missing)}: those nodes wait for another worker with "
                f"workflows=[{wf.name}] that claims from them"
            )
    for wf in defined_workflows():
        if wf.name in workflows:
            continue
        used = sorted({n.kind.name for n in wf.nodes if n.kind is not None} & set(given))
        if used:
            warn_once(
                f"worker serves {_names('step', used)} but not workflow {wf.name!r}, "
                f"which uses {'it' if len(used) == 1 else 'them'}: its nodes wait for "
                f"a worker with workflows=[{wf.name}]"
            )


def _names(word: str, names: Sequence[str]) -> str:
    """``queue 'mail'``, or ``queues 'mail', 'bulk'``."""
    return f"{word}{'s' if len(names) > 1 else ''} {', '.join(repr(n) for n in names)}"


def _entries(queues: Sequence[str]) -> str:
    """``"mail": N, "bulk": N``: what to add to ``queues=``."""
    return ", ".join(f'"{q}": N' for q in queues)


def warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        logger.warning(message)
