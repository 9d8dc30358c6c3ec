"""fsd operator console: `fsctl` and the Textual app for `fsctl top`.

Owns: what an operator sees and types. It talks to the daemon only over the wire.

May import: fsd.protocol, fsd.client, fsd.workload (scenario parsing for `play`),
fsd.metrics (latency statistics), fsd.config (setting names and bounds, torch-free),
fsd.errors, fsd.credentials (the operator token), fsd.cli_options, fsd.cli_errors,
fsd.manual and fsd.version (the `man` and `version` commands), fsd.printable (a
client's names escaped wherever they are shown).
Never torch, fsd.engine, fsd.sched,
fsd.kv, fsd.server or fsd.sim.
"""
