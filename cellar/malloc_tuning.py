"""The C allocator's settings of Cellar's busy processes: replicas and load generators.

A replica's commands of 1 KB puts are about 200 KiB each, and every one is copied several times
on its way (the frame read, the decoded message, the log record, the body the machine decodes).
Python takes any object over 512 bytes from the C allocator. glibc's allocator hands memory
back to the kernel when enough is free at the top of its heap (`M_TRIM_THRESHOLD`) and serves
large blocks with `mmap`, unmapped again on free; so a burst of commands in flight was
allocated, freed and returned, and the next burst faulted every page in afresh: the kernel
zeroes each page it maps (`clear_page`), and in a virtual machine that reports freed pages to
its host, a page mapped again costs the host's fault as well. At 1 KB puts that made up to 14 %
of all the machine's samples (`perf record -a`) and tripled the replicas' system CPU a put.

`keep_freed_memory()` keeps what the process frees for its next use: blocks up to
`MMAP_THRESHOLD_BYTES` come from the heap, and the heap is trimmed only past
`TRIM_THRESHOLD_BYTES` free at its top. A process's resident memory then stays at its
high-water mark, which is what a server sized for its load has anyway. It applies to the whole
process and cannot be undone, so only the processes Cellar owns call it (the replica daemon and
the benchmarks' load generators); a library does not change its host's allocator. Elsewhere
than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import platform

# mallopt's parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's own cap on this setting on 64-bit systems
TRIM_THRESHOLD_BYTES = 1 << 30


def keep_freed_memory() -> bool:
    """Set this process's allocator to keep freed memory (module docstring); whether it was
    set (False where the C library is not glibc)."""
    if platform.libc_ver()[0] != "glibc":
        return False
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
                and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
