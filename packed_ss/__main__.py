"""`python -m packed_ss`: the command line (cli.py).

`python -m` puts the working directory first on sys.path. Run from the root of a checkout, that makes the
checkout's `kernels/` (installed as `packed_ss.kernels`) importable as a top-level `kernels`, which shadows
Hugging Face's `kernels` package: transformers (>= 5.25, which depends on it) then fails to import its model
configs. The checkout root leaves sys.path; this package and its kernels are already found through the
package itself."""
import sys
from pathlib import Path

if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parents[1]:
    sys.path.pop(0)

from .cli import main  # noqa: E402 -- after the path is fixed: cli imports what imports transformers

sys.exit(main())
