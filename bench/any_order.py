"""Any-order benchmark: ar, the native threshold decoder and Packed/Linear/Quadratic-SS under LTR and
confidence orders on the shipped any-order model (logic: packed_ss/lab/bench/any_order.py).

    python bench/any_order.py --quick --out /tmp/bench-any-order       # about a minute
    python bench/any_order.py --out bench/results/any-order-cpu        # full run (see bench/RESULTS.md)

Same as `python -m packed_ss bench-any-order ...`.
"""
import sys

from packed_ss.lab.bench.any_order import main

if __name__ == "__main__":
    sys.exit(main())
