"""Without a GPU, Triton kernels run in its interpreter; the flag must be set before triton is imported."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The test models are tiny: one intra-op thread is fastest, and avoids thrashing on a shared 2-core box.
torch.set_num_threads(1)
