"""Scheduling (pure Python, no torch): queue policies, batch formation, ENST, live retune.

Owns: which jobs run each iteration. A policy is one entry of `registry`: its queue
class (`queues`; fcfs, priority and srpt in `sorted_queues`; the level family on
`levels` with ENST in `enst`: the MLFQs of `mlfq`, with the output `lengths` learned
and the gittins demotion's cold start in `fresh_caps`; policies kept for study live in
fsd.study) and one frozen settings class, its rules
(`rules` for the MLFQ family; `settings` reads every policy's `POLICY.FIELD`). The
batch walk (`batch`) in the order `leads` gives (with the swap gate's express lane and
owners' leads) and with what it looks up instead of walking (`waiting`: the live
jobs' owners, the waiting jobs by size), eviction for room (`eviction`), the
scheduler that ties them to a KV policy (`scheduler`) and its estimates
(`estimates`: ENST, predicted latency), what it decides and shows (`decision`: a leaf
the engine and telemetry read). The rules the engine, the simulator and the scenario
injector share: the room a queued job may start in (`room`; whether a request is
accepted at all is fsd.admission's), retune validation (`retune`), the SLO (`slo`),
chunked prefill's budget (`chunking`), the micro-batches in flight of a pipeline
(`pipeline`). Iteration time is fsd.cost's.

May import: fsd.kv, fsd.cost, fsd.jobs, fsd.config, fsd.config_checks, fsd.errors,
numpy; the registry names fsd.study's queues. Never torch,
nor fsd.engine, fsd.server, fsd.sim or the console: the same code runs in the engine
and in the simulator, and is unit-tested in milliseconds.
"""
