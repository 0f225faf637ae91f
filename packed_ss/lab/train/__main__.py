"""`python -m packed_ss.lab.train`: the dual-mode trainer (dual_mode.py)."""
from .dual_mode import main

main()
