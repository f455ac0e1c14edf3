"""The layering and purity rules of DESIGN.md, checked on the source with `ast`.

- Imports point down: cellar > jepsen > agent > statemachine > consensus.
- The pure parts (the consensus core, the state machine but for its store facade, the
  simulator, the agent's GPU model and health policy) import no I/O, no clock, no threads
  and no global random.
- msgpack is imported only by codec modules; pynvml only by the agent's NVML backend.
- Functions stay short enough to read at once.
"""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Iterator

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("cellar", "jepsen", "agent", "statemachine", "consensus")
# Each package may import only the packages after it in PACKAGES.
BANNED_ABOVE = {name: set(PACKAGES[: index + 1]) - {name} for index, name in
                enumerate(PACKAGES)}

IO_MODULES = {
    "trio", "anyio", "asyncio", "uvloop", "socket", "ssl", "selectors", "time", "datetime",
    "threading", "multiprocessing", "concurrent", "subprocess", "os", "sys", "random", "secrets",
    "pynvml", "sqlite3", "io", "shutil", "signal", "tempfile", "pathlib", "uuid",
}
# Pure code: the consensus core, the state machine, the simulator, the agent's GPU model and
# health policy. These prefixes are the runtime parts allowed to do I/O.
PURE_PACKAGES = ("consensus", "statemachine", "jepsen/sim", "agent/gpu.py", "agent/health")
IMPURE_ALLOWED = ("consensus/runtime/", "statemachine/store", "jepsen/sim/cli.py")
PYNVML_ALLOWED = ("agent/nvml_backend.py",)
FUNCTION_LINES_MAX = 70


def source_files() -> Iterator[pathlib.Path]:
    for package in PACKAGES:
        yield from sorted((ROOT / package).rglob("*.py"))


def relative(path: pathlib.Path) -> str:
    return path.relative_to(ROOT).as_posix()


def imported_roots(tree: ast.AST) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module.split(".")[0]


def is_pure(path: str) -> bool:
    return path.startswith(PURE_PACKAGES) and not path.startswith(IMPURE_ALLOWED)


def is_codec(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return name == "codec.py" or name.endswith("_codec.py")


def violations(path: str, tree: ast.AST) -> Iterator[str]:
    package = path.split("/", 1)[0]
    for line, root in imported_roots(tree):
        where = f"{path}:{line} imports {root}"
        if root in BANNED_ABOVE.get(package, set()):
            yield f"{where}: imports must point down ({' > '.join(PACKAGES)})"
        if is_pure(path) and root in IO_MODULES:
            yield f"{where}: pure code performs no I/O and reads no clock or global random"
        if root == "msgpack" and not is_codec(path):
            yield f"{where}: msgpack belongs in codec modules only"
        if root == "pynvml" and path not in PYNVML_ALLOWED:
            yield f"{where}: pynvml belongs in {PYNVML_ALLOWED[0]} only"


def long_functions(path: str, tree: ast.AST) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            length = node.end_lineno - node.lineno + 1
            if length > FUNCTION_LINES_MAX:
                yield f"{path}:{node.lineno} {node.name} is {length} lines (max " \
                      f"{FUNCTION_LINES_MAX})"


def parsed_sources() -> Iterator[tuple[str, ast.AST]]:
    for file in source_files():
        yield relative(file), ast.parse(file.read_text(encoding="utf-8"), filename=str(file))


def test_imports_follow_the_layering_rules() -> None:
    found = [message for path, tree in parsed_sources() for message in violations(path, tree)]
    assert found == []


def test_functions_are_short() -> None:
    found = [message for path, tree in parsed_sources() for message in
             long_functions(path, tree)]
    assert found == []


def test_every_module_opens_with_a_header() -> None:
    missing = [path for path, tree in parsed_sources()
               if isinstance(tree, ast.Module) and tree.body and ast.get_docstring(tree) is None
               and not path.endswith("__main__.py")]
    assert missing == []


@pytest.mark.parametrize(
    ("path", "source", "expected"),
    [
        ("consensus/replica.py", "import statemachine", "imports must point down"),
        ("consensus/replica.py", "import time", "pure code"),
        ("statemachine/apply.py", "from random import choice", "pure code"),
        ("jepsen/sim/network.py", "import trio", "pure code"),
        ("statemachine/apply.py", "import msgpack", "codec modules only"),
        ("agent/health.py", "import pynvml", "pynvml belongs"),
        ("agent/health.py", "import time", "pure code"),
        ("agent/daemon.py", "from jepsen.history import History", "imports must point down"),
    ],
)
def test_the_rules_reject_bad_imports(path: str, source: str, expected: str) -> None:
    messages = list(violations(path, ast.parse(source)))
    assert any(expected in message for message in messages), messages


@pytest.mark.parametrize(
    ("path", "source"),
    [
        ("consensus/runtime/driver.py", "import anyio"),
        ("consensus/codec.py", "import msgpack"),
        ("statemachine/codec.py", "import msgpack"),
        ("agent/nvml_backend.py", "import pynvml"),
        ("jepsen/checker.py", "import statemachine"),
        ("cellar/cli.py", "import jepsen"),
    ],
)
def test_the_rules_allow_what_the_design_allows(path: str, source: str) -> None:
    assert list(violations(path, ast.parse(source))) == []
