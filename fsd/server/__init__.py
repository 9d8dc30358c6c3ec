"""The daemon's network side: request frontend, telemetry publisher, security."""
