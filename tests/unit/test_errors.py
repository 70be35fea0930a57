"""The CycloneError tree: every error under the group a caller catches, the builtin bases
of old still there, the tree in the module's docstring as it is in code; and the raise sites
that need no database."""

from __future__ import annotations

import inspect
import re

import pytest

import cyclone
from cyclone._model import errors as _errors
from cyclone.testing import new_context

GROUPS: dict[type[cyclone.CycloneError], set[type[cyclone.CycloneError]]] = {
    cyclone.ConflictError: {
        cyclone.SubmitConflictError,
        cyclone.DuplicateError,
        cyclone.KeyContentionError,
    },
    cyclone.RunOutcomeError: {
        cyclone.RunFailedError,
        cyclone.RunCancelledError,
        cyclone.RunExpiredError,
        cyclone.NoOutputError,
    },
    cyclone.NotFoundError: {
        cyclone.RunNotFoundError,
        cyclone.ScheduleNotFoundError,
        cyclone.UnknownQueueError,
        cyclone.UnknownKindError,
        cyclone.UnknownNodeError,
    },
    cyclone.InvalidInputError: {
        cyclone.InvalidKeyError,
        cyclone.InvalidNameError,
        cyclone.InvalidScheduleError,
        cyclone.InvalidLimitError,
        cyclone.InvalidOptionError,
        cyclone.PayloadTooLargeError,
    },
    cyclone.StateError: {
        cyclone.InvalidStateError,
        cyclone.LifecycleError,
        cyclone.NotInTransactionError,
        cyclone.ContextError,
    },
    cyclone.SetupError: {
        cyclone.SchemaNotMigratedError,
        cyclone.SchemaVersionError,
        cyclone.ReadOnlyServerError,
        cyclone.UnsupportedPoolerError,
        cyclone.UnsupportedLayoutError,
        cyclone.KeyringError,
    },
}

# The builtin bases each error had before the groups, which old `except` clauses rely on.
BUILTIN_BASES: dict[type[cyclone.CycloneError], tuple[type[Exception], ...]] = {
    cyclone.InvalidKeyError: (ValueError,),
    cyclone.InvalidInputError: (TypeError,),
    cyclone.InvalidNameError: (TypeError, ValueError),
    cyclone.InvalidLimitError: (TypeError, ValueError),
    cyclone.PayloadTooLargeError: (ValueError,),
    cyclone.KeyContentionError: (RuntimeError,),  # raised as a RuntimeError before
    cyclone.LifecycleError: (RuntimeError,),  # likewise
    cyclone.InvalidOptionError: (ValueError,),  # the dashboard's ValueErrors
}

ERRORS = {
    cls
    for _, cls in inspect.getmembers(_errors, inspect.isclass)
    if issubclass(cls, cyclone.CycloneError)
}


def test_every_error_is_in_exactly_one_group() -> None:
    for group, members in GROUPS.items():
        assert group.__bases__[0] is cyclone.CycloneError
        for member in members:
            assert issubclass(member, group), member
            others = [g for g in GROUPS if g is not group and issubclass(member, g)]
            assert not others, (member, others)
    grouped = set(GROUPS).union(*GROUPS.values())
    assert grouped | {cyclone.CycloneError} == ERRORS


def test_the_builtin_bases_still_hold() -> None:
    for error, bases in BUILTIN_BASES.items():
        for base in bases:
            assert issubclass(error, base), (error, base)
    # Only what was a builtin error before is one now (the groups add none but TypeError).
    for error in ERRORS - set(BUILTIN_BASES) - GROUPS[cyclone.InvalidInputError]:
        assert not issubclass(error, TypeError | ValueError | RuntimeError), error


def test_unknown_node_is_an_unknown_kind() -> None:
    assert issubclass(cyclone.UnknownNodeError, cyclone.UnknownKindError)


def test_the_docstring_draws_the_tree() -> None:
    doc = _errors.__doc__ or ""
    drawn = re.findall(r"^[\s│├└─]*(\w+Error)\b", doc, re.MULTILINE)
    assert sorted(drawn) == sorted(e.__name__ for e in ERRORS)
    depth = {
        name: len(prefix) for prefix, name in re.findall(r"^([\s│├└─]*)(\w+Error)\b", doc, re.M)
    }
    for error in ERRORS - {cyclone.CycloneError}:
        parent = error.__bases__[0]
        assert depth[error.__name__] > depth[parent.__name__], error


def test_every_error_is_exported() -> None:
    assert {e.__name__ for e in ERRORS} <= set(cyclone.__all__)


def test_the_old_messages_are_kept() -> None:
    error = cyclone.KeyContentionError("submit", "k", "checkout")
    assert str(error) == "submit key 'k' of 'checkout' kept changing hands"
    assert (error.key, error.name) == ("k", "checkout")


Cart = int


@cyclone.step("errors.one")
async def one(ctx: cyclone.Context, value: int) -> int:
    return value


def test_a_dependency_on_an_unknown_node() -> None:
    wf = cyclone.define("errors.deps", Cart)
    with pytest.raises(cyclone.UnknownNodeError, match="has no node 'missing'") as caught:
        wf.node(one, name="x", after=["missing"])
    assert caught.value.node == "missing"
    other = cyclone.define("errors.other", Cart)
    with pytest.raises(cyclone.UnknownNodeError):
        wf.node(one, name="y", after=[other.node(one)])


def test_a_result_node_of_another_workflow() -> None:
    typed = cyclone.define_result("errors.typed", Cart, int)
    stranger = cyclone.define("errors.stranger", Cart).node(one)
    with pytest.raises(cyclone.UnknownNodeError, match="is not a node of workflow") as caught:
        typed.set_result(stranger)
    assert caught.value.node == "errors.one"


async def test_the_output_of_an_unknown_dependency() -> None:
    ctx = new_context()
    with pytest.raises(cyclone.UnknownNodeError, match="not a completed dependency") as caught:
        await ctx.output("missing")
    assert caught.value.node == "missing"
