"""Server benchmark: the OpenAI-compatible server on loopback against the same requests offline
(logic: packed_ss/lab/bench/serve.py).

    python bench/serve.py --quick --out /tmp/serve-quick                      # about a minute
    python bench/serve.py --threads 2 --out bench/results/serve-cpu           # full run (bench/RESULTS.md)

Same as `python -m packed_ss bench-serve ...`.
"""
import sys

from packed_ss.lab.bench.serve import main

if __name__ == "__main__":
    sys.exit(main())
