"""After a job is killed: waiting until NVML shows none of its processes on its GPUs.

A CUDA context can outlive its process for a while (the driver tears it down and frees the
memory), and a GPU still holding one must not be handed to the next job. The job's processes
are known by pid and start time; NVML lists host pids (reference/nvml.md section 3.3). A listed
pid counts as the job's when /proc has no such process any more (a context left behind) or has
it with the recorded start time; a listed pid that /proc shows with another start time is a new
process that reused the number, not the job's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

import anyio

from agent import procfs
from agent.gpu import GpuGone, GpuProcess, NvmlCode, NvmlUnavailable, ReadFailed
from agent.job_outcomes import GpuRelease


class GpuProcesses(Protocol):
    """The part of `agent.gpu.GpuBackend` a stop needs (the call blocks, as NVML does)."""

    def processes(self, uuid: str) -> tuple[GpuProcess, ...]: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class ReleaseCheck:
    release: GpuRelease
    lingering_pids: tuple[int, ...] = ()
    lingering_by_gpu: tuple[tuple[str, tuple[int, ...]], ...] = ()  # (uuid, sorted pids)
    detail: str = ""


async def wait_released(gpus: GpuProcesses, uuids: tuple[str, ...], pids: Mapping[int, int],
                        *, timeout_s: float, poll_s: float) -> ReleaseCheck:
    """Poll the GPUs until none lists one of `pids` (pid to start ticks), up to `timeout_s`. A
    process list that fails to read is retried until then (UNCHECKED if it never reads); one
    the GPU does not offer, or a GPU or NVML gone, ends the wait at once as UNCHECKED."""
    if not uuids:
        return ReleaseCheck(release=GpuRelease.NO_GPUS)
    deadline = anyio.current_time() + timeout_s
    while True:
        try:
            by_gpu = await anyio.to_thread.run_sync(_lingering, gpus, uuids, pids)
            failure = None
        except (NvmlUnavailable, GpuGone) as error:
            return _unchecked(error)
        except ReadFailed as error:
            if error.code == NvmlCode.NOT_SUPPORTED:
                return _unchecked(error)
            by_gpu, failure = (), error
        if not by_gpu and failure is None:
            return ReleaseCheck(release=GpuRelease.RELEASED)
        remaining_s = deadline - anyio.current_time()
        if remaining_s <= 0:
            if failure is not None:
                return _unchecked(failure)
            lingering = tuple(sorted({pid for _, on_gpu in by_gpu for pid in on_gpu}))
            return ReleaseCheck(release=GpuRelease.LINGERING, lingering_pids=lingering,
                                lingering_by_gpu=by_gpu,
                                detail=f"still on the GPUs after {timeout_s} s")
        await anyio.sleep(min(poll_s, remaining_s))


def _unchecked(error: Exception) -> ReleaseCheck:
    return ReleaseCheck(release=GpuRelease.UNCHECKED, detail=f"cannot check the GPUs: {error}")


def lingering_pids(listed: Iterable[int], pids: Mapping[int, int]) -> tuple[int, ...]:
    """The listed pids that are still the job's (`pids`: pid to start ticks): /proc has no
    such process any more, or has it with the recorded start ticks (reads /proc)."""
    return tuple(sorted(pid for pid in set(listed) & pids.keys()
                        if procfs.start_ticks(pid) in (None, pids[pid])))


def _lingering(gpus: GpuProcesses, uuids: tuple[str, ...], pids: Mapping[int, int]
               ) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """Per GPU that lists any, the job's pids on it, by uuid."""
    by_gpu = ((uuid, lingering_pids((process.pid for process in gpus.processes(uuid)), pids))
              for uuid in sorted(uuids))
    return tuple((uuid, on_gpu) for uuid, on_gpu in by_gpu if on_gpu)
