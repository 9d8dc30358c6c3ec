"""What a benchmark ran on (the code lives in fsd.bench.machine, shared with `fsd bench`)."""

from fsd.bench.machine import describe_machine, machine_slug

__all__ = ["describe_machine", "machine_slug"]
