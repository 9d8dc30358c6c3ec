"""The engine: runs the model on what the scheduler chose, and streams the tokens.

Owns: the engine loop (`core.Engine`: admission, one iteration per `step()`,
retune, finishing jobs; `failures` for what ends jobs when something breaks); its
one face to the daemon (`face.EngineFace`, handing out the plain values of `views`);
executors (`executor.LocalExecutor` in process, `ray_executor.RayExecutor` for
tensor x pipeline parallel Ray actors), both driving the same `worker.Worker` over
the same `plan.StepPlan`; pipeline stages (`stage`); the paged KV tensors
(`kv_cache`) and the copies between tiers (`swapper`); sampling (`sampler`, the only
place a token is drawn); incremental detokenization with stop strings
(`detokenizer`); events and results handed to the daemon (`events`, `output`); the
step history the what-if twin reads (`history`: arrivals, lengths, iteration times;
torch-free); and the profiler that measures iterations (`profiler`; `fsd.cost.fit`
fits the cost model to them).

May import: `fsd.admission` (whether a request is accepted), `fsd.token_chunk` (the
wire's form of a job's new tokens, made here once), `fsd.sched`, `fsd.kv`,
`fsd.models`, `fsd.layers`, `fsd.kernels`, `fsd.jobs`, `fsd.config`, `fsd.errors` and
the shared leaves (`fsd.cost`, `fsd.tokenizer`). Never `fsd.server` or the console: the daemon drives the engine,
not the other way round; nor `fsd.twin`, which reads the engine's `history`: the face
(`face`, the one surface the daemon uses) hands out the twin's snapshot of its state,
taken where that state lives, by the snapshotter its builder gives it.
"""
