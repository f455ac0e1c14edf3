"""A replica's file with `insecure = true` beside a `[tls]` table is refused, naming both, as
`check_security` refuses the pair in code: the table was dropped without a word and the replica
served plain TCP to an operator who had written where its certificates are."""

from __future__ import annotations

import pathlib
import tomllib

import pytest

from consensus.runtime.node_config import NodeConfigError, parse_node_config
from tests.consensus.runtime.test_node_config import GOOD


def test_insecure_beside_a_tls_table_is_refused(tmp_path: pathlib.Path) -> None:
    raw = tomllib.loads(GOOD)
    raw["tls"] = {"ca": "ca.pem", "cert": "replica-1.pem", "key": "replica-1.key"}
    with pytest.raises(NodeConfigError, match=r"insecure: .*\[tls\]"):
        parse_node_config(raw, base=tmp_path)


def test_insecure_alone_still_loads(tmp_path: pathlib.Path) -> None:
    config = parse_node_config(tomllib.loads(GOOD), base=tmp_path)
    assert config.insecure and config.tls is None
