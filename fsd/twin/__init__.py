"""The what-if twin: preview a retune on a copy of the live daemon before applying it.

The engine records what serving looked like (`fsd.engine.history`: arrivals,
lengths, iteration times) and the twin reads it: `snapshot` freezes the live scheduler, `forward` runs the simulator from it under
the current and the proposed settings, `figures` measures a run (and, alike, the
daemon observed over the same window). The daemon's side is fsd.server.loop.preview.
Nothing here imports torch: a preview runs in its own process.

May import: fsd.sim, fsd.sched, fsd.kv, fsd.cost, fsd.jobs, fsd.config, fsd.metrics,
fsd.protocol_preview, fsd.errors, and of the engine only its torch-free step history
(`fsd.engine.history`). Never torch, the rest of fsd.engine, fsd.server or the console.
"""
