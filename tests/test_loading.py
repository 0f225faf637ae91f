"""Loading: HF directories (checked against transformers) and the Nemotron-Labs-Diffusion layout."""
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_models import checkpoint

import packed_ss
from packed_ss.decode.schedules.base import layout

# YaRN with a small original context and the Llama-4 query scale, so that positions 0..39 cross
# several floor(pos / original_max) steps and every rope feature is exercised.
ROPE = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=8,
            beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0, llama_4_scaling_beta=0.1)
SEQ = torch.randint(0, 90, (40,), generator=torch.Generator().manual_seed(0))
# transformers computes RMSNorm statistics and rope in float32 even for a float64 model; the engine
# keeps float64 norms, so logits agree to about 1e-7 relative, not to float64 round-off.
TOL = dict(rtol=1e-5, atol=1e-6)


def logits_of(model, tokens):
    """Causal logits of a whole sequence through the engine's packed forward (one prefill call)."""
    cache = model.new_cache(tokens.numel())
    return model(tokens, torch.arange(tokens.numel()), layout("cpu", tokens.numel()), cache, torch.tensor(0))


@pytest.fixture(scope="module")
def ministral_dir(tmp_path_factory):
    from transformers import Ministral3Config, Ministral3ForCausalLM

    torch.manual_seed(0)
    cfg = Ministral3Config(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                           max_position_embeddings=256, rope_parameters=dict(ROPE), sliding_window=None,
                           tie_word_embeddings=False, mask_token_id=96, eos_token_id=95, bos_token_id=1)
    model = Ministral3ForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    path = tmp_path_factory.mktemp("ministral3")
    model.save_pretrained(path)
    return path


def to_nemotron_layout(src, dst):
    """Write the same weights as Nemotron-Labs-Diffusion does: encoder.*, diffusion_head.weight."""
    hf = json.loads((src / "config.json").read_text())
    keys = ["hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
            "intermediate_size", "rms_norm_eps", "vocab_size", "rope_parameters", "mask_token_id",
            "bos_token_id", "eos_token_id", "max_position_embeddings"]
    config = {k: hf[k] for k in keys} | {"model_type": "nemotron_labs_diffusion", "block_size": 32}
    (dst / "config.json").write_text(json.dumps(config))
    tensors = load_file(src / "model.safetensors")
    renamed = {("diffusion_head.weight" if n == "lm_head.weight" else "encoder." + n.removeprefix("model.")): t
               for n, t in tensors.items()}
    save_file(renamed, dst / "model.safetensors")


def test_ministral3_matches_transformers(ministral_dir):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(ministral_dir, dtype=torch.float64).eval()
    ours = packed_ss.load_model(ministral_dir, dtype=torch.float64)
    with torch.no_grad():
        expected = hf(SEQ[None]).logits[0]
        torch.testing.assert_close(logits_of(ours, SEQ), expected, **TOL)


def test_nemotron_layout_loads_identical_logits(ministral_dir, tmp_path):
    to_nemotron_layout(ministral_dir, tmp_path)
    hf_layout = packed_ss.load_model(ministral_dir, dtype=torch.float64)
    nemotron = packed_ss.load_model(tmp_path, dtype=torch.float64)
    assert nemotron.cfg.llama4_scaling == (0.1, 8) and not nemotron.cfg.tie_word_embeddings
    with torch.no_grad():
        assert torch.equal(logits_of(nemotron, SEQ), logits_of(hf_layout, SEQ))


@pytest.mark.parametrize("name", ["llama-gqa", "mistral-untied", "qwen3-qknorm"])
def test_hf_families_match_transformers(name):
    from tiny_models import hf_model

    path = checkpoint(name)
    ours = packed_ss.load_model(path, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(logits_of(ours, SEQ), hf_model(path)(SEQ[None]).logits[0],
                                   **TOL)


def edited_copy(tmp_path, config_edit=None, tensor_edit=None):
    src = checkpoint("llama-gqa")
    dst = tmp_path / "model"
    shutil.copytree(src, dst)
    if config_edit:
        config = json.loads((dst / "config.json").read_text())
        config_edit(config)
        (dst / "config.json").write_text(json.dumps(config))
    if tensor_edit:
        tensors = load_file(dst / "model.safetensors")
        tensor_edit(tensors)
        save_file(tensors, dst / "model.safetensors")
    return dst


@pytest.mark.parametrize("config_edit,tensor_edit,message", [
    (lambda c: (c.pop("mask_token_id"), c.update(any_order=True)), None, "any-order model needs one"),
    (lambda c: c.update(model_type="gpt2"), None, "unsupported model_type 'gpt2'"),
    (None, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"), "lacks weight.*layers.1.mlp.up_proj"),
    (None, lambda t: t.update({"model.norm.weight": torch.ones(3)}), "model.norm.weight has shape"),
    (None, lambda t: t.update({"model.extra": torch.ones(3)}), "unexpected weight"),
], ids=["no-mask-token", "unknown-type", "missing-weight", "misshaped-weight", "unexpected-weight"])
def test_bad_checkpoints_raise_value_error(tmp_path, config_edit, tensor_edit, message):
    with pytest.raises(ValueError, match=message):
        packed_ss.load_model(edited_copy(tmp_path, config_edit, tensor_edit))


def test_missing_directory_raises_value_error(tmp_path):
    with pytest.raises(ValueError, match="config.json"):
        packed_ss.load_model(tmp_path)
