"""Every defect of a checkpoint directory is a ValueError that names the file, tensor or field."""
import json
import shutil

import pytest
import torch
from released_models import nld_checkpoint, setdlm_checkpoint
from safetensors.torch import load_file, save_file

import packed_ss


@pytest.fixture
def nld(tmp_path):
    src, _ = nld_checkpoint("3B")
    dst = tmp_path / "nld"
    shutil.copytree(src, dst)
    return dst


def test_truncated_safetensors(nld):
    data = (nld / "model.safetensors").read_bytes()
    (nld / "model.safetensors").write_bytes(data[: len(data) - 1000])
    with pytest.raises(ValueError, match=r"model.safetensors: truncated safetensors file: tensor \S+ ends at"):
        packed_ss.load_model(nld)


@pytest.mark.parametrize("garbage", [b"", b"\x01\x00", b"\xff" * 8 + b"{}", b"\x04\x00\x00\x00\x00\x00\x00\x00{{{{"])
def test_corrupt_safetensors(nld, garbage):
    (nld / "model.safetensors").write_bytes(garbage)
    with pytest.raises(ValueError, match="model.safetensors: (not a safetensors file|truncated or corrupt|corrupt)"):
        packed_ss.load_model(nld)


def edit_adapter(nld, edit_tensors=None, **config):
    adapter = nld / "linear_spec_lora"
    if edit_tensors:
        tensors = load_file(adapter / "adapter_model.safetensors")
        edit_tensors(tensors)
        save_file(tensors, adapter / "adapter_model.safetensors")
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps(cfg | config))


LORA = "base_model.model.encoder.layers.{}.self_attn.o_proj.lora_{}.weight"


@pytest.mark.parametrize("edit,config,message", [
    (lambda t: t.update({LORA.format(1, "B"): torch.zeros(64, 4)}), {},
     r"tensor base_model.model.encoder.layers.1.self_attn.o_proj.lora_B.weight has shape \(64, 4\), "
     r"expected \(64, 8\)"),
    (None, {"target_modules": ["o_proj", "lm_head"]}, r"target_modules \['lm_head'\] not supported"),
    (lambda t: t.update({LORA.format(2, "A"): torch.zeros(8, 64), LORA.format(2, "B"): torch.zeros(64, 8)}), {},
     "adapts layer 2, but the base model has 2 layers"),
    (lambda t: [t.pop(LORA.format(1, k)) for k in "AB"], {}, r"lacks lora_A / lora_B for \['model.layers.1"),
    (lambda t: t.update({"base_model.model.encoder.layers.0.self_attn.qkv.lora_A.weight": torch.zeros(8, 64)}), {},
     "qkv.lora_A.weight is not a LoRA weight of a decoder linear layer"),
    (None, {"use_dora": True}, "use_dora=True not supported"),
    (None, {"layers_to_transform": [0]}, "which adapter_config.json does not target"),
], ids=["wrong-shape", "unknown-target", "more-layers", "fewer-layers", "unknown-module", "dora", "layers"])
def test_bad_adapter(nld, edit, config, message):
    edit_adapter(nld, edit, **config)
    with pytest.raises(ValueError, match=message):
        packed_ss.load_model(nld)
    packed_ss.load_model(nld, draft_adapter=None)          # the base model itself is fine


def test_adapter_path_without_config(nld, tmp_path):
    with pytest.raises(ValueError, match="draft_adapter: .* has no adapter_config.json"):
        packed_ss.load_model(nld, draft_adapter=tmp_path)


def test_rank_and_alpha_patterns_and_rslora(nld):
    scale = lambda m: m.model.layers[1].self_attn.o_proj.lora.scale  # noqa: E731
    assert scale(packed_ss.load_model(nld)) == 4.0                     # lora_alpha / r = 32 / 8
    edit_adapter(nld, alpha_pattern={"encoder.layers.1.self_attn.o_proj": 16}, use_rslora=True)   # PEFT's names
    model = packed_ss.load_model(nld)
    assert scale(model) == 16 / 8 ** 0.5 and model.model.layers[0].self_attn.o_proj.lora.scale == 32 / 8 ** 0.5


def test_qk_norm_under_nld_layout(nld):
    tensors = load_file(nld / "model.safetensors")
    tensors["encoder.layers.0.self_attn.q_norm.weight"] = torch.ones(16, dtype=torch.bfloat16)
    save_file(tensors, nld / "model.safetensors")
    with pytest.raises(ValueError, match="model_type 'nemotron_labs_diffusion' has no per-head q/k RMSNorm"):
        packed_ss.load_model(nld)


@pytest.mark.parametrize("config,message", [
    ({"model_type": "bd3lm", "architectures": ["BD3LM"]}, "only SetDLM"),
    ({"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}, "unsupported model_type 'qwen2'"),
    ({"hidden_act": "gelu"}, "model_type 'nemotron_labs_diffusion' with hidden_act 'gelu'"),
    ({"dlm_paradigm": "autoregressive"}, "model_type 'nemotron_labs_diffusion' with dlm_paradigm 'autoregressive'"),
])
def test_unsupported_families(nld, config, message):
    raw = json.loads((nld / "config.json").read_text())
    (nld / "config.json").write_text(json.dumps(raw | config))
    with pytest.raises(ValueError, match=message):
        packed_ss.load_model(nld)


def test_qwen3_config_with_encoder_weights(nld):
    raw = json.loads((nld / "config.json").read_text())
    (nld / "config.json").write_text(json.dumps(raw | {"model_type": "qwen3", "architectures": []}))
    with pytest.raises(ValueError, match=r"unexpected weight\(s\) \['diffusion_head.weight', 'encoder"):
        packed_ss.load_model(nld, draft_adapter=None)


def test_setdlm_layer_count_beyond_base(tmp_path, monkeypatch):
    src, base = setdlm_checkpoint()
    dst = tmp_path / "s"
    shutil.copytree(src, dst)
    raw = json.loads((dst / "config.json").read_text())
    raw["backbone_config"] |= {"num_layers": 5, "pretrained_model_name_or_path": str(base)}
    (dst / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=r"backbone_config.num_layers 5 not in \[1, 3\]"):
        packed_ss.load_model(dst)
