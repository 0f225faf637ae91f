"""Progress bars for long lab runs: tqdm on stderr, so that stdout keeps only the results."""
from __future__ import annotations

import sys

from tqdm import tqdm


def progress(total: int, desc: str, interval: float | None = None, **kwargs) -> tqdm:
    """A bar of `total` steps on stderr, redrawn at most every `interval` seconds (default: 0.1 on a
    terminal, 10 in a log file, where every redraw is written out)."""
    if interval is None:
        interval = 0.1 if sys.stderr.isatty() else 10.0
    return tqdm(total=total, desc=desc, file=sys.stderr, mininterval=interval, dynamic_ncols=True, **kwargs)
