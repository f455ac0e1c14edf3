"""The runtime around the sans-IO core: the only part of `consensus` that does I/O."""
