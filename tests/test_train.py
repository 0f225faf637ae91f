"""The dual-mode trainer (packed_ss/lab/train): the dual-stream (clean + noisy) attention mask, the
evaluation's draft queries, and a smoke training run on a micro config."""

import json
import time

import torch

from packed_ss.lab.train import dual_mode
from packed_ss.lab.train.data import EOS_ID, MASK_ID
from packed_ss.lab.train.evaluate import draft_queries
from packed_ss.lab.train.objective import block_layout, make_batch

M = MASK_ID


def test_block_layout():
    bid, start = block_layout(10, 4, 2)
    assert bid.tolist() == [0, 0, 1, 1, 1, 1, 2, 2, 2, 2]
    assert start.tolist() == [0, 0, 2, 2, 2, 2, 6, 6, 6, 6]
    bid, start = block_layout(7, 3, 0)
    assert bid.tolist() == [1, 1, 1, 2, 2, 2, 3]
    assert start.tolist() == [0, 0, 0, 3, 3, 3, 6]


def test_mask_by_hand():
    # T=6, B=3, offset 0: blocks {0,1,2} (pattern a) and {3,4,5} (pattern b).
    x = torch.tensor([[10, 11, 12, 13, 14, 15]])
    pa = torch.zeros(1, 4, dtype=torch.bool)
    pa[0, 1] = True  # block id 1 = positions 0..2 (block id 0 is the empty pre-offset block)
    bt = make_batch(x, 3, 0, pa)
    assert bt.input_ids.tolist() == [[10, 11, 12, 13, 14, 15, 10, M, M, M, M, M]]
    assert bt.position_ids.tolist() == [[0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5]]
    assert bt.ar_labels.tolist() == [[11, 12, 13, 14, 15, -100]]
    assert bt.diff_labels.tolist() == [[-100, 11, 12, 13, 14, 15]]
    # rows: c0..c5 (clean), n0..n5 (noisy); columns likewise.
    expected = [
        # c0 c1 c2 c3 c4 c5 | n0 n1 n2 n3 n4 n5
        [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],  # c0
        [1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],  # c1
        [1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0],  # c2
        [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0],  # c3
        [1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0],  # c4
        [1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0],  # c5
        [0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0],  # n0: block 0..2 sees no clean row
        [0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0],  # n1
        [0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0],  # n2
        [1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1],  # n3: clean < 3 + own block
        [1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1],  # n4
        [1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1],  # n5
    ]
    assert bt.attention_mask.shape == (1, 1, 12, 12)
    assert bt.attention_mask[0, 0].int().tolist() == expected


def test_mask_with_offset_by_hand():
    # T=5, B=2, offset 1: blocks {0}, {1,2}, {3,4}; all pattern a.
    x = torch.tensor([[20, 21, 22, 23, 24]])
    bt = make_batch(x, 2, 1, torch.ones(1, 5, dtype=torch.bool))
    assert bt.input_ids[0, 5:].tolist() == [20, 21, M, 23, M]
    assert bt.diff_labels.tolist() == [[-100, -100, 22, -100, 24]]
    noisy = bt.attention_mask[0, 0, 5:].int().tolist()
    assert noisy == [
        [0, 0, 0, 0, 0, 1, 0, 0, 0, 0],
        [1, 0, 0, 0, 0, 0, 1, 1, 0, 0],
        [1, 0, 0, 0, 0, 0, 1, 1, 0, 0],
        [1, 1, 1, 0, 0, 0, 0, 0, 1, 1],
        [1, 1, 1, 0, 0, 0, 0, 0, 1, 1],
    ]


def _micro_model(vocab=64):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                      tie_word_embeddings=True)
    torch.manual_seed(0)
    return LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa", dtype=torch.float64).eval()


@torch.no_grad()
def test_packed_forward_matches_engine_queries():
    """Clean rows equal a plain causal forward; the noisy rows of each block equal the
    engine's query: causal KV cache of x_{<s}, then the block rows fully visible."""
    from transformers import DynamicCache

    model = _micro_model()
    T, B, off = 13, 4, 2
    g = torch.Generator().manual_seed(1)
    x = torch.randint(2, 64, (2, T), generator=g)
    pa = torch.rand(2, T // B + 2, generator=g) < 0.5
    pa[0, 1], pa[0, 2] = True, False
    bt = make_batch(x, B, off, pa)
    logits = model(input_ids=bt.input_ids, attention_mask=bt.attention_mask, position_ids=bt.position_ids).logits
    ref = model(input_ids=x).logits
    torch.testing.assert_close(logits[:, :T], ref, rtol=1e-9, atol=1e-9)
    _, start = block_layout(T, B, off)
    for b in range(2):
        for s in sorted(set(start.tolist())):
            rows = (start == s).nonzero().flatten()
            blk = bt.input_ids[b, T + rows].view(1, -1)
            n = blk.shape[1]
            cache = DynamicCache(config=model.config)
            if s > 0:
                model(input_ids=x[b:b + 1, :s], cache=cache, use_cache=True)
            full = torch.ones(1, 1, n, s + n, dtype=torch.bool)
            q = model(input_ids=blk, attention_mask=full, position_ids=torch.arange(s, s + n).view(1, -1),
                      cache=cache, use_cache=True).logits
            torch.testing.assert_close(logits[b, T + rows], q[0], rtol=1e-9, atol=1e-9)


@torch.no_grad()
def test_draft_queries_match_training_layout():
    """The evaluation's overlapping query layout gives the same drafts as make_batch."""
    model = _micro_model()
    x = torch.randint(2, 64, (1, 12), generator=torch.Generator().manual_seed(2))
    bt = make_batch(x, 4, 0, torch.ones(1, 5, dtype=torch.bool))
    logits = model(input_ids=bt.input_ids, attention_mask=bt.attention_mask, position_ids=bt.position_ids).logits
    drafts, ar_pred = draft_queries(model, x[0], [0, 4, 8], 3, "a")
    want = logits[0, 12:].argmax(-1).view(3, 4)[:, 1:]
    assert torch.equal(drafts, want)
    assert torch.equal(ar_pred, logits[0, :12].argmax(-1))


def _micro_run(tmp_path, name):
    data = tmp_path / "data"
    if not data.exists():
        data.mkdir()
        for i in range(24):
            body = "\n".join(f"    x{j} = {i} * {j} + len('abc{j}')" for j in range(12))
            (data / f"mod_{i}.py").write_text(f'def f{i}(a, b):\n    """Doc {i}."""\n{body}\n    return a + b\n')
    out = tmp_path / name
    dual_mode.main(["--out", str(out), "--data-dir", str(data), "--heldout-pct", "30", "--vocab", "300",
                   "--hidden", "32", "--layers", "2", "--heads", "2", "--kv-heads", "1", "--head-dim", "16",
                   "--intermediate", "64", "--max-pos", "128", "--seq-len", "32", "--batch", "2", "--steps", "4",
                   "--warmup", "2", "--eval-seqs", "2", "--no-draft-check", "--log-every-s", "0"])
    return out


def test_smoke_training(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t = time.time()
    out = _micro_run(tmp_path, "out")
    assert time.time() - t < 20
    for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "TRAINING.md"):
        assert (out / f).exists(), f
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["mask_token_id"] == MASK_ID and cfg["eos_token_id"] == EOS_ID
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.mask_token_id == MASK_ID and tok.eos_token_id == EOS_ID
    text = 'def g(x):\n    """Doc.\n    >>> g(1)\n    """\n\tif x :  return x\n'
    assert tok.decode(tok(text).input_ids) == text
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.tie_word_embeddings
    assert "held-out AR loss" in (out / "TRAINING.md").read_text()


def test_training_is_deterministic(tmp_path):
    a = _micro_run(tmp_path, "a")
    b = _micro_run(tmp_path, "b")
    for f in ("model.safetensors", "tokenizer.json"):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
