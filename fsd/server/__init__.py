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
make room), and `log_limits` bounds the log lines a client
can cause.

May import: fsd.engine, fsd.sched, fsd.kv, fsd.protocol, fsd.workload, fsd.metrics,
fsd.config, fsd.credentials, fsd.statedir, fsd.errors. Never the console.
"""
