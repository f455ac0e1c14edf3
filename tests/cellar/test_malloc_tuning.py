"""With the allocator tuned, memory freed is reused without faulting its pages in again.

Each check runs in a fresh interpreter, as the setting holds for the whole process. A burst of
1 MiB objects made, filled and freed, twenty times: untuned, glibc trims its heap after every
burst and the next one faults its pages in again; tuned, only the first burst does.
"""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's allocator")

_BURSTS = 20
_OBJECTS = 16
_PAGES_PER_BURST = _OBJECTS * (1 << 20) // 4096

_SCRIPT = f"""
import resource, sys
from cellar.malloc_tuning import keep_freed_memory
if sys.argv[1] == "tuned":
    assert keep_freed_memory()
def burst():
    held = [b"x" * (1 << 20) for _ in range({_OBJECTS})]  # filled: every page touched
    del held
burst()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range({_BURSTS}):
    burst()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _page_faults(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", _SCRIPT, mode], capture_output=True,
                          text=True, check=True, timeout=60)
    return int(done.stdout)


def test_freed_memory_is_reused_without_faulting_in_again() -> None:
    assert _page_faults("tuned") < _PAGES_PER_BURST  # not one burst's worth in twenty


def test_untuned_the_same_bursts_fault_every_time() -> None:
    # the control: the measurement above tells the two apart
    assert _page_faults("untuned") > _BURSTS * _PAGES_PER_BURST // 2


def test_it_says_it_applied_on_glibc() -> None:
    done = subprocess.run([sys.executable, "-c",
                           "from cellar.malloc_tuning import keep_freed_memory; "
                           "print(keep_freed_memory())"],
                          capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout.strip() == "True"
