"""A binding: one pod the store placed on this node, with its GPUs, its command and its
environment, and the checks and environment the runner derives from it.

The store's env may already carry `CUDA_VISIBLE_DEVICES`; the runner sets it again from
`gpu_uuids` so that it is never unset (unset means every GPU on the node, reference/nvml.md
section 3.2) and never disagrees with the GPUs the store granted. `CUDA_DEVICE_ORDER=PCI_BUS_ID`
makes any index the job uses match NVML's order. `CELLAR_POD_UID` marks the job's processes
(their children inherit it): for a job found dead after an agent restart, the runner stops
only processes that carry the mark, so a stranger that reused the job's first pid as its group
or session id is never taken for a leftover of the job (`procfs.job_members`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from agent.job_limits import JobLimits

VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
DEVICE_ORDER = "CUDA_DEVICE_ORDER"
POD_UID_MARK = "CELLAR_POD_UID"


@dataclass(frozen=True, slots=True, kw_only=True)
class Binding:
    group: str
    pod_uid: str
    gpu_uuids: tuple[str, ...]  # full UUIDs ("GPU-…" or "MIG-…"); empty for a CPU-only job
    command: tuple[str, ...]  # argv; argv[0] without a slash is looked up in PATH
    env: tuple[tuple[str, str], ...] = ()  # from the store, set over the agent's environment


def job_environment(binding: Binding, inherited: Mapping[str, str]) -> dict[str, str]:
    """The agent's environment, the binding's over it, and the GPU variables over both."""
    env = dict(inherited)
    env.update(binding.env)
    env[VISIBLE_DEVICES] = ",".join(binding.gpu_uuids)  # "" for no GPUs: never unset
    env[DEVICE_ORDER] = "PCI_BUS_ID"
    env[POD_UID_MARK] = binding.pod_uid
    return env


def refusal(binding: Binding, local_uuids: Collection[str], limits: JobLimits) -> str | None:
    """Why the binding cannot run on this node, or None when it can."""
    return (_names_refusal(binding, limits) or _gpus_refusal(binding, local_uuids)
            or _command_refusal(binding.command, limits) or _env_refusal(binding.env, limits)
            or _total_refusal(binding, limits))


def _names_refusal(binding: Binding, limits: JobLimits) -> str | None:
    for what, name in (("pod uid", binding.pod_uid), ("group", binding.group)):
        if not name:
            return f"the {what} is empty"
        if _size(name) > limits.name_bytes_max:
            return f"the {what} is over {limits.name_bytes_max} bytes"
        if "\0" in name:
            return f"the {what} holds a NUL character"
    return None


def _gpus_refusal(binding: Binding, local_uuids: Collection[str]) -> str | None:
    if len(set(binding.gpu_uuids)) != len(binding.gpu_uuids):
        return "a GPU is named twice"
    unknown = sorted(uuid for uuid in binding.gpu_uuids if uuid not in local_uuids)
    if unknown:
        return f"GPU {', '.join(unknown)} is not on this node"
    return None


def _command_refusal(command: tuple[str, ...], limits: JobLimits) -> str | None:
    if not command or not command[0]:
        return "the command is empty"
    if len(command) > limits.args_max:
        return f"the command has {len(command)} arguments, over {limits.args_max}"
    for index, arg in enumerate(command):
        if "\0" in arg:
            return f"argument {index} holds a NUL character"
        if _size(arg) > limits.arg_bytes_max:
            return f"argument {index} is over {limits.arg_bytes_max} bytes"
    return None


def _env_refusal(env: tuple[tuple[str, str], ...], limits: JobLimits) -> str | None:
    if len(env) > limits.env_vars_max:
        return f"the binding sets {len(env)} variables, over {limits.env_vars_max}"
    for name, value in env:
        if not name or "=" in name or "\0" in name:
            return f"environment variable name {name!r} is not valid"
        if "\0" in value:
            return f"environment variable {name} holds a NUL character"
        if _size(name) + _size(value) > limits.arg_bytes_max:
            return f"environment variable {name} is over {limits.arg_bytes_max} bytes"
    return None


def _total_refusal(binding: Binding, limits: JobLimits) -> str | None:
    total = sum(_size(arg) + 1 for arg in binding.command)
    total += sum(_size(name) + _size(value) + 2 for name, value in binding.env)
    if total > limits.command_bytes_max:
        return f"the command and environment take {total} bytes, over " \
               f"{limits.command_bytes_max}"
    return None


def _size(text: str) -> int:
    return len(text.encode("utf-8", "surrogateescape"))
