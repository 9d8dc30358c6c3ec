"""The service loop: requests in, one engine iteration, tokens and telemetry out.

Owns: the thread that owns the engine and the ROUTER socket (`service`), and the
loop's parts, each handed what it uses, not the service: `frontend` reads and
answers the ROUTER's messages, `clients` keeps who is connected and whose each job
is, `job_routing` sends tokens and results to them, `job_admission` is the one way
a job enters the engine, `control` answers requests, `injector` plays scenarios
into the engine, `preview` runs what-if previews in the twin's process.

May import: every room of fsd.server (the service builds the gates, the HTTP
frontend and the publishers) and the modules beside them; of the engine its face
and what it hands out; fsd.admission, fsd.sched.retune, fsd.workload,
fsd.twin.forward and fsd.twin.worker, fsd.protocol, fsd.protocol_preview, fsd.jobs,
fsd.metrics, fsd.config, fsd.errors, fsd.printable, fsd.version. No room imports
the loop.
"""
