"""The operator commands against a live cluster: status, apply-config, cordon, queries; and the
configuration file reader's errors."""

from __future__ import annotations

import json
import pathlib

import pytest

from cellar.cli import main
from cellar.local_cluster import Layout, ProcessCluster
from cellar.spec_file import SpecFileError, load_spec

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "cluster.toml"


def test_the_example_configuration_loads() -> None:
    spec = load_spec(EXAMPLE)
    assert [cell.nodes for cell in spec.physical_cells] == [("node-00", "node-01"),
                                                          ("node-02", "node-03")]
    assert spec.virtual_clusters[1].quota == ()


@pytest.mark.parametrize(("text", "message"), [
    ("gpu_models = 3", "spec.gpu_models"),
    ("physical_cells = []\n[[gpu_models]]\nname = 'A100'",
     r"spec\.gpu_models\[0\]\.memory_mib: missing"),
    ("gpu_models = []\ncell_types = []", "spec.physical_cells: missing"),
    ("gpu_models = = 1", "not valid TOML"),
])
def test_bad_configuration_files_name_the_path(tmp_path: pathlib.Path, text: str,
                                               message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(SpecFileError, match=message):
        load_spec(path)


@pytest.mark.live
def test_status_and_admin_against_a_live_cluster(tmp_path: pathlib.Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    layout = Layout(tmp_path / "cluster", 3, loop="asyncio")
    layout.write(admins=["root"])
    cluster = ProcessCluster(layout)
    cluster.start()
    try:
        cluster.wait_ports()
        connection = ["--config", str(layout.config_path(0)), "--certs", str(layout.certs),
                      "--as", "admin:root"]
        assert main(["admin", *connection, "apply-config", str(EXAMPLE)]) == 0
        assert json.loads(capsys.readouterr().out)["version"] == 1
        assert main(["admin", *connection, "apply-config", str(EXAMPLE)]) == 1
        assert "version_mismatch" in capsys.readouterr().out
        assert main(["admin", *connection, "cordon", "node-01"]) == 0
        capsys.readouterr()
        assert main(["admin", *connection, "stats"]) == 0
        assert json.loads(capsys.readouterr().out)["gpus"] == 32
        assert main(["status", *connection, "--json"]) == 0
        replicas = json.loads(capsys.readouterr().out)["replicas"]
        assert sum(replica["is_sequencer"] for replica in replicas) == 1
        cluster.processes[1].kill()
        assert main(["status", *connection]) == 0
        table = capsys.readouterr().out.splitlines()
        assert len(table) == 4 and sum("down" in line for line in table) == 1
    finally:
        cluster.stop()
