"""The deterministic GPU-allocation state machine that every Cellar replica runs.

Pure: no clock, no randomness, no I/O. Time arrives inside commands; rejections are returned
values, identical on every replica. Two ways in:

- `Machine`: the `consensus.state_machine.StateMachine` protocol, bytes in and bytes out
  (envelopes, queries, snapshots, digests);
- `apply(state, command, context) -> Result`: the typed API the machine wraps, for tests and
  benchmarks.

`check_invariants(state)` checks the invariants of reference/hived.md 3.5 after any command.
"""

from statemachine.apply import apply
from statemachine.context import Context
from statemachine.errors import Code, Rejection
from statemachine.invariants import check_invariants, violations
from statemachine.machine import Machine
from statemachine.state import State

__all__ = ["Code", "Context", "Machine", "Rejection", "State", "apply", "check_invariants",
           "violations"]
