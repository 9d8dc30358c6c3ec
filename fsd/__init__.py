"""fsd: a FastServe-style LLM serving daemon.

`fsd.LLM` and `fsd.SamplingParams` are the offline API; they load lazily so that
`import fsd` stays cheap for the CLI and the console.
"""

from __future__ import annotations

from typing import Any

from fsd.version import __version__

__all__ = ["LLM", "SamplingParams", "RequestOutput", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from fsd.llm import LLM

        return LLM
    if name == "SamplingParams":
        from fsd.jobs import SamplingParams

        return SamplingParams
    if name == "RequestOutput":
        from fsd.engine.output import RequestOutput

        return RequestOutput
    raise AttributeError(f"module 'fsd' has no attribute {name!r}")
