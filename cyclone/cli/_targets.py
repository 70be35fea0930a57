"""What ``cyclone worker TARGET`` runs: MODULE:OBJECT loaded, then read as steps and
workflows or as a factory of a Worker, with one clear failure for anything else."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

from cyclone._client import Client
from cyclone._model.steps import Step
from cyclone._model.workflows import Workflow
from cyclone._worker.worker import Worker
from cyclone.cli._common import Failure

_ACCEPTED = (
    "a step, a workflow, a list of them, or a function that takes the client and returns "
    "a cyclone.Worker"
)


def load(target: str) -> Any:
    """The object MODULE:OBJECT names (OBJECT may be dotted)."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise Failure(f"{target!r} is not MODULE:OBJECT")
    # The console script's sys.path starts with its own folder: put the current one first,
    # as `python -m`, uvicorn and celery do, so `cyclone worker myjobs:WORK` finds myjobs.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise Failure(f"cannot import {module_name}: {exc}") from None
    obj: Any = module
    try:
        for part in attr.split("."):  # MODULE:OBJECT.ATTRIBUTE, as uvicorn takes it
            obj = getattr(obj, part)
    except AttributeError:
        raise Failure(f"{module_name} has no {attr!r}") from None
    return obj


def describe(obj: Any) -> str:
    """What ``obj`` is, in a few words, for an error message."""
    if inspect.isfunction(obj) or inspect.isclass(obj) or inspect.ismethod(obj):
        try:
            sig = inspect.signature(obj)
        except (TypeError, ValueError):  # some builtins have none
            signature = "(...)"
        else:  # the parameters, without their annotations
            bare = [p.replace(annotation=p.empty) for p in sig.parameters.values()]
            signature = str(sig.replace(parameters=bare, return_annotation=sig.empty))
        return f"{type(obj).__name__} {obj.__qualname__}{signature}"
    text = repr(obj)
    return f"{type(obj).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def _takes_client(obj: Any) -> bool:
    try:
        inspect.signature(obj).bind(None)
    except TypeError:
        return False
    except ValueError:  # no signature to read: let the call tell
        return True
    return True


def read_target(target: str, obj: Any) -> list[Any] | Callable[[Client], Any]:
    """The steps and workflows ``obj`` names, or the factory it is; else one clear Failure."""
    if isinstance(obj, Step | Workflow):
        return [obj]
    if isinstance(obj, list | tuple | set | frozenset):
        others = [i for i in obj if not isinstance(i, Step | Workflow)]
        if obj and not others:
            return list(obj)
        kind = type(obj).__name__
        found = f"a {kind} holding {describe(others[0])}" if others else f"an empty {kind}"
    elif isinstance(obj, Worker):
        found = "a Worker built at import time, which cannot use this command's pool"
    elif callable(obj) and _takes_client(obj):
        factory: Callable[[Client], Any] = obj
        return factory
    elif callable(obj):
        found = f"{describe(obj)}, which cannot be called with the client"
    else:
        found = describe(obj)
    raise Failure(f"{target} is {found}; give {_ACCEPTED}")


def steps_of(items: list[Any]) -> list[Step[Any, Any]]:
    """The steps among ``items`` and in its workflows."""
    steps = [i for i in items if isinstance(i, Step)]
    for wf in items:
        if isinstance(wf, Workflow):
            steps.extend(wf.steps())
    return steps


def parse_queues(text: str | None) -> dict[str, int] | None:
    """``--queues orders=16,default=4`` as queue limits; None when not given."""
    if not text:
        return None
    queues = {}
    for part in text.split(","):
        name, _, limit = part.partition("=")
        if not name or not limit.isdigit() or int(limit) < 1:
            raise Failure(f"--queues: {part!r} is not QUEUE=LIMIT")
        queues[name.strip()] = int(limit)
    return queues
