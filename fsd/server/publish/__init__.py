"""What the daemon says of the engine's state: telemetry, /metrics, the stats log.

Owns: the telemetry publisher on the PUB socket (`telemetry`: snapshots of the
scheduler's state, and events), the Prometheus metrics the HTTP frontend serves at
/metrics (`prom`, with `prom_defs` the definitions, `prom_gauges` read from the latest
snapshot, `prom_process` the process's own and what the gates refused and dropped)
and the daemon log's periodic stats line (`stats_log`).

May import: the engine's face and what it hands out (events, outputs, read-only
views), fsd.sched.scheduler (its stats), fsd.metrics, fsd.protocol, fsd.config.
Never another room of fsd.server: the loop and the HTTP room read from it.
"""
