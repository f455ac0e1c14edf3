"""The node agent daemon: GPU inventory and health through NVML, heartbeats, job binding."""
