"""Many replicas of one engine behind the daemon's one endpoint.

Owns: where each replica runs (`handles`: Ray actors or threads of this process;
`groups`: each Ray replica's placement group; `start`), one replica's own loop
(`worker`), and the face that makes N replicas look like one engine to the server
(`face`, with `merge` for their snapshots). Which replica takes a request is the
router's (`face.Chooser`; `chooser` makes fsd.router's `Router` one).

May import: fsd.admission, fsd.engine, fsd.sched, fsd.kv, fsd.models (the tokenizer),
fsd.config, fsd.errors, fsd.jobs, fsd.protocol_telemetry. Never fsd.server, fsd.console or
fsd.sim: the server reaches the replicas through the face alone.
"""
