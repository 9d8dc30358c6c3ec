"""The daemon's network side: the service loop, the gates, the HTTP API, what it publishes.

Owns: sockets and who may do what over them, in four rooms, each a package whose
`__init__` says what it holds and what it may import (tests/test_layout.py holds
the imports to it):

- `loop`: the service loop (`loop.service`), which drives the engine through its face
  alone (`fsd.engine.face_protocol.Face`) and builds the other rooms: the ROUTER's
  messages (`frontend`), whose each job is (`clients`), tokens and results to them
  (`job_routing`), the one way a job enters the engine (`job_admission`), requests
  answered (`control`), scenarios played (`injector`) and what-if previews (`preview`);
- `transport`: the gates in front of the public endpoints (`gate`: one endpoint;
  `endpoints`: the daemon's two and their budgets) and everything per connection
  (ZMTP, relayed frames, the inbound ledger, subscriptions, the connection table);
- `http`: the OpenAI-compatible API and /metrics, an SDK client of the daemon's own
  ROUTER (`server`: its thread; `api`, the `openai_*` modules, `chat_template`);
- `publish`: what the daemon says of the engine's state (`telemetry` on the PUB
  socket, `prom` for /metrics, `stats_log` in the log).

Beside the rooms, what more than one of them uses: `listen` makes the gates' and
the HTTP server's listening sockets, which survive running out of file descriptors;
`loop_thread` is the asyncio loop thread a gate and the HTTP server each run on (not
the service loop); `log_limits` bounds the log lines a client can cause; `audit`
logs control actions by who asked (`roles`: who may do what); `security` is CURVE
and the loopback rule; `heap_trim` gives freed heap back once the daemon idles.

May import: fsd.engine (its face's type, `face_protocol`, and what a face hands out:
outputs, events, read-only views), fsd.admission, fsd.sched, fsd.workload, fsd.twin (the preview's process),
fsd.client and fsd.tokenizer (the HTTP room), fsd.protocol, fsd.protocol_preview,
fsd.jobs, fsd.metrics, fsd.config, fsd.config_checks, fsd.credentials, fsd.statedir,
fsd.printable, fsd.version, fsd.errors. Never torch, the console, fsd.kv, fsd.sim,
fsd.models, fsd.router or fsd.cluster. The modules beside the rooms import no room.
"""
