"""KV memory (pure Python, no torch): block pools, placement, KV policies, swap planning.

Owns: where every job's KV is. `block_manager` holds the device and host pools,
each job's block tables and its location, and the copies in flight; `policies` has
one class per KV policy (defer, recompute, reactive, proactive), named in
`registry`; `planner` plans proactive swaps by ENST; `swap` is a planned copy;
`prefix` is the prefix cache, and `prefix_events` what it stored and removed, by content
name (a router's feed). The
scheduler asks the block manager and calls its verbs; the executor makes the copies.

May import: fsd.jobs, fsd.errors, fsd.protocol_telemetry (the prefix cache's counters
are the wire's `PrefixInfo`), and fsd.config / fsd.cost for type hints only
(`registry` checks a policy's name where it is built). Never torch, fsd.sched,
fsd.engine, fsd.server or the console.
"""
