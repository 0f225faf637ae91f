"""Small llama GGUF files written with the `gguf` package the way llama.cpp's convert_hf_to_gguf.py writes them:
Q and K projections permuted for its rotary layout (`LlamaModel.permute`), norms in F32, the other matrices in
the file type asked for, and a byte-level BPE tokenizer (trained here with `tokenizers`) in the metadata with
SmolLM2's special tokens and chat template."""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

DIMS = {"hidden": 64, "intermediate": 128, "layers": 2, "heads": 4, "kv_heads": 2, "context": 256}
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<spare>"]     # ids 0..3: unk, bos, eos, unused
BOS, EOS, SPARE = 1, 2, 3
CHAT_TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
                 "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
                 "{% endif %}")
CORPUS = ["def add(a, b):\n    return a + b\n", "The quick brown fox jumps over the lazy dog.",
          "import os\nprint(os.getcwd())\n", "for i in range(10):\n    print(i * i)\n"] * 4


def byte_level_bpe(vocab_size: int = 320) -> tuple[list[str], list[str]]:
    """(tokens in id order, merges) of a byte-level BPE with SPECIAL first: GGUF's gpt2 tokenizer model."""
    import json

    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    model = json.loads(tok.to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].get)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, merges


def llama_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: HF's rotate-half layout to llama.cpp's interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_weights(vocab: int, tied: bool, seed: int = 0, std: float = 0.3) -> dict[str, np.ndarray]:
    """Random weights under transformers' names and in its layout (float32): the truth the file encodes."""
    d, rng = DIMS, np.random.default_rng(seed)
    head_dim = d["hidden"] // d["heads"]

    def normal(*shape):
        return rng.normal(0.0, std, shape).astype(np.float32)

    def norm():
        return (1.0 + 0.1 * rng.standard_normal(d["hidden"])).astype(np.float32)

    w = {"model.embed_tokens.weight": normal(vocab, d["hidden"]), "model.norm.weight": norm()}
    if not tied:
        w["lm_head.weight"] = normal(vocab, d["hidden"])
    for i in range(d["layers"]):
        p = f"model.layers.{i}."
        w |= {p + "input_layernorm.weight": norm(), p + "post_attention_layernorm.weight": norm(),
              p + "self_attn.q_proj.weight": normal(d["heads"] * head_dim, d["hidden"]),
              p + "self_attn.k_proj.weight": normal(d["kv_heads"] * head_dim, d["hidden"]),
              p + "self_attn.v_proj.weight": normal(d["kv_heads"] * head_dim, d["hidden"]),
              p + "self_attn.o_proj.weight": normal(d["hidden"], d["heads"] * head_dim),
              p + "mlp.gate_proj.weight": normal(d["intermediate"], d["hidden"]),
              p + "mlp.up_proj.weight": normal(d["intermediate"], d["hidden"]),
              p + "mlp.down_proj.weight": normal(d["hidden"], d["intermediate"])}
    return w


GGUF_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
              "lm_head.weight": "output.weight", "input_layernorm": "attn_norm", "post_attention_layernorm":
              "ffn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down"}


def gguf_name(hf: str) -> str:
    if hf in GGUF_NAMES:
        return GGUF_NAMES[hf]
    _, _, layer, *module, leaf = hf.split(".")
    return f"blk.{layer}.{GGUF_NAMES['.'.join(module)]}.{leaf}"


def write_llama_gguf(path: Path, qtype: str = "F32", tied: bool = True, architecture: str = "llama",
                     tokenizer: bool = True, seed: int = 0) -> dict[str, np.ndarray]:
    """Write the file; returns the HF-layout weights it encodes (before quantization)."""
    d = DIMS
    tokens, merges = byte_level_bpe()
    weights = hf_weights(len(tokens), tied, seed)
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("packed-ss test llama")
    writer.add_block_count(d["layers"])
    writer.add_context_length(d["context"])
    writer.add_embedding_length(d["hidden"])
    writer.add_feed_forward_length(d["intermediate"])
    writer.add_head_count(d["heads"])
    writer.add_head_count_kv(d["kv_heads"])
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_vocab_size(len(tokens))
    writer.add_rope_dimension_count(d["hidden"] // d["heads"])
    if tokenizer:
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(tokens)
        writer.add_token_types([gguf.TokenType.CONTROL if t in SPECIAL else gguf.TokenType.NORMAL for t in tokens])
        writer.add_token_merges(merges)
        writer.add_bos_token_id(BOS)
        writer.add_eos_token_id(EOS)
        writer.add_unk_token_id(0)
        writer.add_add_bos_token(False)
        writer.add_chat_template(CHAT_TEMPLATE)
    for name, w in weights.items():
        if name.endswith("q_proj.weight"):
            w = llama_permute(w, d["heads"])
        elif name.endswith("k_proj.weight"):
            w = llama_permute(w, d["kv_heads"])
        if w.ndim == 1 or qtype == "F32":
            writer.add_tensor(gguf_name(name), w)
        else:
            kind = gguf.GGMLQuantizationType[qtype]
            writer.add_tensor(gguf_name(name), gguf.quantize(w, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return weights
