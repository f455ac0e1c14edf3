"""The two servers of `cellar bench floor`: a leader and its followers, with no protocol.

The leader takes a frame of requests from its client, sends the batch to every follower, and
answers the batch when the first follower acknowledges it: the message pattern of a put on the
sequencer's replica of a 3-replica SDPaxos cluster (request, accept, acknowledgement, answer),
without the protocol, the log or the sessions. Each follower and the leader store every put in
a dict, decoding each command as a replica's apply does. Frames are length-prefixed msgpack
over asyncio Protocols on uvloop, over mutual TLS when given the files (uvloop's own TLS).

Run as `python -m cellar.bench.floor_node follower|leader ...`; each prints the port it bound
on its first line, then serves until it is killed (`cellar.bench.floor` starts and stops
them). What arrives is the benchmark's own traffic on loopback: a frame that does not decode
ends the process, which the benchmark then reports.
"""

from __future__ import annotations

import argparse
import asyncio
import ssl
import struct
import sys
from collections.abc import Callable
from typing import Any

from cellar.bench.floor_codec import decode, decode_put, encode

HOST = "127.0.0.1"
FRAME_HEADER = struct.Struct(">I")
FRAME_BYTES_MAX = 64 << 20

FrameHandler = Callable[["FramedProtocol", bytes], None]


class FramedProtocol(asyncio.Protocol):
    """Length-prefixed frames in, each handed to `on_frame` as it completes."""

    def __init__(self, on_frame: FrameHandler) -> None:
        self.on_frame = on_frame
        self.buffer = bytearray()
        self.transport: Any = None  # uvloop's TLS transport is no asyncio.Transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        start, end = 0, len(self.buffer)
        while end - start >= FRAME_HEADER.size:
            (length,) = FRAME_HEADER.unpack_from(self.buffer, start)
            if length > FRAME_BYTES_MAX:
                raise ValueError(f"a frame of {length} bytes")
            if end - start - FRAME_HEADER.size < length:
                break
            body = bytes(self.buffer[start + FRAME_HEADER.size:start + FRAME_HEADER.size
                                     + length])
            start += FRAME_HEADER.size + length
            self.on_frame(self, body)
        del self.buffer[:start]

    def send(self, payload: bytes) -> None:
        assert self.transport is not None
        self.transport.write(FRAME_HEADER.pack(len(payload)) + payload)


def apply_puts(store: dict[bytes, bytes], commands: list[bytes]) -> None:
    """Decode and store each put, as a replica applies every command."""
    for command in commands:
        key, value = decode_put(command)
        store[key] = value


async def follower(port: int, server_tls: ssl.SSLContext | None) -> None:
    store: dict[bytes, bytes] = {}

    def on_batch(link: FramedProtocol, frame: bytes) -> None:
        batch_id, commands = decode(frame)
        apply_puts(store, commands)
        link.send(encode(batch_id))

    await _serve(lambda: FramedProtocol(on_batch), port, server_tls)


async def leader(port: int, follower_ports: list[int], server_tls: ssl.SSLContext | None,
                 client_tls: ssl.SSLContext | None) -> None:
    loop = asyncio.get_running_loop()
    store: dict[bytes, bytes] = {}
    waiting: dict[int, tuple[FramedProtocol, list[int], list[bytes]]] = {}
    followers: list[FramedProtocol] = []

    def on_ack(_link: FramedProtocol, frame: bytes) -> None:
        found = waiting.pop(decode(frame), None)
        if found is not None:  # the first acknowledgement answers; the others find nothing
            client, request_ids, commands = found
            apply_puts(store, commands)
            client.send(encode(request_ids))

    for follower_port in follower_ports:
        _, link = await loop.create_connection(lambda: FramedProtocol(on_ack), HOST,
                                               follower_port, ssl=client_tls)
        followers.append(link)
    batch_ids = iter(range(1 << 62))

    def on_requests(client: FramedProtocol, frame: bytes) -> None:
        requests = decode(frame)
        batch_id = next(batch_ids)
        commands = [command for _, command in requests]
        waiting[batch_id] = (client, [request_id for request_id, _ in requests], commands)
        batch = encode([batch_id, commands])
        for link in followers:
            link.send(batch)

    await _serve(lambda: FramedProtocol(on_requests), port, server_tls)


async def _serve(factory: Callable[[], asyncio.Protocol], port: int,
                 server_tls: ssl.SSLContext | None) -> None:
    server = await asyncio.get_running_loop().create_server(factory, HOST, port,
                                                            ssl=server_tls)
    bound = server.sockets[0].getsockname()[1]
    print(bound, flush=True)
    await server.serve_forever()


def tls_context(files: tuple[str, str, str], *, server: bool) -> ssl.SSLContext:
    """A mutual-TLS context from (ca, cert, key): a server's, or a client's (the leader's to
    its followers, the benchmark's to the leader)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False  # as the runtime: the CA and the certificate decide
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(cafile=files[0])
    context.load_cert_chain(certfile=files[1], keyfile=files[2])
    return context


def _contexts(args: argparse.Namespace) -> tuple[Any, Any]:
    if not args.ca:
        return None, None
    files = (args.ca, args.cert, args.key)
    return tls_context(files, server=True), tls_context(files, server=False)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m cellar.bench.floor_node")
    parser.add_argument("role", choices=("follower", "leader"))
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--followers", type=int, nargs="*", default=[])
    parser.add_argument("--ca")
    parser.add_argument("--cert")
    parser.add_argument("--key")
    args = parser.parse_args(argv)
    import uvloop  # noqa: PLC0415 - a dependency of the runtime, loaded in the child only

    server_tls, client_tls = _contexts(args)
    if args.role == "follower":
        uvloop.run(follower(args.port, server_tls))
    else:
        uvloop.run(leader(args.port, args.followers, server_tls, client_tls))


if __name__ == "__main__":
    main(sys.argv[1:])
