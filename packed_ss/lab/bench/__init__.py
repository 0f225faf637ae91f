"""Benchmarks of the decoders on HumanEval prompts.

    python -m packed_ss bench --out DIR [options]             # the schedules (schedules.py)
    python -m packed_ss bench-any-order --out DIR [options]   # the any-order schedules (any_order.py)
    python -m packed_ss bench --batch-sizes 1 2 4 8 --out DIR # generate_batch vs one by one (batch.py)
    python -m packed_ss bench-scale --config nld-8b --out DIR # a released model's dimensions, random weights (scale/)

latency.py (per-call latency fit), methods.py (our schedules and the transformers peers, timed), stats.py
(paired bootstrap), options.py (shared options and presets), report.py (the .md tables and plots),
iteration.py (a decode iteration through the runtime, timed).
"""
