"""The runtime around the pure SDPaxos core: the parts that touch disks, sockets and clocks.

`storage` keeps a replica's records durable (a checksummed append-only log in a locked data
directory); `framing`, `tls`, `peers` and `listener` carry frames between replicas and from
clients over mutual TLS; `driver` owns a replica and carries out its Readys; `server` and
`client` speak the client protocol. Everything here may do I/O; nothing in `consensus/`
outside this package may.
"""
