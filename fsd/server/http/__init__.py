"""The OpenAI-compatible HTTP API and /metrics (`fsd start --http`).

Owns: the HTTP frontend, an asyncio loop on its own thread (`server`) that reaches
the engine as an SDK client of the daemon's own ROUTER over `inproc://`, through a
pool of engine links (`links`). `api` is the OpenAI API's routes (`openai_schema`
parses requests, `openai_decode` reads bodies, `openai_errors`, `openai_response`;
`chat_template` renders chat messages). Slow or idle peers hold neither memory nor
connections: `limits` (deadlines, the bodies' byte budget), `heads` (the bytes of
unfinished heads, bounded), `idle` (the connections that may close to make room).

May import: fsd.client (the SDK it talks to the engine with), the engine's face and
outputs, fsd.tokenizer, fsd.jobs, fsd.config, fsd.config_checks, fsd.errors, the
publish room (/metrics and the telemetry tap) and the modules beside the rooms
(`fsd.server.listen`, `log_limits`, `loop_thread`). Never the loop or the transport
room: the service loop starts the HTTP frontend, which reaches it over the wire.
"""
