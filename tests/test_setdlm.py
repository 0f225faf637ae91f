"""SetDLM checkpoints as kuleshov-group/setdlms saves them (tests/released_models.py) and `convert setdlm`."""
import json
import shutil

import pytest
import torch
from released_models import BASE_ID, MASK, hf_cache, setdlm_checkpoint

import packed_ss
from packed_ss.cli import main
from packed_ss.decode.any_order import serial_reference
from packed_ss.model.tensor_files import read_tensors

PROMPTS = [[5, 17, 33, 2, 8], [60, 3, 11]]


@pytest.fixture
def wrapper(tmp_path, monkeypatch):
    """The wrapper directory, its base config found in a local Hugging Face cache (as for a hub id)."""
    path, base = setdlm_checkpoint()
    monkeypatch.setenv("HF_HUB_CACHE", str(hf_cache(tmp_path / "hub", base)))
    return path


def test_wrapper_loads_as_any_order(wrapper):
    model = packed_ss.load_model(wrapper, dtype=torch.float64)
    cfg = model.cfg
    assert cfg.any_order and cfg.suppress_mask_logit and cfg.qk_norm and cfg.tie_word_embeddings
    assert cfg.num_layers == 2 and cfg.vocab_size == 97                          # kept layers; embedding rows
    assert cfg.mask_token_id == packed_ss.load_tokenizer(wrapper).token_to_id(MASK) == 92
    assert packed_ss.Engine(model, "packed").width == 3                          # block_size 4 - 1


@pytest.mark.parametrize("schedule", ["packed", "linear", "quadratic"])
@pytest.mark.parametrize("order", ["ltr", "confidence"])
def test_wrapper_decodes_like_the_serial_reference(wrapper, schedule, order):
    model = packed_ss.load_model(wrapper, dtype=torch.float64)
    engine = packed_ss.Engine(model, schedule, width=3, order=order)
    for prompt in PROMPTS:
        out = engine.generate(prompt, 16, eos_token_id=[])
        assert len(out.tokens) == 16 and model.cfg.mask_token_id not in out.tokens
        assert out.tokens == serial_reference(model, prompt, out.iterations, 16, [])


@torch.no_grad()
def test_mask_logit_suppressed_on_every_row(wrapper):
    from packed_ss.decode.schedules.base import layout

    model = packed_ss.load_model(wrapper, dtype=torch.float64)
    logits = model(torch.tensor([5, 17, 92, 92]), torch.arange(4), layout("cpu", 2, [1, 1], [1, 1]),
                   model.new_cache(8), torch.tensor(0))
    assert torch.isneginf(logits[:, 92]).all() and torch.isfinite(logits[:, :92]).all()


def test_convert_round_trips_bit_identically(wrapper, tmp_path, capsys):
    dst = tmp_path / "converted"
    assert main(["convert", "setdlm", str(wrapper), str(dst)]) == 0
    assert (dst / "model.safetensors").is_file() and (dst / "tokenizer.json").is_file()
    stored = {n: t for n, t in read_tensors([wrapper / "pytorch_model.bin"])}
    converted = dict(read_tensors([dst / "model.safetensors"]))
    assert set(converted) == {n.removeprefix("backbone.model.") for n in stored
                              if n.startswith("backbone.model.model.")}      # the tied head once, no buffer
    for name, tensor in converted.items():
        original = stored["backbone.model." + name]
        assert torch.equal(tensor, original) and tensor.dtype == original.dtype
    a, b = packed_ss.load_model(wrapper, dtype=torch.float64), packed_ss.load_model(dst, dtype=torch.float64)
    assert a.cfg == b.cfg
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    assert "backbone_config" not in json.loads((dst / "config.json").read_text())


def test_convert_help_names_unsafe_pickle(capsys):
    with pytest.raises(SystemExit):
        main(["convert", "setdlm", "--help"])
    assert "--unsafe-pickle" in capsys.readouterr().out


def test_unresolvable_backbone_names_the_id(tmp_path, monkeypatch):
    path, _ = setdlm_checkpoint()
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    with pytest.raises(ValueError, match=f"{BASE_ID}.*--backbone"):
        packed_ss.load_model(path)
    assert main(["convert", "setdlm", str(path), str(tmp_path / "out")]) == 2   # the CLI reports it too


def test_convert_with_explicit_backbone(tmp_path, monkeypatch):
    path, base = setdlm_checkpoint()
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    assert main(["convert", "setdlm", str(path), str(tmp_path / "out"), "--backbone", str(base)]) == 0
    assert packed_ss.load_model(tmp_path / "out").cfg.any_order


class Payload:
    """Anything that is not a tensor: torch.load(weights_only=True) refuses to build it."""


def test_arbitrary_pickle_refused_unless_unsafe(wrapper, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(wrapper, src)
    state = torch.load(src / "pytorch_model.bin", weights_only=True)
    torch.save({"state": {"model": state}, "extra": Payload()}, src / "pytorch_model.bin")   # composer-like
    with pytest.raises(ValueError, match=r"pytorch_model.bin.*arbitrary unpickling.*--unsafe-pickle"):
        packed_ss.load_model(src)
    assert main(["convert", "setdlm", str(src), str(tmp_path / "dst"), "--unsafe-pickle"]) == 0
    assert packed_ss.load_model(tmp_path / "dst").cfg.any_order


def test_wrapper_decodes_compiled(wrapper):
    """The mask-logit suppression is an in-graph write: a compiled step decodes the same tokens."""
    model = packed_ss.load_model(wrapper)
    torch._dynamo.reset()
    eager = packed_ss.Engine(model, "packed", width=3, order="confidence").generate(PROMPTS[0], 12, eos_token_id=[])
    compiled = packed_ss.Engine(model, "packed", width=3, order="confidence", compile="aot_eager")
    assert compiled.generate(PROMPTS[0], 12, eos_token_id=[]).tokens == eager.tokens
