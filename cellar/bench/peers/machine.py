"""What `cellar bench peers` records about the machine it ran on: CPU, cores, kernel, Python,
and the disk under the directory the clusters write to (what their syncs cost depends on it)."""

from __future__ import annotations

import os
import pathlib
import platform
import shutil

CPUINFO = pathlib.Path("/proc/cpuinfo")
MOUNTS = pathlib.Path("/proc/mounts")


def machine_info(data_dir: pathlib.Path) -> dict[str, object]:
    return {"cpu_model": cpu_model(), "cores": os.cpu_count(), "kernel": platform.release(),
            "system": platform.system(), "python": platform.python_version(),
            "disk": disk_info(data_dir)}


def cpu_model() -> str | None:
    try:
        text = CPUINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return platform.processor() or None
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in {"model name", "Model", "cpu model"}:
            return value.strip()
    return platform.processor() or None


def disk_info(directory: pathlib.Path) -> dict[str, object]:
    """The mount holding `directory` (device, filesystem) and the space free on it."""
    resolved = directory.resolve()
    info: dict[str, object] = {"path": str(resolved)}
    try:
        mounts = [line.split()[:3] for line in MOUNTS.read_text(encoding="utf-8").splitlines()]
    except OSError:
        mounts = []
    matching = [entry for entry in mounts if len(entry) == 3
                and resolved.is_relative_to(entry[1])]
    if matching:
        device, mount_point, filesystem = max(matching, key=lambda entry: len(entry[1]))
        info |= {"device": device, "mount_point": mount_point, "filesystem": filesystem}
    try:
        info["free_gb"] = round(shutil.disk_usage(resolved).free / 1e9, 1)
    except OSError:
        info["free_gb"] = None
    return info
