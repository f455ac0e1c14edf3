"""Bindings: the checks before a launch and the environment a job gets."""

from __future__ import annotations

import pytest

from agent.binding import Binding, job_environment, refusal
from agent.job_limits import JobLimits

LIMITS = JobLimits(args_max=4, arg_bytes_max=16, command_bytes_max=40, env_vars_max=2,
                   name_bytes_max=8, jobs_max=2, logs_kept_max=2)
LOCAL = {"GPU-a", "GPU-b"}


def job(**changes: object) -> Binding:
    fields: dict[str, object] = {"group": "g", "pod_uid": "p", "gpu_uuids": ("GPU-a",),
                                 "command": ("run",), "env": ()}
    fields.update(changes)
    return Binding(**fields)  # type: ignore[arg-type]


def test_a_valid_binding_is_not_refused() -> None:
    assert refusal(job(), LOCAL, LIMITS) is None
    assert refusal(job(gpu_uuids=()), LOCAL, LIMITS) is None


@pytest.mark.parametrize(("changes", "reason"), [
    ({"pod_uid": ""}, "the pod uid is empty"),
    ({"group": "g" * 9}, "the group is over 8 bytes"),
    ({"gpu_uuids": ("GPU-c",)}, "GPU GPU-c is not on this node"),
    ({"gpu_uuids": ("GPU-a", "GPU-a")}, "a GPU is named twice"),
    ({"command": ()}, "the command is empty"),
    ({"command": ("",)}, "the command is empty"),
    ({"command": ("a",) * 5}, "the command has 5 arguments, over 4"),
    ({"command": ("a", "b\0")}, "argument 1 holds a NUL character"),
    ({"command": ("a", "é" * 9)}, "argument 1 is over 16 bytes"),
    ({"env": (("A", "1"),) * 3}, "the binding sets 3 variables, over 2"),
    ({"env": (("A=B", "1"),)}, "environment variable name 'A=B' is not valid"),
    ({"command": ("a" * 15, "b" * 15, "c" * 15)}, "the command and environment take 48 "
                                                  "bytes, over 40"),
])
def test_bindings_are_refused_with_a_reason(changes: dict[str, object], reason: str) -> None:
    assert refusal(job(**changes), LOCAL, LIMITS) == reason


def test_the_environment_names_the_gpus_whatever_the_store_said() -> None:
    env = job_environment(job(gpu_uuids=("GPU-b", "GPU-a"),
                              env=(("CUDA_VISIBLE_DEVICES", "all"), ("X", "1"))),
                          {"PATH": "/bin", "X": "0"})
    assert env == {"PATH": "/bin", "X": "1", "CUDA_VISIBLE_DEVICES": "GPU-b,GPU-a",
                   "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CELLAR_POD_UID": "p"}
    assert job_environment(job(gpu_uuids=()), {})["CUDA_VISIBLE_DEVICES"] == ""


@pytest.mark.parametrize(("changes", "message"), [
    ({"jobs_max": 0}, "jobs_max must be at least 1"),
    ({"grace_s": -1.0}, "grace_s must not be negative"),
    ({"gpu_poll_s": 0.0}, "gpu_poll_s must be positive"),
    ({"arg_bytes_max": 1 << 20}, "cannot be passed to exec"),
    ({"logs_kept_max": 10, "jobs_max": 20}, "logs_kept_max must cover jobs_max"),
])
def test_limits_that_make_no_sense_are_rejected(changes: dict[str, object], message: str
                                                ) -> None:
    with pytest.raises(ValueError, match=message):
        JobLimits(**changes).validate()  # type: ignore[arg-type]
