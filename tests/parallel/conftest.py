"""One local Ray instance for the whole module tree, and a fixed cost model.

Ray takes seconds to start on a small machine, so every test shares one instance
(4 logical CPUs: TP2 x PP2 = 4 CPU actors fit). A saved CostModel stands in for the
start-up calibration, which over Ray and gloo would cost more than the tests.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fsd import LLM
from fsd.cost import CostModel
from fsd.engine.ray_cluster import ensure_ray


@pytest.fixture(scope="session")
def ray_cluster():
    ray, owned = ensure_ray(None, num_cpus=4)
    yield ray
    if owned:
        ray.shutdown()


@pytest.fixture(scope="session")
def profile_path(tmp_path_factory) -> str:
    path = Path(tmp_path_factory.mktemp("profile")) / "fixed.json"
    CostModel(name="fixed-test").save(path)
    return str(path)


@pytest.fixture(scope="session")
def cpu_llm(profile_path) -> Callable[..., LLM]:
    """LLM(model, **settings) on CPU workers with the fixed cost model, FCFS unless a
    policy is given: what every sharded-equals-one-device test starts from."""

    def make(model: str, **settings: Any) -> LLM:
        return LLM(model, **{"device": "cpu", "policy": "fcfs", "profile": profile_path, **settings})

    return make
