"""Every size the state machine accepts or keeps, in one place, with the relations between them.

A limit on everything: command bodies, names, lists, gangs, the outbox and the session table
all have a fixed upper bound, so a single command can neither exhaust memory nor make `apply`
run for long. Decoders reject anything over these limits and name the field; the search loops
count steps against the budgets below, never time.
"""

from __future__ import annotations

from consensus.envelope import BODY_BYTES_MAX as ENVELOPE_BODY_BYTES_MAX

SCHEMA_VERSION = 1  # the `v` field every command and query carries

COMMAND_BYTES_MAX = 1 << 20  # one command body, the cluster configuration included
QUERY_BYTES_MAX = 4096
RULES_VERSION_MAX = (1 << 31) - 1  # a Tick's rules: a later build's may name any below
NAME_LENGTH_MAX = 128  # node ids, group ids, VC names, cell type names, pod uids
REASON_LENGTH_MAX = 256  # free text in health reports and admin marks
EFFECT_REASON_LENGTH_MAX = 4096  # an effect's reason; a longer one is cut (outbox.emit)
POD_COMMAND_ARGS_MAX = 256  # the argv a pod's binding carries
POD_COMMAND_BYTES_MAX = 16_384  # its arguments' UTF-8 bytes together
UUID_LENGTH_MAX = 96  # "GPU-" + 36, with room for MIG instance ids
PCI_BUS_ID_LENGTH_MAX = 32

GPU_MODELS_MAX = 64
CELL_TYPES_MAX = 256
PHYSICAL_CELLS_MAX = 16_384
NODES_PER_CELL_MAX = 4096
NODES_MAX = 16_384
VIRTUAL_CLUSTERS_MAX = 256
QUOTA_ENTRIES_MAX = 64
CELLS_MAX = 1 << 20  # all physical cells of a configuration, every level counted
LEVELS_MAX = 16
GPUS_PER_NODE_MAX = 64
GPU_LINKS_MAX = GPUS_PER_NODE_MAX * (GPUS_PER_NODE_MAX - 1) // 2  # one per pair of GPUs
NUMA_NODE_MAX = 4095
TOPOLOGY_LEVEL_MAX = 100
NVLINKS_PER_PAIR_MAX = 64
FANOUT_MAX = 4096

MEMBERS_MAX = 16  # member kinds in one gang
PODS_PER_MEMBER_MAX = 1024
PODS_PER_GANG_MAX = 1024
GPUS_PER_GANG_MAX = 8192
HEALTH_REPORTS_MAX = GPUS_PER_NODE_MAX
PRIORITY_MAX = 1000
OPPORTUNISTIC_PRIORITY = -1
FREE_PRIORITY = -2  # the priority of a leaf nobody holds

# Search budgets: deterministic step counts, never time.
BUDDY_SCAN_MAX = 4096  # free-list cells looked at (one counter read each) per level and binding
BUDDY_CANDIDATES_MAX = 32  # of those with room, cells checked for safety and fit
FIT_CANDIDATES_MAX = 64  # cells tried per level when looking for the smallest cell that fits
FIT_SCAN_MAX = 4096  # of the cells with room, those looked at per level (a flag read each)
SCHEDULE_ATTEMPTS_MAX = 1024  # the most pending gangs one scheduling pass may try
# Cells one scheduling pass may look at: each search of an attempt is charged for every cell its
# tenant has bound on the chain (it looks at those holding a GPU it could take), or,
# opportunistic, every node of it, a cost the per-level budgets above do not bound. The pass
# stops before an attempt that would overrun it (the first attempt always runs) and the rest
# wait for the next pass.
SCHEDULE_LOOKS_MAX = 65_536
DURATION_MS_MAX = 1 << 40  # about 35 years; bounds every duration and count in the policy

OUTBOX_RETAINED_MAX = 65_536  # effects kept; older ones are dropped, oldest first
# ... and their packed bytes: a START_POD carries its pod's argv (POD_COMMAND_BYTES_MAX) and
# its GPUs' UUIDs, and OUTBOX_RETAINED_MAX of the largest would not fit a snapshot.
OUTBOX_RETAINED_BYTES_MAX = 256 << 20
# Packed effects one effects answer holds (always at least one): with each effect's keys and
# the frame around it, well under the least frame cap a connection may have (8 MiB).
EFFECTS_ANSWER_BYTES_MAX = 4 << 20
# The same for a page of gangs (each names every chain it could use in its "why pending").
GROUPS_ANSWER_BYTES_MAX = 4 << 20
# A gang's failure lines one gang status holds (the `group` answer, SubmitGroup's reply): one a
# GPU under it, up to GPUS_PER_GANG_MAX of "uuid: why", some 11.7 MB at the longest in 4-byte
# characters. With the rest of the status (its pods' nodes, uids and exit reasons: some 2.2 MB
# at most) it stays under 4 MiB as the other answers do; ordinary lines all fit (8192 of a
# 40-character UUID and a 60-character reason take some 0.9 MiB).
GROUP_FAILURES_BYTES_MAX = 1 << 20
# The tenant entries one `cluster` answer holds (one per tenant and chain with a quota, each
# naming both): 256 tenants x 64 quota entries of a 1 MiB configuration with short chain and
# type names make some 9.7 MB of them, as 4-byte characters. The rest of the answer (per chain
# and level its type's name: some 2.6 MB at most, 242 chains of 16 levels) and these stay under
# a client's least frame cap (8 MiB); an ordinary cluster's entries all fit.
CLUSTER_VCS_BYTES_MAX = 4 << 20
# The gang ids an ApplyConfig reply names in each of its lists (downgraded, requeued): up to
# GROUPS_MAX of NAME_LENGTH_MAX 4-byte characters, 16,384 x 515 = 8.4 MB packed, over a
# client's 8 MiB frame; two lists of 2 MiB stay well under it. Ordinary ids all fit (16,384 of
# 64 characters take some 1.1 MB).
CONFIG_NAMES_BYTES_MAX = 2 << 20
SESSIONS_MAX = 65_536
# The shortest session lifetime a policy may set (the default's). A late copy of a command
# whose session was forgotten is told by its stamp (statemachine/sessions.py), which needs the
# lifetime to be well over twice the longest a client retries a command
# (consensus/runtime/client.py: DEADLINE_S_MAX, 45 s) plus the skew between the replicas'
# clocks; and half of it is how far ahead of the others the sequencer's clock may jump (an NTP
# step) before new sessions stamped by the others are refused as too old (another replica's
# moves logical time no more than STAMP_LEAD_MS_MAX past the sequencer's Ticks).
SESSION_TTL_MS_MIN = 600_000
# How far past the latest Tick's stamp a command other than a Tick may move logical time
# (statemachine/logical_time.py). Each replica stamps the commands it serves with its own
# clock, so without a bound one replica whose clock was far ahead (NTP broken there) moved
# logical time with a single command, and leases, deadlines and sessions were judged by its
# clock: a node that died was judged Suspect and Down only once real time caught up. The
# sequencer's Ticks come about every second (consensus/runtime/driver.py: system_every_ms);
# 5 s covers that period and the skew between healthy clocks, so a healthy replica's stamp is
# never held back, and it is small beside a lease (PolicySpec.lease_ms, 10 s by default): a
# lease renewed through a skewed replica lasts at most this much longer.
STAMP_LEAD_MS_MAX = 5_000
SESSIONS_PER_PRINCIPAL_MAX = SESSIONS_MAX // 8  # no one client's sessions fill the table
# The replies the sessions cache, together: one can be large (a node's registration lists its
# pods with their argv), and SESSIONS_MAX of the largest would not fit a snapshot. Past it the
# replies of the sessions that expire first are dropped (statemachine/sessions.py).
SESSION_REPLIES_BYTES_MAX = 256 << 20
QUERY_LIMIT_MAX = 4096  # items one query may return
GROUPS_MAX = 16_384  # gangs held at once, pending ones included (each of PODS_PER_GANG_MAX pods)

assert COMMAND_BYTES_MAX <= ENVELOPE_BODY_BYTES_MAX, "a command must fit in an envelope"
assert PODS_PER_MEMBER_MAX <= PODS_PER_GANG_MAX
assert GPUS_PER_NODE_MAX * PODS_PER_GANG_MAX >= GPUS_PER_GANG_MAX
assert OPPORTUNISTIC_PRIORITY > FREE_PRIORITY
assert SESSIONS_PER_PRINCIPAL_MAX < SESSIONS_MAX
assert BUDDY_SCAN_MAX >= BUDDY_CANDIDATES_MAX
assert FIT_SCAN_MAX >= FIT_CANDIDATES_MAX
assert HEALTH_REPORTS_MAX >= GPUS_PER_NODE_MAX, "one report can cover a whole node"
