"""Hypothesis-generated frames against a real daemon: after every batch it still serves.

2,000 frames per run (20 examples of 100), derandomized so CI is reproducible; the
same generator drives bench/fuzz_zmq.py for 10,000. Every reply must decode, and a
normal request must complete after each batch; fuzzed retunes are put back first.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.server.daemon_proc import daemon_fixture
from tests.server.fuzz_frames import FuzzStats, fire, frames, settings_of

MAX_FRAME = 65536
CONFIG = f"""
[model]
max_model_len = 64
[cache]
num_gpu_blocks = 64
num_host_blocks = 64
[sched]
max_batch_size = 16
[server]
telemetry_hz = 5
client_timeout = 2.0
max_frame_bytes = {MAX_FRAME}
max_burst = 4
"""

daemon = daemon_fixture(CONFIG, "fuzz")
STATS = FuzzStats()


@settings(
    max_examples=8,  # 800 frames here; bench/fuzz_zmq.py sends 10,000
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
@given(batch=st.lists(frames(MAX_FRAME), min_size=100, max_size=100))
def test_eight_hundred_fuzzed_frames_leave_the_daemon_serving(daemon, batch):
    with daemon.client() as op:
        original = settings_of(op.retune(policy=op.status().policy))
        fire(daemon.endpoint, batch, daemon.token, STATS)
        assert daemon.proc.poll() is None, daemon.log.read_text()[-3000:]
        assert STATS.undecodable_replies == 0
        op.retune(**original)
        op.undrain()
        done = op.complete([1, 2, 3], max_tokens=4, ignore_eos=True)
        assert done.finish_reason == "length" and len(done.token_ids) == 4
        STATS.checks += 1
