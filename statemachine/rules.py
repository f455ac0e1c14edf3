"""Which rules the machine applies commands by: a replicated version, raised at one log entry
for every replica at once.

Replicas replay the log from their own latest snapshots, and those sit at different entries.
A build that changed how a command is applied would, after an upgrade, apply the entries after
each replica's snapshot by its new rules while a replica whose snapshot is later holds the old
rules' result for them: the replicas would disagree. So the rules in force are part of the
replicated state (`State.rules_version`), and only a log entry changes them:

- a build that changes a rule keeps the old one beside the new, chosen by
  `state.rules_version`, and raises `RULES_VERSION`;
- the system's Tick carries the version its proposer's build knows (`Tick.rules`); applying
  it raises the state's version to that (never lowers it). After an upgrade every replica
  switches at the same entry, the first Tick an upgraded sequencer proposed, whichever
  snapshot it replayed from;
- a replica whose build does not know the version a Tick names stops (`RulesTooNew`) rather
  than apply rules it does not have: a replica left on an older build halts instead of
  diverging. So does one handed a snapshot whose state already holds such a version (an
  upgraded peer's, at catch-up): it would apply the commands after it by its own rules.

Version 0 is the rules of every build before versions existed, as this build applies them
(the changes of those builds were not gated: an upgrade from one of them can still split
replicas whose snapshots sit at different entries, as before). Version 1 changes no rule: it
is the first version a Tick names. Version 2: a health report (or a registration's) naming one
GPU twice is refused MALFORMED (`statemachine/node_commands.py`); before, each copy counted,
and three passes in one report brought a failed GPU back at once. Version 3, two rules: a
submission whose preemption freed GPUs on the spot runs a scheduling pass
(`statemachine/group_commands.py`; before, what the new gang did not take stayed idle, with
gangs that fit it pending, until the next command that ran one), and a body that is not valid
msgpack is refused with a message of its own (`statemachine/record_codec.py`; before, the
message quoted the msgpack library's error, which its C extension and its pure-Python fallback
word differently, so two replicas could cache different replies). Version 4, three rules: a
submission whose pods the tenant's cells (or the chain's nodes, for an opportunistic gang) can
never hold, even all free, is refused NEVER_SATISFIABLE, and a reconfiguration releases a
pending gang it leaves so (`statemachine/group_commands.py`, `statemachine/config_commands.py`;
before, only the total and the largest pod were checked, at submission alone, and such a gang
pended for ever), and a command body whose schema version is not an integer (`true`, `1.0`) is
refused MALFORMED (`statemachine/record_codec.py`; before, Python's equality took it for 1),
and a guaranteed gang that must preempt takes, of the plans its search tries (every cell level
and eligible chain), the one whose victims' highest priority is lowest, then that evicts the
fewest GPUs and gangs, then the first found (`statemachine/search.py`,
`statemachine/scheduler.py`; before, the first plan that fit won, smaller cells first, so a
priority-9 gang in a socket cell was preempted where a priority-1 gang in a node cell would
do).
"""

from __future__ import annotations

from statemachine.commands import Tick
from statemachine.state import State

RULES_BEFORE_VERSIONS = 0  # a Tick without the field, a snapshot of format 6 or older
RULES_VERSION = 4  # the newest rules this build applies
ONE_REPORT_PER_GPU = 2  # from this version on: a report naming a GPU twice is refused
PASS_AFTER_SUBMIT_FREES = 3  # from this version on: a submission that freed GPUs runs a pass
PLAIN_MSGPACK_REFUSALS = 3  # from this version on: no library's words in a MALFORMED reply
PODS_PACKED_AT_SUBMIT = 4  # from this version on: a gang whose pods never pack is refused
EXACT_SCHEMA_VERSION = 4  # from this version on: a body's "v" must be an integer, not a bool
LEAST_VICTIMS = 4  # from this version on: a preemptor evicts the lowest priorities it can


def system_tick() -> Tick:
    """The Tick a replica's driver proposes: it names this build's rules."""
    return Tick(rules=RULES_VERSION)


class RulesTooNew(Exception):
    """The log raises the rules to a version this build does not know: upgrade it."""

    def __init__(self, version: int) -> None:
        super().__init__(
            f"the log names state machine rules of version {version}, and this build knows "
            f"them up to version {RULES_VERSION}: upgrade this replica to the build the others "
            "run (it stopped rather than apply a command by rules it does not have)")
        self.version = version


def check_known(version: int) -> None:
    """RulesTooNew unless this build applies the rules of `version`."""
    if version > RULES_VERSION:
        raise RulesTooNew(version)


def raise_rules(state: State, version: int) -> None:
    """A Tick named `version`: the rules in force from the next command on, never lower."""
    check_known(version)
    if version > state.rules_version:
        state.set(state, "rules_version", version)
