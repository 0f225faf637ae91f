"""Schedule benchmark: per-call latency fit, schedule x width x temperature comparison on HumanEval with
paired bootstrap intervals against Linear-SS, transformers peers, cost model
(logic: packed_ss/lab/bench/schedules.py).

    python bench/schedules.py --quick --out /tmp/bench-quick          # about a minute
    python bench/schedules.py --out bench/results/schedules-cpu       # full run (see bench/RESULTS.md)

Same as `python -m packed_ss bench ...`.
"""
import sys

from packed_ss.lab.bench.schedules import main

if __name__ == "__main__":
    sys.exit(main())
