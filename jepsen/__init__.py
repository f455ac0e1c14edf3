"""The fault-injection harness: simulator, live clusters, nemesis, histories and the checker."""
