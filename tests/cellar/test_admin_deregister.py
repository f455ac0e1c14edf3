"""`cellar admin` issues every admin node command, Deregister included (it had none)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from cellar import ops_cli
from cellar.cli import main
from statemachine.codec import decode_command
from statemachine.commands import Deregister
from statemachine.result_codec import encode_result
from statemachine.results import Done


@pytest.mark.parametrize(("argv", "expected"), [
    (["deregister", "n3"], Deregister(node="n3", force=False)),
    (["deregister", "n3", "--force"], Deregister(node="n3", force=True)),
])
def test_cellar_admin_deregisters_a_node(argv: list[str], expected: Deregister,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Deregister is an admin command (statemachine/authorization.py; README: "forced, it
    releases the gangs there"), and GpuStore has it, but `cellar admin` had no action for
    it: an operator could not forget a node (or force its gangs off) from the CLI."""
    sent: list[Any] = []

    class Client:
        async def propose(self, body: bytes, **_: Any) -> bytes:
            sent.append(decode_command(body))
            return encode_result(Done(note="ok"))

    @contextlib.asynccontextmanager
    async def here(args: Any) -> AsyncIterator[Client]:
        yield Client()

    monkeypatch.setattr(ops_cli, "client_from", here)
    assert main(["admin", "--insecure", "--endpoints", "127.0.0.1:1", *argv]) == 0
    assert sent == [expected]
