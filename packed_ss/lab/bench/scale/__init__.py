"""bench-scale: the engine at a released model's scale with random weights (command.py). configs.py (the
dimensions), roofline.py (per-call latency, bytes and bandwidth), iterations.py (a decode iteration per
schedule), projection.py (tokens/s from acceptance profiles, the auto width), resources.py (memory, kernels),
report.py (targets, markdown, plots)."""
from .command import main

__all__ = ["main"]
