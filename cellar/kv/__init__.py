"""A plain replicated key-value store on Cellar's consensus: the common ground on which the
peer benchmark compares Cellar with etcd and PySyncObj (`cellar replica` with machine = "kv")."""
