"""The daemon's network side: request frontend, telemetry publisher, security, HTTP API.

Owns: sockets and who may do what over them. The service loop (`service`) drives
the engine through its face alone (`fsd.engine.face.EngineFace`), with `frontend`
(the ROUTER socket's messages), `clients` (whose each job is) and `routing` (tokens
and results to them); each helper is handed what it uses, not the service.
`admission` is the one way a job enters the engine; `control` answers requests;
`telemetry` and `prom` (`prom_defs`, `prom_gauges`) publish state; `injector` plays
scenarios into the engine; `http_api` is the OpenAI API (`openai_schema` parses
requests, `openai_decode` reads bodies, `openai_errors`, `openai_response`);
`listen` makes the gate's and the HTTP server's listening sockets, which survive
running out of file descriptors (`http_idle`: the HTTP connections they may close to
make room; `http_heads`: the bytes of unfinished HTTP heads, bounded), and
`log_limits` bounds the log lines a client can cause. The gates (`gate`, `gates`)
relay each connection (`relay`: request frames within the inbound budget, `inbound`
and `ledger`; a subscriber's subscriptions, `subscriptions`) and keep a connection
table (`slots`: a share per peer, `peers`; idle slots closed for room; the
operator's reserve, reached on `probation`, which reads a request's first bytes with
`msgpack_peek`).

May import: fsd.engine, fsd.sched, fsd.kv, fsd.protocol, fsd.workload, fsd.metrics,
fsd.config, fsd.credentials, fsd.statedir, fsd.errors. Never the console.
"""
