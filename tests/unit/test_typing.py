"""The typing suite (tests/typing) is clean under mypy --strict, run as a user's project would.

The files are copied out of the repository, so mypy finds ``cyclone`` the way it does in a
user's project: through the installed package (with the editable install, a plain ``.pth``
path). A negative case that stops being an error fails too (``warn_unused_ignores``).
"""

from __future__ import annotations

import inspect
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import cyclone
from cyclone._model.options import parse
from tests.conftest import ROOT

TYPING = ROOT / "tests" / "typing"


@pytest.mark.timeout(600)  # a cold mypy run checks the package too; the machine may be busy
def test_typing_suite_is_clean_outside_the_repo(tmp_path: Path) -> None:
    project = tmp_path / "userproject"
    project.mkdir()
    files = []
    for source in sorted(TYPING.glob("*.py")):
        if source.name != "__init__.py":
            files.append(shutil.copy(source, project / source.name))
    assert len(files) >= 3, f"no typing suite in {TYPING}"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--python-version=3.11",
            f"--cache-dir={tmp_path / 'cache'}",
            "--no-error-summary",
            *map(str, files),
        ],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=550,
        check=False,
    )
    assert result.returncode == 0, (
        "mypy --strict on tests/typing, as a user's project outside the repository:\n"
        + result.stdout
        + result.stderr
    )


def test_typed_options_are_the_options_checked_at_run_time() -> None:
    checked = set(inspect.signature(parse).parameters)
    assert cyclone.EnqueueOptions.__optional_keys__ == checked
    assert cyclone.EnqueueManyOptions.__optional_keys__ == checked - {
        "unique",
        "debounce",
        "throttle",
    }
    assert cyclone.SubmitOptions.__optional_keys__ < checked
    assert not cyclone.EnqueueOptions.__required_keys__
    assert not cyclone.SubmitOptions.__required_keys__
