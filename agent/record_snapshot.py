"""`python -m agent.record_snapshot OUT.json`: record this machine's GPUs through NVML into a
snapshot file that `FakeGpuBackend.from_snapshot` replays (reference/nvml.md §4.3, §8)."""

from __future__ import annotations

import json
import pathlib
import sys
from collections.abc import Sequence

from agent.gpu import NvmlUnavailable
from agent.gpu_snapshot import record_snapshot
from agent.nvml_backend import NvmlBackend

EXIT_USAGE = 2
EXIT_NVML_UNAVAILABLE = 3


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    # an option is no file name: `--help` once went to NVML, and on a GPU machine into "--help"
    if len(arguments) != 1 or arguments[0].startswith("-"):
        sys.stderr.write("usage: python -m agent.record_snapshot OUT.json\n")
        return 0 if arguments in (["-h"], ["--help"]) else EXIT_USAGE
    backend = NvmlBackend()
    try:
        backend.start()
    except NvmlUnavailable as error:
        sys.stderr.write(f"cannot record: {error}\n")
        return EXIT_NVML_UNAVAILABLE
    try:
        document = record_snapshot(backend)
    finally:
        backend.stop()
    pathlib.Path(arguments[0]).write_text(json.dumps(document, indent=1) + "\n",
                                          encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
