"""Paged KV-cache attention kernels: Triton versions beside pure-torch references.

``store_kv``, ``paged_decode`` and ``paged_prefill`` are the Triton kernels, and two
fused ones: ``rms_norm`` (a norm with the residual add before it) and ``rope_store``
(RoPE of q and k with the K/V store); ``reference`` holds ``store_kv_ref``,
``paged_decode_ref``, ``paged_prefill_ref``, ``rms_norm_ref`` and ``rope_store_ref``
with the same signatures, which the CPU engine runs.

What the kernels share lives in two modules: ``launch``, the host side (shape checks,
launch arguments, tile sizes, the split-K heuristic), and ``device``, the device side
(``@triton.jit`` helpers, which Triton inlines, and the loader that JIT-wraps each
kernel module). The references share none of the kernels' computation.

Importing this package never imports Triton: each kernel module imports it (and
JIT-wraps its kernels) on first call, so the references work without Triton and
``TRITON_INTERPRET=1`` only has to be set before the first kernel call.
"""

from fsd.kernels import reference
from fsd.kernels.paged_decode import paged_decode
from fsd.kernels.paged_prefill import paged_prefill
from fsd.kernels.rms_norm import rms_norm
from fsd.kernels.rope_store import rope_store
from fsd.kernels.store_kv import store_kv

__all__ = ["paged_decode", "paged_prefill", "reference", "rms_norm", "rope_store", "store_kv"]
