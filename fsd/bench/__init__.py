"""Benchmarks that drive real daemons: `fsd bench slo` (latency against rate per policy)."""
