"""SDPaxos: a pure, sans-IO protocol core and, in `consensus.runtime`, the runtime around it.

The core never imports the layers above it (statemachine, agent, jepsen) and performs no I/O:
commands cross into it as opaque bytes, time as ticks, randomness as a seeded `Prng`.
"""
