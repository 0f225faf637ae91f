"""A lookup draft's point mass Q, the torch ops against csrc/lookup.h, alone (us a call, median of 200): every request
takes one (the worst case) at SmolLM2's shape (vocabulary 49,152, its adaptive width 16, float32) and the shipped
model's (4,096, width 8).

    cd /tmp && python point_mass.py
"""
import time

import torch

from packed_ss.decode.epilogue import NativeEpilogue, TorchEpilogue
from packed_ss.decode.state import DecodeState

torch.set_num_threads(2)
for batch, width, support in [(1, 8, 4096), (8, 8, 4096), (1, 16, 49152), (8, 16, 49152)]:
    st = DecodeState.cat([DecodeState.new(width, support, 8, (), 0, "cpu", q_dtype=torch.float32)] * batch)
    draft = torch.randint(0, support, (batch, width))
    rows = torch.ones(batch, dtype=torch.bool)
    line = []
    for name, epilogue in (("torch", TorchEpilogue("cpu", width, True)), ("native", NativeEpilogue("cpu", width, True))):
        times = []
        for _ in range(200):
            t = time.perf_counter()
            epilogue.point_mass(st, draft, rows)
            times.append(time.perf_counter() - t)
        line.append(f"{name} {1e6 * sorted(times)[100]:8.1f} us")
    print(f"batch {batch}, width {width}, vocabulary {support}: " + ", ".join(line))
