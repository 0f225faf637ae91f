"""The native build check: `python -m packed_ss.decode.epilogue [--strict]` (CI runs it with --strict)."""
from __future__ import annotations

import torch

from . import extension
from .extension import native_module, native_unavailable_reason


def _find_tool(name: str, near: str | None = None) -> str | None:
    import shutil
    from pathlib import Path

    candidates = [shutil.which(name)]
    if near:
        candidates.append(str(Path(near).resolve().parent / name))
    try:   # Triton's wheel carries cuobjdump
        import triton
        candidates.append(str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name))
    except ImportError:
        pass
    return next((c for c in candidates if c and Path(c).is_file()), None)


def check_build(strict: bool = False) -> list[str]:
    """Problems with the native build: the module must import and agree with the torch Philox; where nvcc
    exists (found as setup.py finds it) it must carry CUDA kernels for sm_80 and sm_90. `strict` (CI)
    treats a missing module as a problem; otherwise it is reported as a notice by main()."""
    import os
    import shutil
    import subprocess

    from ..sampling import philox_uniform

    problems = []
    mod = native_module()
    if mod is None:
        return [f"the native epilogue is not built: {extension._error}"] if strict else []
    want = philox_uniform(torch.tensor(7), torch.tensor(2**33 + 5), 9).tolist()
    if [mod.philox_uniform(7, 2**33 + 5, i) for i in range(9)] != want:
        problems.append("the native Philox disagrees with packed_ss.decode.sampling.philox_uniform")
    nvcc = next((c for c in (os.environ.get("CUDACXX"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc")
                 if c and os.path.isfile(c)), None)
    if nvcc and os.environ.get("PACKED_SS_CUDA", "1").strip().lower() not in ("0", "false", "no"):
        if not mod.HAS_CUDA:
            problems.append(f"nvcc exists ({nvcc}) but the module was built without its CUDA part")
        elif set(mod.CUDA_ARCHS.split(",")) != {"80", "90"}:
            problems.append(f"the CUDA part targets sm {mod.CUDA_ARCHS}, not 80 and 90")
        else:
            cuobjdump = _find_tool("cuobjdump", nvcc)
            if cuobjdump is None:
                print("packed-ss: no cuobjdump found; trusting the compiled-in architecture list")
            else:
                listing = subprocess.run([cuobjdump, "--list-elf", mod.__file__], capture_output=True, text=True)
                for arch in ("sm_80", "sm_90"):
                    if f".{arch}.cubin" not in listing.stdout:
                        problems.append(f"no {arch} machine code in {mod.__file__} ({listing.stdout.strip()})")
    return problems


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m packed_ss.decode.epilogue",
                                     description="Report (and with --strict, require) the native epilogue build.")
    parser.add_argument("--strict", action="store_true", help="fail if the module or its CUDA part is missing")
    args = parser.parse_args(argv)
    mod = native_module()
    if mod is None:
        print(f"packed-ss native epilogue: not built ({extension._error})")
    else:
        print(f"packed-ss native epilogue: {mod.__file__}; CUDA part: "
              f"{'sm ' + mod.CUDA_ARCHS if mod.HAS_CUDA else 'no'}")
        for device in ("cpu", "cuda"):
            print(f"  {device}: {native_unavailable_reason(device) or 'available'}")
    problems = check_build(args.strict)
    for p in problems:
        print(f"PROBLEM: {p}")
    return 1 if problems else 0
