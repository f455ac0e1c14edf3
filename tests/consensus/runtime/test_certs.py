"""`cellar certs`: the files it writes are usable as they are (a three-replica mesh runs on them
and a node agent is known by its own), keys are private, nothing is ever overwritten, and each
certificate carries exactly the names and uses its holder needs."""

from __future__ import annotations

import pathlib
import stat

import anyio
import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from cellar.cli import main
from consensus.runtime.framing import TLS_REFUSED, Metrics
from consensus.runtime.peers import PeerMesh
from consensus.runtime.tls import Identity, IdentityRole, TlsConfig, tls_handshake
from tests.consensus.runtime.test_peers import Inbox, eventually, free_ports, start

pytestmark = pytest.mark.anyio
HOST = "127.0.0.1"



@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    directory = tmp_path_factory.mktemp("made") / "certs"
    status = main(["certs", "init", str(directory), "--replicas", "3", "--node", "gpu-1",
                   "gpu-2", "--scheduler", "sched", "--host", "replicas.example",
                   "--host", "10.0.0.7"])
    assert status == 0
    return directory


def load(path: pathlib.Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_init_writes_a_ca_and_one_pair_per_identity(made: pathlib.Path) -> None:
    stems = ["replica-0", "replica-1", "replica-2", "admin-admin", "scheduler-sched",
             "node-gpu-1", "node-gpu-2"]
    expected = {"ca.pem", "ca.key"} | {f"{stem}.{ext}" for stem in stems for ext in ("pem", "key")}
    assert {path.name for path in made.iterdir()} == expected
    for path in made.glob("*.key"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_each_certificate_names_its_holder_and_uses(made: pathlib.Path) -> None:
    replica = load(made / "replica-1.pem")
    names = replica.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.UniformResourceIdentifier) == ["cellar://replica/1"]
    assert names.get_values_for_type(x509.DNSName) == ["replicas.example"]
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["10.0.0.7"]
    node = load(made / "node-gpu-2.pem")
    node_names = node.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(name.value) for name in node_names] == ["cellar://node/gpu-2"]  # no hosts
    usages = {path: load(made / path).extensions.get_extension_for_class(
        x509.ExtendedKeyUsage).value for path in ("replica-0.pem", "node-gpu-1.pem")}
    assert ExtendedKeyUsageOID.SERVER_AUTH in usages["replica-0.pem"]
    assert ExtendedKeyUsageOID.SERVER_AUTH not in usages["node-gpu-1.pem"]
    assert ExtendedKeyUsageOID.CLIENT_AUTH in usages["node-gpu-1.pem"]
    assert load(made / "ca.pem").extensions.get_extension_for_class(
        x509.BasicConstraints).value.ca
    assert node.issuer == load(made / "ca.pem").subject


def test_nothing_is_overwritten(made: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = {path.name: path.read_bytes() for path in made.iterdir()}
    assert main(["certs", "init", str(made)]) == 1
    assert main(["certs", "issue", str(made), "--node", "gpu-1"]) == 1
    assert "exists" in capsys.readouterr().err
    assert {path.name: path.read_bytes() for path in made.iterdir()} == before


def test_issue_adds_with_the_same_ca(tmp_path: pathlib.Path) -> None:
    assert main(["certs", "init", str(tmp_path), "--replicas", "1"]) == 0
    assert main(["certs", "issue", str(tmp_path), "--node", "late-node"]) == 0
    assert load(tmp_path / "node-late-node.pem").issuer == load(tmp_path / "ca.pem").subject
    assert main(["certs", "issue", str(tmp_path)]) == 1  # nothing named
    assert main(["certs", "issue", str(tmp_path), "--node", "bad/name"]) == 1
    assert not list(tmp_path.glob("*bad*"))


def test_one_replicas_certificate_is_renewed_or_added(tmp_path: pathlib.Path) -> None:
    """`issue --replicas N` names replicas 0 to N-1 and refuses where any exists, so one
    replica's certificate could be neither renewed nor added: `--replica ID` issues one."""
    assert main(["certs", "init", str(tmp_path), "--replicas", "3"]) == 0
    old = (tmp_path / "replica-2.pem").read_bytes()
    assert main(["certs", "issue", str(tmp_path), "--replica", "2"]) == 1  # still there
    for suffix in (".pem", ".key"):
        (tmp_path / f"replica-2{suffix}").rename(tmp_path / f"replica-2{suffix}.old")
    assert main(["certs", "issue", str(tmp_path), "--replica", "2", "--replica", "3"]) == 0
    assert (tmp_path / "replica-2.pem").read_bytes() != old
    for replica in (2, 3):
        assert load(tmp_path / f"replica-{replica}.pem").issuer == \
            load(tmp_path / "ca.pem").subject
    assert main(["certs", "issue", str(tmp_path), "--replica", "99"]) == 1


async def test_a_mesh_runs_on_the_files_written(made: pathlib.Path) -> None:
    ports = dict(enumerate(free_ports(3)))
    inboxes = {replica: Inbox() for replica in ports}
    meshes = [PeerMesh(replica, (HOST, ports[replica]),
                       {peer: (HOST, port) for peer, port in ports.items() if peer != replica},
                       TlsConfig.in_directory(made, Identity.replica(replica)),
                       on_frame=inboxes[replica], backoff_initial_s=0.01, backoff_max_s=0.1)
              for replica in ports]
    with anyio.fail_after(15):
        async with anyio.create_task_group() as group:
            for mesh in meshes:
                await start(group, mesh)
            for mesh in meshes:
                for peer in mesh.peers:
                    assert mesh.send(peer, f"{mesh.replica_id} to {peer}".encode())
            await eventually(lambda: all(len(inbox.frames) == 2 for inbox in inboxes.values()))
            for mesh in meshes:
                await mesh.wait_connected()  # settled: see `free_ports`
            group.cancel_scope.cancel()
    assert sorted(inboxes[1].frames) == [(0, b"0 to 1"), (2, b"2 to 1")]


async def test_a_node_certificate_cannot_pose_as_a_server(made: pathlib.Path) -> None:
    node = TlsConfig.in_directory(made, Identity(IdentityRole.NODE, "gpu-1"))
    replica = TlsConfig.in_directory(made, Identity.replica(0))
    metrics = Metrics()
    listener = await anyio.create_tcp_listener(local_host=HOST)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)

    async def serve_as_node(stream: anyio.abc.SocketStream) -> None:
        await tls_handshake(stream, node.server_context(), server_side=True, metrics=Metrics())

    with anyio.fail_after(15):
        async with listener, anyio.create_task_group() as group:
            group.start_soon(listener.serve, serve_as_node)
            stream = await anyio.connect_tcp(HOST, port)
            assert await tls_handshake(stream, replica.client_context(), server_side=False,
                                       metrics=metrics) is None
            group.cancel_scope.cancel()
    assert metrics[TLS_REFUSED] == 1
