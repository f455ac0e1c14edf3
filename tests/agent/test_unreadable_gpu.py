"""A GPU whose NVML reads all fail is never reported PASS (reference/nvml.md §4.1, §6:
a transient failure keeps the last good value; with none, the GPU is not known healthy)."""

from __future__ import annotations

from dataclasses import fields

from agent.gpu import Failed, NvmlCode
from agent.health_signals import NOT_READINGS
from statemachine.commands import HealthStatus
from tests.agent.samples import GPU, clean_sample, feed

FAILED = Failed(NvmlCode.UNKNOWN, "Unknown Error")


def _all_failed() -> dict[str, Failed]:
    return {field.name: FAILED for field in fields(clean_sample())
            if field.name not in NOT_READINGS}


def test_a_first_sample_whose_every_read_failed_is_not_a_pass() -> None:
    gpu = feed(sampled=False)
    verdict = gpu.sample(**_all_failed())
    assert verdict.status is not HealthStatus.PASS, verdict


def test_the_registration_reading_of_an_unreadable_gpu_is_not_a_pass() -> None:
    gpu = feed(sampled=False)
    gpu.sample(**_all_failed())
    assert [report.status for report in (v.report() for v in gpu.tracker.verdicts())
            if report.uuid == GPU] != [HealthStatus.PASS]
