"""Live runs: real replica processes under a nemesis, and their clients' history checked."""
