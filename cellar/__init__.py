"""Cellar's application layer: the `cellar` command line, the demo and the benchmarks.

It sits above every other package (cellar > jepsen > agent > statemachine > consensus) and
nothing imports it.
"""
