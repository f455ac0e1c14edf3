"""The deterministic cluster simulator: replicas of the SDPaxos core, a simulated network and
disk, clients that record a history, a nemesis, and safety checks at every step.

One thread, one seed, no event loop: the same seed and options give the same trace.
"""
