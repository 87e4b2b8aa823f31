"""The README's examples run as written: every ```python block, and every `sdm` line of its
```sh blocks, from a fresh working directory that holds the bundled traces and scenarios (as the
repository root does)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from sdm.cli import main

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", README, flags=re.M | re.S)


def commands() -> list[str]:
    """``sdm ...`` lines of the sh blocks. ``make run`` and ``make test`` are left out: CI runs
    those targets themselves, and ``make run`` is ``sdm run``, walked in test_cli_walk.py."""
    lines = [line.strip() for block in blocks("sh") for line in block.splitlines()]
    assert {line for line in lines if not line.startswith("sdm ")} <= {
        line for line in lines if line.startswith("make ")}, "a README command neither sdm nor make"
    return [line for line in lines if line.startswith("sdm ")]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    (tmp_path / "traces").symlink_to(ROOT / "traces", target_is_directory=True)
    (tmp_path / "scenarios").symlink_to(ROOT / "scenarios", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_readme_has_examples():
    assert len(blocks("python")) >= 3 and len(commands()) >= 10
    named = {line.split()[1] for line in commands()}
    assert {"store", "replay", "place", "sweep", "trace", "report", "devices"} <= named


@pytest.mark.parametrize("index", range(len(blocks("python"))))
def test_python_examples_run(workdir, index, capsys):
    code = blocks("python")[index]
    exec(compile(code, f"README.md python block {index}", "exec"), {"__name__": "__readme__"})
    capsys.readouterr()


def test_shell_session_runs_in_order(workdir, capsys):
    for line in commands():
        code = main(shlex.split(line)[1:])
        out, err = capsys.readouterr()
        assert code == 0, f"{line}\n{err}"
        assert "Traceback" not in err, line
    assert (workdir / "emb.sdm" / "manifest.json").is_file() and (workdir / "report" / "report.md").is_file()


@pytest.mark.slow
def test_make_run_prints_what_the_readme_shows(workdir, capsys):
    """`make run` is `sdm run`: its first line and its identity line are the README's, word for
    word (the replay is deterministic; the table between them is this machine's speed)."""
    shown = re.search(r"^```\n(sdm run: .*?)^```", README, flags=re.M | re.S).group(1).splitlines()
    assert main(["run", "--no-report"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == shown[0]
    assert next(line for line in printed if line.startswith("pooled results")) == \
        next(line for line in shown if line.startswith("pooled results"))
