"""`cellar dev`: a local cluster on loopback with simulated nodes and a scheduler at work."""
