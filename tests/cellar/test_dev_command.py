"""`cellar dev`, the README's main job, as a user runs it: real replica processes, a bounded
run that exits 0 with a summary, failover on request, Ctrl-C or SIGTERM as clean as the
timeout, and a data directory it cannot use refused in one line."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from cellar.cli import main
from tests.cellar.leftovers import kill_leftovers

SMALL = ["--nodes", "4", "--gangs", "4"]


def dev(workdir: pathlib.Path, *args: str) -> subprocess.Popen[str]:
    """`cellar dev` started in `workdir` with a relative data directory, as `make demo` does,
    and with Ctrl-C's default meaning, as in a terminal: a shell without job control starts
    its background commands with SIGINT ignored, and a test run started that way would pass
    that on."""
    return subprocess.Popen([sys.executable, "-m", "cellar", "dev", "--data-dir", "dev-data",
                             *SMALL, *args], cwd=workdir, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1",
                                 "PYTHONFAULTHANDLER": "1"},
                            preexec_fn=_default_sigint)  # noqa: PLW1509 - pytest runs no other thread


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.timeout(90)
def test_a_bounded_run_with_a_sequencer_kill_exits_cleanly(tmp_path: pathlib.Path) -> None:
    output, _ = dev(tmp_path, "--seconds", "9", "--kill-sequencer").communicate(timeout=80)
    assert "Traceback" not in output, output
    summary = output[output.index("\nsummary"):]
    assert "client calls" in summary and "gangs:" in summary
    assert "killed with SIGKILL: commits resumed" in summary, output
    assert "restarted replica" in output


@pytest.mark.timeout(90)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_or_sigterm_stops_everything_and_still_summarises(
        tmp_path: pathlib.Path, signum: signal.Signals) -> None:
    """SIGTERM (a service manager, `kill`) stops as cleanly as Ctrl-C: its default would kill
    `cellar dev` alone and leave its replicas running."""
    process = dev(tmp_path, "--seconds", "60")
    assert process.stdout is not None
    deadline = time.monotonic() + 40
    while "commits/s" not in process.stdout.readline():
        assert time.monotonic() < deadline and process.poll() is None
    process.send_signal(signum)
    try:
        rest, _ = process.communicate(timeout=40)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)  # the fault handler prints every thread's stack
        stuck, _ = process.communicate(timeout=20)
        kill_leftovers(tmp_path)
        pytest.fail(f"cellar dev still running 40 s after {signum.name}:\n{stuck[-20000:]}")
    replicas = kill_leftovers(tmp_path)
    assert process.returncode == 0, rest
    assert "interrupted" in rest and "\nsummary" in rest and "Traceback" not in rest
    assert replicas == "", "replica processes outlived cellar dev"


@pytest.mark.parametrize("under", ["", "sub"], ids=["the-file", "below-the-file"])
def test_a_data_dir_that_is_a_regular_file_is_refused_in_one_line(
        tmp_path: pathlib.Path, under: str, capsys: pytest.CaptureFixture[str]) -> None:
    afile = tmp_path / "afile"
    afile.write_text("not a directory")
    data_dir = afile / under if under else afile
    assert main(["dev", "--data-dir", str(data_dir), *SMALL]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing started
    assert captured.err == (f"cellar dev: --data-dir {data_dir}: cannot write "
                            f"{data_dir / 'cluster'}: Not a directory\n")
    assert afile.read_text() == "not a directory"
