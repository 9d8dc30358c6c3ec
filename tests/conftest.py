"""Suite-wide setup.

Without a GPU the Triton kernels run in Triton's interpreter on CPU tensors; the
variable must be set before anything imports triton, hence here at the top level.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
