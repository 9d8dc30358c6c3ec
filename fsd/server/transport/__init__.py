"""The gates: the daemon's public endpoints, and everything per connection.

Owns: the bytes between a peer and the daemon's private sockets. libzmq never
listens where peers reach it; a gate (`gate`) does, relays each connection to a
private `ipc://` path and issues its routing id (`zmtp` reads and writes the
handshake, `frames` the frames). `endpoints` builds the daemon's two gated
endpoints (requests, telemetry) and the budgets they keep. Each connection is
relayed by a `relay`: request frames within the inbound budget (`inbound`, counted
in the `ledger`), a subscriber's subscriptions (`subscriptions`). The connection
table (`slots`) gives each peer a share (`peers`), closes idle slots for room, and
keeps the operator's reserve, reached on `probation`, which reads a request's first
bytes with `msgpack_peek`.

May import: the modules beside the rooms that it needs (`fsd.server.audit`,
`listen`, `log_limits`, `loop_thread`), fsd.protocol, fsd.config, fsd.credentials,
fsd.errors. Never the engine, a job, or the other rooms (loop, http, publish): the
service loop builds the gates, the gates know nothing of it.
"""
