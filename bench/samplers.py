"""Sampler benchmark: the rejection rule against shared noise (Gumbel-max), paired, on HumanEval with the
shipped model (logic: packed_ss/lab/bench/samplers.py).

    python bench/samplers.py --quick --out /tmp/samplers-quick                  # about a minute
    python bench/samplers.py --threads 2 --out bench/results/samplers-cpu       # full run (bench/RESULTS.md)

Same as `python -m packed_ss bench-samplers ...`.
"""
import sys

from packed_ss.lab.bench.samplers import main

if __name__ == "__main__":
    sys.exit(main())
