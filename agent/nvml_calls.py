"""Calls into a pynvml module object, with NVML errors turned into values once.

`NvmlCalls` wraps the module `NvmlBackend` was given (the real pynvml, or a test's fake). A call
names one or more functions, newest first: a function the driver lacks (FunctionNotFound; or
NVMLLibraryMismatchError, pynvml's way of saying it for an unversioned process-list call whose
_v3 is missing) or the binding lacks (no such attribute, an old nvidia-ml-py) is remembered as
missing until the next `start()`, and the next name is tried. An NVML error becomes a
`NvmlCallError` carrying its code (`NVMLError.value`, never `==` on the exception), or, for
reads of one GPU, the reading the policy of agent.nvml_policy gives it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from agent.gpu import Failed, NvmlCode, Reading, Unsupported
from agent.nvml_policy import describe, reading_outcome


class NvmlCallError(Exception):
    """An NVML call failed with this return code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{message} ({code})")
        self.code = code
        self.message = message


class _NeverRaised(Exception):
    """Stands for NVMLLibraryMismatchError in bindings that do not have it."""


def to_int(result: Any) -> int:
    return int(result)


class NvmlCalls:
    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self._version_mismatch: type[Exception] = getattr(
            nvml, "NVMLLibraryMismatchError", _NeverRaised)
        self._lock = threading.Lock()
        self._missing: set[str] = set()

    def forget_missing(self) -> None:
        """After a (re)start the driver may be another one: probe every function again."""
        with self._lock:
            self._missing.clear()

    def lacks(self, name: str) -> bool:
        with self._lock:
            return name in self._missing

    def call(self, names: tuple[str, ...], *args: Any) -> Any:
        """The result of the first of `names` the driver has; raises NvmlCallError."""
        for name in names:
            function = self._function(name)
            if function is None:
                continue
            try:
                return function(*args)
            except self._version_mismatch:
                pass  # pynvml's unversioned wrappers say FunctionNotFound this way
            except self.nvml.NVMLError as error:
                code = int(getattr(error, "value", NvmlCode.UNKNOWN))
                if code != NvmlCode.FUNCTION_NOT_FOUND:
                    raise NvmlCallError(code, _message(error, code)) from error
            with self._lock:
                self._missing.add(name)
        code = NvmlCode.FUNCTION_NOT_FOUND
        raise NvmlCallError(code, f"{describe(code)}: {' / '.join(names)}")

    def attempt(self, uuid: str, names: tuple[str, ...], *args: Any,
                link_probe: bool = False) -> Any:
        """`call` on one GPU: its result, or the UNSUPPORTED / Failed the error policy gives;
        raises GpuGone and NvmlUnavailable for device and node faults."""
        try:
            return self.call(names, *args)
        except NvmlCallError as error:
            return reading_outcome(uuid, error.code, error.message, link_probe=link_probe)

    def reading(self, uuid: str, names: tuple[str, ...], *args: Any,
                extract: Callable[[Any], int] = to_int, link_probe: bool = False) -> Reading:
        """One reading of one GPU: `extract` applied to the result of the call."""
        result = self.attempt(uuid, names, *args, link_probe=link_probe)
        if isinstance(result, Unsupported | Failed):
            return result
        return extract(result)

    def _function(self, name: str) -> Callable[..., Any] | None:
        with self._lock:
            if name in self._missing:
                return None
        function = getattr(self.nvml, name, None)
        if function is None:
            with self._lock:
                self._missing.add(name)
        return function


def _message(error: BaseException, code: int) -> str:
    try:
        return str(error)
    except Exception:  # pynvml formats codes it does not know through the library
        return describe(code)
