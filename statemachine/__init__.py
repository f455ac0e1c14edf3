"""The deterministic GPU-allocation state machine that every Cellar replica runs.

Pure: no clock, no randomness, no I/O. Time arrives inside commands; rejections are returned
values, identical on every replica.
"""
