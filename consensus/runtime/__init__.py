"""The runtime around the pure SDPaxos core: the parts that touch disks, sockets and clocks.

`consensus.runtime.storage` keeps a replica's records durable (a checksummed append-only log in
a locked data directory). Everything here may do I/O; nothing in `consensus/` outside this
package may.
"""
