"""The torch thread count of a CPU worker: one core left to everything else, and said why."""

from __future__ import annotations

import logging

import pytest
import torch

from fsd.config import CacheConfig, ConfigError, ModelConfig
from fsd.engine.threads import choose_threads
from fsd.engine.worker import Worker, WorkerSpec


@pytest.mark.parametrize(("usable", "count"), [(1, 1), (2, 1), (4, 3), (16, 15)])
def test_the_default_leaves_one_cpu_to_the_daemon(usable, count):
    # bench/threads.py: 2 threads on 2 busy cores served many times slower than 1
    choice = choose_threads(usable, torch_threads=usable, seen=usable)
    assert choice.count == count
    assert f"{usable} usable CPU" in choice.reason and "--threads" in choice.reason


def test_a_count_someone_chose_wins():
    assert choose_threads(8, configured=6).count == 6
    assert "threads = 6" in choose_threads(8, configured=6).reason
    assert choose_threads(8, configured=6, omp_env="2").count == 6  # the config over the env
    kept = choose_threads(8, omp_env="2", torch_threads=2, seen=8)
    assert kept.count is None and "OMP_NUM_THREADS=2" in kept.reason
    kept = choose_threads(8, torch_threads=3, seen=8)  # torch.set_num_threads before start
    assert kept.count is None and "set_num_threads" in kept.reason
    assert kept.log_line(3).startswith("torch threads: 3 (")


def test_threads_is_a_model_option():
    assert ModelConfig().threads is None and ModelConfig(threads=2).threads == 2
    for bad in (0, -1, "2", 2.0):
        with pytest.raises(ConfigError):
            ModelConfig(threads=bad)


def test_a_cpu_worker_sets_and_logs_its_count(caplog):
    before = torch.get_num_threads()
    try:
        with caplog.at_level(logging.INFO, logger="fsd.engine"):
            Worker(WorkerSpec(ModelConfig(), CacheConfig(), device="cpu", threads=2))
        assert torch.get_num_threads() == 2
        assert "torch threads: 2 (threads = 2 in the config)" in caplog.text
    finally:
        torch.set_num_threads(before)
