"""The lean cold path (issue 11): `drover --version` and `drover --help` import the standard library only -- the
help is typer's own text, cached per version, CLI source and width -- and nothing heavier than a command needs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.support.imports import foreign, importtime_modules

HEAVY = ("typer", "click", "rich", "pydantic", "asyncssh", "tomlkit", "drover.cli", "drover.ops")


def drover(*args: str, columns: int = 100, importtime: bool = False) -> tuple[int, str, set[str]]:
    """Run `python -m drover ARGS` (the console script's front); (exit code, stdout, modules imported)."""
    flags = ["-X", "importtime"] if importtime else []
    proc = subprocess.run(
        [sys.executable, *flags, "-m", "drover", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": str(columns)},
        cwd=str(ROOT),
    )
    return proc.returncode, proc.stdout, importtime_modules(proc.stderr)


def typer_help(columns: int) -> str:
    """What typer itself prints for `drover --help`, without the front."""
    code = "from drover.cli.main import main; raise SystemExit(main(['--help']))"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": str(columns)},
        cwd=str(ROOT),
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_version_imports_only_the_standard_library() -> None:
    import drover as pkg

    code, out, imported = drover("--version", importtime=True)
    assert code == 0 and out == f"drover {pkg.__version__}\n"
    assert foreign(imported) == set(), foreign(imported)


@pytest.mark.parametrize("columns", [100, 60])
def test_help_is_typers_text_and_cached_it_imports_only_the_standard_library(columns: int, isolated: Path) -> None:
    expected = typer_help(columns)
    assert "Usage: drover" in expected and "Exit codes" in expected
    code, first, imported = drover("--help", columns=columns, importtime=True)
    assert code == 0 and first == expected
    assert any(m.startswith("typer") for m in imported)  # a miss: typer rendered it once
    cached = list((isolated / "home").glob("help-*.txt"))
    assert len(cached) == 1 and (cached[0].stat().st_mode & 0o777) == 0o600
    code, second, imported = drover("--help", columns=columns, importtime=True)
    assert code == 0 and second == expected
    assert foreign(imported) == set(), foreign(imported)
    assert not [m for m in imported if m.startswith(HEAVY)]
    assert drover("-h", columns=columns)[1] == expected


def test_a_help_cache_someone_else_could_write_is_ignored(isolated: Path) -> None:
    expected = typer_help(100)
    assert drover("--help")[1] == expected
    (cached,) = (isolated / "home").glob("help-*.txt")
    cached.write_text("\x1b]0;owned\x07 forged help\n", encoding="utf-8")
    cached.chmod(0o666)
    assert drover("--help")[1] == expected  # not the forged text: rendered again (and saved afresh)
    (cached,) = (isolated / "home").glob("help-*.txt")
    assert (cached.stat().st_mode & 0o777) == 0o600 and cached.read_text(encoding="utf-8") == expected
    cached.unlink()
    target = isolated / "elsewhere.txt"
    target.write_text("forged through a link\n", encoding="utf-8")
    cached.symlink_to(target)
    assert drover("--help")[1] == expected


def test_commands_that_are_not_hot_still_run_the_full_cli(isolated: Path) -> None:
    code, out, imported = drover("fleet", "show", "--json", importtime=True)
    assert code == 0 and '"op": "fleet.show"' in out
    assert "asyncssh" not in imported  # nor does a local command pay for SSH


def test_a_closed_stdout_or_stderr_runs_nothing_and_says_so_in_one_line(isolated: Path) -> None:
    for redirect, shown in ((">&-", "stderr"), ("2>&-", "stdout")):
        proc = subprocess.run(
            ["sh", "-c", f'exec "$0" -m drover send local:nobody hello {redirect}', sys.executable],
            capture_output=False,
            stdout=subprocess.PIPE if shown == "stdout" else None,
            stderr=subprocess.PIPE if shown == "stderr" else None,
            timeout=60,
            cwd=str(ROOT),
        )
        said = (proc.stdout if shown == "stdout" else proc.stderr).decode()
        assert proc.returncode == 2 and said.startswith("drover: standard ") and said.count("\n") == 1, said
        assert "Traceback" not in said
    assert not (isolated / "home" / "truth.jsonl").exists()  # nothing was recorded, nothing sent
