"""`cellar bench peers`: Cellar beside etcd and PySyncObj, the same workload in one run."""
