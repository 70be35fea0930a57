"""The distribution as users get it: an sdist and a wheel built from this checkout, and fresh
virtualenvs that install the wheel with its dependencies from the package index.

pytest loads the plugin of every installed distribution that declares a ``pytest11`` entry
point, so installing cyclone-pg must leave a project that never uses the test kit exactly as
it was: no pytest-asyncio required, no line printed, no server started.
"""

from __future__ import annotations

import email.parser
import email.policy
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from cyclone.testing import PostgresServer
from tests.conftest import ROOT

# Building and installing from the index take a minute or two on a loaded 2-core machine.
pytestmark = pytest.mark.timeout(900)
STEP_TIMEOUT = 600  # seconds for one pip or build command

INSTALL_TESTING = "pip install 'cyclone-pg[testing]'"
UNRELATED = "def test_adds():\n    assert 1 + 1 == 2\n"
USES_THE_KIT = """
async def test_sees_a_migrated_database(cyclone_env):
    assert await cyclone_env.pool.fetchval("SELECT count(*) FROM public.cyclone_runs") == 0
"""
ASYNCIO_AUTO = """
[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
"""
# What a working tree collects beside its sources; none of it may reach the sdist.
ARTEFACTS = [
    ".hypothesis/examples/0f/1e",
    ".pytest_cache/v/cache/lastfailed",
    ".mypy_cache/3.11/cyclone.meta.json",
    ".ruff_cache/0.6.0/123",
    ".venv/pyvenv.cfg",
    ".nox/tests/pyvenv.cfg",
    "site/index.html",
    "dist/cyclone_pg-0.0.1.tar.gz",
    "build/lib/cyclone/__init__.py",
    "tests/.hypothesis/examples/ab/cd",
    "cyclone/__pycache__/_client.cpython-311.pyc",
]
UNSHIPPED = {
    ".hypothesis",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".venv",
    ".nox",
    "site",
    "dist",
    "build",
    "__pycache__",
    ".git",
}
CLASSIFIERS = {
    "Framework :: AsyncIO",
    "Framework :: Pytest",
    "Operating System :: POSIX",
    "Programming Language :: Python :: 3.11",
    "Typing :: Typed",
}


def run(
    argv: list[str], *, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a command to its end; stdout and stderr together in ``.stdout``."""
    return subprocess.run(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=STEP_TIMEOUT,
        check=False,
    )


def checked(argv: list[str], *, cwd: Path) -> str:
    """Run a command that must succeed; its output."""
    proc = run(argv, cwd=cwd)
    assert proc.returncode == 0, f"{argv} exited {proc.returncode}:\n{proc.stdout}"
    return proc.stdout


def new_venv(path: Path) -> Path:
    """A fresh virtualenv with nothing but pip; its python."""
    checked([sys.executable, "-m", "venv", str(path)], cwd=path.parent)
    return path / "bin" / "python"


def user_env(**extra: str) -> dict[str, str]:
    """This process's environment without what would steer a user's pytest session."""
    steering = {"CYCLONE_TEST_DSN", "PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTHONPATH"}
    env = {k: v for k, v in os.environ.items() if k not in steering}
    return env | extra


def project(path: Path, files: dict[str, str]) -> Path:
    """A directory holding a user's project: just the given files."""
    path.mkdir()
    for name, text in files.items():
        (path / name).write_text(text)
    return path


def pytest_in(python: Path, where: Path, env: dict[str, str]) -> tuple[int, str]:
    proc = run([str(python), "-m", "pytest", "-p", "no:cacheprovider"], cwd=where, env=env)
    return proc.returncode, proc.stdout


@dataclass(frozen=True)
class Built:
    """The distributions built from a copy of the checkout."""

    sdist: Path
    wheel: Path
    tree: Path  # the copy they were built from, artefacts and all


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Skip when pip cannot reach a package index (every test here installs from one)."""
    where = tmp_path_factory.mktemp("probe")
    proc = run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(where), "pytest"],
        cwd=where,
    )
    if proc.returncode:
        pytest.skip(f"pip cannot reach a package index: {proc.stdout.strip()[-500:]}")


def copy_of_the_checkout(into: Path) -> Path:
    """The working tree without version control, virtualenvs and caches."""
    top_level = {".git", ".venv", ".nox", "site", "dist", "build"}

    def ignore(directory: str, names: list[str]) -> set[str]:
        skipped = {n for n in names if n in UNSHIPPED - top_level or n.endswith(".egg-info")}
        if Path(directory) == ROOT:
            skipped |= top_level & set(names)
        return skipped

    return Path(shutil.copytree(ROOT, into, ignore=ignore))


@pytest.fixture(scope="module")
def built(index: None, tmp_path_factory: pytest.TempPathFactory) -> Built:
    """An sdist of a copy of the checkout that has collected every kind of artefact, and a
    wheel built from that sdist (so the sdist holds all a build needs)."""
    base = tmp_path_factory.mktemp("build")
    tree = copy_of_the_checkout(base / "tree")
    for name in ARTEFACTS:
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text("left by a run\n")
    # The project's own configuration keeps them out, not a .gitignore that may not be there.
    (tree / ".gitignore").unlink()
    python = new_venv(base / "venv")
    checked([str(python), "-m", "pip", "install", "-q", "hatchling"], cwd=base)
    out = base / "dist"
    checked([str(python), "-m", "hatchling", "build", "-t", "sdist", "-d", str(out)], cwd=tree)
    [sdist] = out.glob("*.tar.gz")
    with tarfile.open(sdist) as archive:
        archive.extractall(base / "unpacked", filter="data")
    [unpacked] = (base / "unpacked").iterdir()
    checked([str(python), "-m", "hatchling", "build", "-t", "wheel", "-d", str(out)], cwd=unpacked)
    [wheel] = out.glob("*.whl")
    return Built(sdist=sdist, wheel=wheel, tree=tree)


@pytest.fixture(scope="module")
def bare_venv(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with only cyclone-pg (and its dependencies) and pytest; its python."""
    base = tmp_path_factory.mktemp("bare")
    python = new_venv(base / "venv")
    checked([str(python), "-m", "pip", "install", "-q", str(built.wheel), "pytest"], cwd=base)
    return python


@pytest.fixture
def sdist_names(built: Built) -> list[str]:
    """The sdist's files, relative to its top directory."""
    with tarfile.open(built.sdist) as archive:
        return [name.split("/", 1)[1] for name in archive.getnames() if "/" in name]


def test_an_unrelated_project_runs_green_beside_cyclone_pg(bare_venv: Path, tmp_path: Path) -> None:
    # The case that matters: pytest-asyncio is absent, and the plugin loads all the same.
    probe = run([str(bare_venv), "-c", "import pytest_asyncio"], cwd=tmp_path)
    assert probe.returncode == 1 and "No module named 'pytest_asyncio'" in probe.stdout
    where = project(tmp_path / "app", {"test_app.py": UNRELATED})
    code, out = pytest_in(bare_venv, where, user_env())
    assert code == 0, out
    assert "1 passed" in out
    assert "plugins: cyclone-pg-" in out  # pytest did load the plugin
    assert not [line for line in out.splitlines() if line.startswith("cyclone:")], out


def test_the_kit_without_pytest_asyncio_says_what_to_install(
    bare_venv: Path, tmp_path: Path
) -> None:
    where = project(tmp_path / "app", {"test_app.py": USES_THE_KIT})
    code, out = pytest_in(bare_venv, where, user_env())
    assert code == 1, out
    assert (
        "cyclone_env is an asyncio fixture and needs pytest-asyncio, which is not installed:"
        f" {INSTALL_TESTING}"
    ) in out
    assert "1 error" in out
    assert not [line for line in out.splitlines() if line.startswith("cyclone:")], out


def test_the_testing_extra_is_all_a_users_test_kit_needs(
    built: Built, tmp_path: Path, cyclone_server: PostgresServer
) -> None:
    python = new_venv(tmp_path / "venv")
    checked([str(python), "-m", "pip", "install", "-q", f"{built.wheel}[testing]"], cwd=tmp_path)
    where = project(tmp_path / "app", {"pytest.ini": ASYNCIO_AUTO, "test_app.py": USES_THE_KIT})
    code, out = pytest_in(python, where, user_env(CYCLONE_TEST_DSN=cyclone_server.dsn))
    assert code == 0, out
    assert "1 passed" in out
    assert "cyclone: tests ran on PostgreSQL " in out
    assert " from CYCLONE_TEST_DSN at " in out


def test_the_sdist_carries_the_license_and_no_artefacts(
    built: Built, sdist_names: list[str]
) -> None:
    shipped_artefacts = [
        name for name in sdist_names if UNSHIPPED & set(Path(name).parts) or name.endswith(".pyc")
    ]
    assert shipped_artefacts == []
    assert {"LICENSE", "README.md", "pyproject.toml", "PKG-INFO"} <= set(sdist_names)
    sources = {
        path.relative_to(built.tree).as_posix()
        for path in (built.tree / "cyclone").rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    assert sources <= set(sdist_names)
    with tarfile.open(built.sdist) as archive:
        member = archive.extractfile(f"{built.sdist.name.removesuffix('.tar.gz')}/LICENSE")
        assert member is not None
        assert member.read() == (ROOT / "LICENSE").read_bytes()


def test_the_license_file_is_the_apache_license() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "END OF TERMS AND CONDITIONS" in text
    assert "APPENDIX: How to apply the Apache License to your work." in text


def test_the_wheel_declares_license_classifiers_and_the_slim_extra(built: Built) -> None:
    with zipfile.ZipFile(built.wheel) as archive:
        names = archive.namelist()
        [metadata_name] = [n for n in names if n.endswith(".dist-info/METADATA")]
        dist_info = metadata_name.removesuffix("METADATA")
        metadata = email.parser.BytesParser(policy=email.policy.compat32).parsebytes(
            archive.read(metadata_name)
        )
        assert archive.read(f"{dist_info}licenses/LICENSE") == (ROOT / "LICENSE").read_bytes()
        entry_points = archive.read(f"{dist_info}entry_points.txt").decode()
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata.get_all("License-File") == ["LICENSE"]
    assert metadata["Author"] == "Cyclone contributors"
    assert metadata["Keywords"]
    assert set(metadata.get_all("Classifier") or []) >= CLASSIFIERS
    assert "cyclone/py.typed" in names
    assert "[pytest11]\ncyclone = cyclone.testing.plugin" in entry_points
    testing = sorted(
        r.split(";")[0]
        for r in metadata.get_all("Requires-Dist") or []
        if "extra == 'testing'" in r
    )
    assert testing == ["pytest-asyncio>=0.24", "pytest>=8"]


def test_the_gitignore_keeps_hypothesis_examples_out_of_git() -> None:
    assert ".hypothesis/" in (ROOT / ".gitignore").read_text().splitlines()


# Put first on the path, it makes `import pytest_asyncio` fail as for a package that is not
# installed, whichever import hooks pytest adds.
NO_PYTEST_ASYNCIO = (
    "raise ModuleNotFoundError(\"No module named 'pytest_asyncio'\", name='pytest_asyncio')\n"
)


@pytest.mark.parametrize(
    ("test_file", "exit_code", "expected"),
    [
        (UNRELATED, 0, "1 passed"),
        (USES_THE_KIT, 1, f"needs pytest-asyncio, which is not installed: {INSTALL_TESTING}"),
    ],
    ids=["unrelated", "uses-the-kit"],
)
def test_the_plugin_loads_here_with_pytest_asyncio_hidden(
    tmp_path: Path, test_file: str, exit_code: int, expected: str
) -> None:
    """The same two cases in this virtualenv, needing no index: pytest-asyncio is hidden for
    one session instead of being uninstalled."""
    shadow = tmp_path / "shadow" / "pytest_asyncio"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(NO_PYTEST_ASYNCIO)
    where = project(tmp_path / "app", {"test_app.py": test_file})
    # -p no:asyncio: pytest does not load pytest-asyncio's own entry point either. ROOT on the
    # path: the plugin comes from this checkout, whatever is installed.
    proc = run(
        [sys.executable, "-m", "pytest", "-p", "no:asyncio", "-p", "no:cacheprovider"],
        cwd=where,
        env=user_env(PYTHONPATH=os.pathsep.join([str(shadow.parent), str(ROOT)])),
    )
    assert proc.returncode == exit_code, proc.stdout
    assert expected in proc.stdout
    assert not [line for line in proc.stdout.splitlines() if line.startswith("cyclone:")]
