"""Changing an engine's scheduling settings while it runs (`Engine.retune`)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from fsd.config import EngineConfig
from fsd.errors import ConfigError, SettingError
from fsd.sched.retune import plain_value, plan_retune
from fsd.sched.scheduler import Scheduler


def retuned(config: EngineConfig, scheduler: Scheduler, changes: dict[str, Any]) -> EngineConfig:
    """The config after `changes`, applied to the scheduler between iterations without
    losing a job.

    Accepts the fields `fsd.sched.retune.RETUNABLE` names (SchedConfig's and the KV
    policy's). A refused change raises SettingError and changes nothing.
    """
    sched, cache = plan_retune(config.sched, config.cache, changes)
    try:  # the scheduler refuses before changing anything; only then does the config
        scheduler.retune(time.time(), sched, cache)
    except SettingError:
        raise
    except ConfigError as exc:
        raise SettingError(str(exc)) from None
    return dataclasses.replace(config, sched=sched or config.sched, cache=cache or config.cache)


def logged(changes: dict[str, Any]) -> dict[str, Any]:
    """The changes as the event log keeps them."""
    return {k: plain_value(v) for k, v in changes.items()}
