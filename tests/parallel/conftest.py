"""One local Ray instance for the whole module tree, and a fixed cost model.

Ray takes seconds to start on a small machine, so every test shares one instance
(4 logical CPUs: TP2 x PP2 = 4 CPU actors fit). A saved CostModel stands in for the
start-up calibration, which over Ray and gloo would cost more than the tests.
"""

from __future__ import annotations

from pathlib import Path

import pytest

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
