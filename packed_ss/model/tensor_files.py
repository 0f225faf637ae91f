"""Reading checkpoint tensor files one tensor at a time, with every defect reported as a ValueError.

safetensors files are parsed here (8-byte header length, JSON header, raw little-endian data) and each
tensor is read straight into its own buffer: nothing is memory-mapped, so the resident memory of a load is
the model plus the tensor in flight. Pickle-based files (`.bin`, `.pt`) are opened with
`torch.load(weights_only=True)` only, unless the caller explicitly trusts the file.
"""
from __future__ import annotations

import json
import pickle
import struct
from collections.abc import Iterator
from pathlib import Path

import torch

SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}
MAX_HEADER = 100 << 20


def safetensors_index(file: Path) -> dict[str, tuple[torch.dtype, tuple[int, ...], int, int]]:
    """name -> (dtype, shape, begin, end): absolute byte range in the file, checked against its size."""
    size = file.stat().st_size
    with open(file, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{file}: not a safetensors file ({size} bytes, no header length)")
        (n,) = struct.unpack("<Q", head)
        if n > min(MAX_HEADER, size - 8):
            raise ValueError(f"{file}: truncated or corrupt safetensors file (header of {n} bytes, file of {size})")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"{file}: corrupt safetensors header ({err})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{file}: corrupt safetensors header (not a JSON object)")
    index = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape = SAFETENSORS_DTYPES[entry["dtype"]], tuple(entry["shape"])
            begin, end = entry["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{file}: tensor {name}: unsupported or malformed header entry {entry!r}") from None
        nbytes = torch.Size(shape).numel() * dtype.itemsize
        if end - begin != nbytes or begin < 0:
            raise ValueError(f"{file}: tensor {name}: data offsets {begin}..{end} do not hold {shape} {dtype}")
        if 8 + n + end > size:
            raise ValueError(f"{file}: truncated safetensors file: tensor {name} ends at byte {8 + n + end}, "
                             f"the file has {size}")
        index[name] = (dtype, shape, 8 + n + begin, 8 + n + end)
    return index


def read_safetensors(file: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Each tensor of a safetensors file, in file order, read into a fresh CPU tensor."""
    index = safetensors_index(file)
    with open(file, "rb") as f:
        for name, (dtype, shape, begin, end) in sorted(index.items(), key=lambda item: item[1][2]):
            tensor = torch.empty(shape, dtype=dtype)
            f.seek(begin)
            if end > begin and f.readinto(tensor.reshape(-1).view(torch.uint8).numpy()) != end - begin:
                raise ValueError(f"{file}: truncated safetensors file while reading tensor {name}")
            yield name, tensor


def read_pickle(file: Path, unsafe: bool = False) -> dict[str, torch.Tensor]:
    """The state dict in a `.bin` / `.pt` file (a composer checkpoint's `state.model` included).

    Only `torch.load(weights_only=True)` unless `unsafe`, which runs whatever code the file's pickle names.
    """
    try:
        obj = torch.load(file, map_location="cpu", weights_only=not unsafe, mmap=not unsafe)
    except pickle.UnpicklingError:
        raise ValueError(f"{file}: torch.load(weights_only=True) refuses it: it needs arbitrary unpickling, "
                         "which runs code from the file; if you trust it, convert it once with "
                         "`python -m packed_ss convert ... --unsafe-pickle`") from None
    except (RuntimeError, EOFError, OSError) as err:
        raise ValueError(f"{file}: unreadable pickle checkpoint ({err})") from None
    if isinstance(obj, dict) and isinstance(obj.get("state"), dict) and "model" in obj["state"]:
        obj = obj["state"]["model"]      # composer checkpoint
    if not isinstance(obj, dict) or not all(torch.is_tensor(t) for t in obj.values()):
        raise ValueError(f"{file}: not a state dict of tensors")
    return obj


def tensor_files(directory: Path, stem: str = "") -> list[Path]:
    """The weight files of a directory: its `*.safetensors`, else its `*.bin` / `*.pt` files."""
    for pattern in ("*.safetensors", "*.bin", "*.pt"):
        files = sorted(f for f in directory.glob(stem + pattern) if f.is_file())
        if files:
            return files
    raise ValueError(f"path: no *.safetensors, *.bin or *.pt weight files in {directory}")


def read_tensors(files: list[Path], unsafe_pickle: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor of the files, one at a time where the format allows."""
    for file in files:
        if file.suffix == ".safetensors":
            yield from read_safetensors(file)
        else:
            state = read_pickle(file, unsafe_pickle)
            while state:
                name = next(iter(state))
                yield name, state.pop(name)
