"""Reading processes from /proc: the stat parser against awkward command names, and liveness
by pid and start time (the guard against pid reuse)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from agent import procfs

STAT = ("4242 (a) b (c) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 "
        "1000 50 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0")


def test_the_stat_parser_counts_fields_after_the_last_parenthesis() -> None:
    stat = procfs.parse_stat(4242, STAT)
    assert stat == procfs.ProcStat(pid=4242, state="S", ppid=1, pgid=4242, sid=4242,
                                   start_ticks=987654)
    assert stat.running


def test_zombies_are_not_running() -> None:
    assert not procfs.parse_stat(1, STAT.replace(") S ", ") Z ")).running


def test_this_process_is_alive_only_with_its_own_start_time() -> None:
    stat = procfs.read_stat(os.getpid())
    assert stat is not None
    assert stat.pgid == os.getpgrp()
    assert procfs.is_alive(os.getpid(), stat.start_ticks)
    assert not procfs.is_alive(os.getpid(), stat.start_ticks + 1)


def test_a_missing_process_reads_as_none() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert procfs.read_stat(child.pid) is None
    assert procfs.start_ticks(child.pid) is None


def test_job_members_include_a_descendant_in_a_session_of_its_own() -> None:
    script = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
              "'import os, time; os.setsid(); time.sleep(30)']); time.sleep(30)")
    leader = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    members: dict[int, procfs.ProcStat] = {}
    try:
        ticks = procfs.start_ticks(leader.pid)
        assert ticks is not None
        deadline = time.monotonic() + 10
        while not any(stat.sid != leader.pid for stat in members.values()):
            assert time.monotonic() < deadline, members
            time.sleep(0.01)
            members = procfs.job_members(leader.pid, ticks, leader.pid)
        assert leader.pid in members
        assert len(members) == 2
        assert not procfs.job_members(leader.pid, ticks + 1, leader.pid)  # another process
    finally:
        for pid in members:
            os.kill(pid, signal.SIGKILL)
        leader.kill()
        leader.wait()
