"""Golden protocol scripts: replicas of the core driven by explicit commands.

A script is a list of commands (lines starting with `> `), each followed by the output it
produced when the script was last accepted. The harness holds the replicas and a FIFO of
messages in flight; nothing happens unless a command says so, so each scenario is exact.

Commands:
  cluster N [field=value ...]   N replicas (ReplicaConfig fields may be overridden)
  propose R TEXT...             replica R proposes each TEXT as a command
  read R ID                     replica R starts linearizable read ID
  process [R...]                replicas run ready() until idle: persist, execute, queue
  deliver [S->T ...]            deliver queued messages (all, or on the given links), in order
  drop [S->T ...]               drop queued messages (all, or on the given links)
  duplicate [S->T ...]          queue a second copy of queued messages
  stash [S->T ...] / unstash    hold queued messages aside / queue them again (stale later)
  stabilize                     process and deliver until nothing moves
  partition A B | C D           only replicas on the same side talk; `heal` ends it
  crash R / restart R           crash (every record was synced) / rebuild from records
  tick R|all [n=K]              advance logical time (nothing is delivered meanwhile)
  run n=K                       K rounds of: every replica ticks, processes, all is delivered
                                (heartbeats and lease grants are counted, not listed)
  status                        one line per replica
"""

from __future__ import annotations

import dataclasses
import pathlib
from dataclasses import dataclass, field

from consensus.config import ReplicaConfig
from consensus.messages import Message
from consensus.prng import Prng
from consensus.records import Record
from consensus.replica import Replica
from consensus.trace import describe, describe_batch

STABILIZE_ROUNDS_MAX = 200


@dataclass
class Harness:
    replicas: dict[int, Replica | None] = field(default_factory=dict)
    records: dict[int, list[Record]] = field(default_factory=dict)
    configs: dict[int, ReplicaConfig] = field(default_factory=dict)
    queue: list[tuple[int, int, Message]] = field(default_factory=list)
    stashed: list[tuple[int, int, Message]] = field(default_factory=list)
    groups: list[set[int]] | None = None
    output: list[str] = field(default_factory=list)

    def say(self, line: str) -> None:
        self.output.append(line)

    def live(self) -> list[int]:
        return [replica for replica, node in sorted(self.replicas.items()) if node is not None]

    def node(self, replica: int) -> Replica:
        node = self.replicas[replica]
        assert node is not None, f"replica {replica} is down"
        return node


def run_command(harness: Harness, line: str) -> None:
    words = line.split()
    handler = COMMANDS[words[0]]
    handler(harness, words[1:])


def cmd_cluster(harness: Harness, args: list[str]) -> None:
    count = int(args[0])
    overrides = dict(argument.split("=", 1) for argument in args[1:])
    for replica in range(count):
        config = ReplicaConfig(replica_id=replica, replica_count=count)
        for name, text in overrides.items():
            current = getattr(config, name)
            value: object = text == "true" if isinstance(current, bool) else type(current)(text)
            config = dataclasses.replace(config, **{name: value})  # type: ignore[arg-type]
        harness.configs[replica] = config
        harness.replicas[replica] = Replica(config, Prng(replica))
        harness.records[replica] = []


def cmd_propose(harness: Harness, args: list[str]) -> None:
    node = harness.node(int(args[0]))
    for text in args[1:]:
        node.propose(text.encode())


def cmd_read(harness: Harness, args: list[str]) -> None:
    harness.node(int(args[0])).read(int(args[1]))


def cmd_process(harness: Harness, args: list[str]) -> None:
    targets = [int(arg) for arg in args] or harness.live()
    for replica in targets:
        process(harness, replica)


def process(harness: Harness, replica: int) -> bool:
    node, moved = harness.node(replica), False
    for _ in range(20):
        ready = node.ready()
        if ready.is_empty():
            return moved
        moved = True
        harness.records[replica].extend(ready.records)
        if ready.records:
            kinds = ", ".join(type(record).__name__ for record in ready.records)
            harness.say(f"{replica} persists {kinds}{' (sync)' if ready.must_sync else ''}")
        for item in ready.executed:
            harness.say(f"{replica} executes slot {item.slot} = C({item.space},{item.index}) "
                        f"{describe_batch(item.commands)}")
        for index in ready.readied_instances:
            harness.say(f"{replica} ready C({replica},{index})")
        for read_id in ready.reads:
            harness.say(f"{replica} may read {read_id}")
        for target, message in ready.messages + ready.messages_after_persist:
            harness.queue.append((replica, target, message))
        node.advance()
    raise AssertionError(f"replica {replica} never went idle")


def _links(args: list[str]) -> set[tuple[int, int]] | None:
    if not args:
        return None
    pairs = (arg.split("->") for arg in args)
    return {(int(source), int(target)) for source, target in pairs}


def _take(harness: Harness, args: list[str]) -> list[tuple[int, int, Message]]:
    links = _links(args)
    taken = [item for item in harness.queue if links is None or item[:2] in links]
    harness.queue = [item for item in harness.queue if item not in taken]
    return taken


def cmd_deliver(harness: Harness, args: list[str]) -> None:
    for source, target, message in _take(harness, args):
        blocked = harness.groups is not None and not any(
            source in group and target in group for group in harness.groups)
        if blocked or harness.replicas.get(target) is None:
            harness.say(f"{source}->{target} lost: {describe(message)}")
            continue
        node = harness.node(target)
        before = _drops(node)
        node.step(message)
        dropped = sorted(set(_drops(node).items()) - set(before.items()))
        reason = f"  (dropped: {', '.join(name for name, _ in dropped)})" if dropped else ""
        harness.say(f"{source}->{target} {describe(message)}{reason}")


def _drops(node: Replica) -> dict[str, int]:
    return {name: count for name, count in node.status().counters
            if name.startswith("dropped.")}


def cmd_drop(harness: Harness, args: list[str]) -> None:
    for source, target, message in _take(harness, args):
        harness.say(f"{source}->{target} dropped: {describe(message)}")


def cmd_duplicate(harness: Harness, args: list[str]) -> None:
    links = _links(args)
    copies = [item for item in harness.queue if links is None or item[:2] in links]
    harness.queue.extend(copies)
    harness.say(f"duplicated {len(copies)} messages")


def cmd_stash(harness: Harness, args: list[str]) -> None:
    taken = _take(harness, args)
    harness.stashed.extend(taken)
    harness.say(f"stashed {len(taken)} messages")


def cmd_unstash(harness: Harness, args: list[str]) -> None:
    harness.queue.extend(harness.stashed)
    harness.say(f"unstashed {len(harness.stashed)} messages")
    harness.stashed = []


def cmd_stabilize(harness: Harness, args: list[str]) -> None:
    for _ in range(STABILIZE_ROUNDS_MAX):
        moved = [process(harness, replica) for replica in harness.live()]  # all of them
        if not harness.queue and not any(moved):
            return
        cmd_deliver(harness, [])
    raise AssertionError("the cluster did not stabilize")


def cmd_partition(harness: Harness, args: list[str]) -> None:
    sides: list[set[int]] = []
    current: set[int] = set()
    for arg in args:
        if arg == "|":
            sides.append(current)
            current = set()
        else:
            current.add(int(arg))
    harness.groups = [*sides, current]


def cmd_heal(harness: Harness, args: list[str]) -> None:
    harness.groups = None


def cmd_crash(harness: Harness, args: list[str]) -> None:
    replica = int(args[0])
    harness.replicas[replica] = None
    harness.queue = [item for item in harness.queue if replica not in item[:2]]


def cmd_restart(harness: Harness, args: list[str]) -> None:
    replica = int(args[0])
    harness.replicas[replica] = Replica.restore(harness.configs[replica], Prng(100 + replica),
                                                harness.records[replica])


def cmd_tick(harness: Harness, args: list[str]) -> None:
    targets = harness.live() if args[0] == "all" else [int(args[0])]
    count = int(args[1].removeprefix("n=")) if len(args) > 1 else 1
    for _ in range(count):
        for replica in targets:
            harness.node(replica).tick()


_PERIODIC = ("Heartbeat", "LeaseGrant")


def cmd_run(harness: Harness, args: list[str]) -> None:
    rounds = int(args[0].removeprefix("n="))
    periodic = 0
    for _ in range(rounds):
        for replica in harness.live():
            harness.node(replica).tick()
        for replica in harness.live():
            process(harness, replica)
        before = len(harness.output)
        cmd_deliver(harness, [])
        delivered = harness.output[before:]
        kept = [line for line in delivered if not line.split(" ")[1].startswith(_PERIODIC)
                and not (" lost: " in line and line.split(" ")[2].startswith(_PERIODIC))]
        periodic += len(delivered) - len(kept)
        harness.output[before:] = kept
    harness.say(f"({periodic} heartbeats and lease grants)")


def cmd_status(harness: Harness, args: list[str]) -> None:
    for replica, node in sorted(harness.replicas.items()):
        if node is None:
            harness.say(f"{replica}: down")
            continue
        status = node.status()
        harness.say(f"{replica}: view={status.view} {status.status} sequencer="
                    f"{status.sequencer} executed={status.executed_slots} "
                    f"committed={status.commit_prefix}")


COMMANDS = {
    "cluster": cmd_cluster, "propose": cmd_propose, "read": cmd_read,
    "process": cmd_process, "deliver": cmd_deliver, "drop": cmd_drop,
    "duplicate": cmd_duplicate, "stash": cmd_stash, "unstash": cmd_unstash,
    "stabilize": cmd_stabilize, "partition": cmd_partition,
    "heal": cmd_heal, "crash": cmd_crash, "restart": cmd_restart, "tick": cmd_tick,
    "run": cmd_run,
    "status": cmd_status,
}


@dataclass
class Step:
    command: str
    expected: list[str]
    comments: list[str]


def parse_script(text: str) -> list[Step]:
    steps: list[Step] = []
    comments: list[str] = []
    for line in text.splitlines():
        if line.startswith("> "):
            steps.append(Step(line[2:], [], comments))
            comments = []
        elif line.startswith("#") or not line.strip():
            comments.append(line)
        elif steps:
            steps[-1].expected.append(line)
    return steps


def run_script(path: pathlib.Path) -> tuple[list[Step], list[list[str]]]:
    steps = parse_script(path.read_text(encoding="utf-8"))
    harness, produced = Harness(), []
    for step in steps:
        harness.output = []
        run_command(harness, step.command)
        produced.append(harness.output)
    return steps, produced


def render_script(steps: list[Step], produced: list[list[str]]) -> str:
    lines: list[str] = []
    for step, output in zip(steps, produced, strict=True):
        lines.extend(step.comments)
        lines.append(f"> {step.command}")
        lines.extend(output)
    return "\n".join(lines) + "\n"
