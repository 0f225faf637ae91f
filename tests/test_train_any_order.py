"""The any-order trainer (packed_ss/lab/train): the any-subset objective's orders and masks, and a smoke run."""
import torch

from packed_ss import Engine, load_model
from packed_ss.lab.train import any_order
from packed_ss.lab.train.data import MASK_ID
from packed_ss.lab.train.objective import IGNORE, any_order_batch, window_orders


def test_orders_are_window_major_permutations():
    gen = torch.Generator().manual_seed(0)
    for p_ltr in (0.0, 0.5, 1.0):
        rank, win, cut = window_orders(23, 5, 3, p_ltr, gen)
        assert sorted(rank.tolist()) == list(range(23))
        for w in win.unique():
            pos = (win == w).nonzero().squeeze(1)
            assert sorted(rank[pos].tolist()) == pos.tolist()       # windows follow each other in order
            assert (cut[pos] == cut[pos[0]]).all() and pos[0] <= cut[pos[0]] <= pos[-1]
        if p_ltr == 1.0:
            assert rank.tolist() == list(range(23))


def test_ltr_masks_are_the_ar_mode():
    """With LTR windows, token rows are causal and mask row j sees exactly the tokens before j."""
    T = 9
    x = torch.arange(10, 10 + T)[None]
    ids, pos, mask, labels = any_order_batch(x, 4, 1, 1.0, torch.Generator().manual_seed(1))
    m = mask[0, 0]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    assert torch.equal(m[:T, :T], causal)
    assert torch.equal(m[T:2 * T, :T], causal & ~torch.eye(T, dtype=torch.bool))
    assert torch.equal(m[T:2 * T, T:], torch.cat([torch.eye(T), torch.zeros(T, T)], 1).bool())
    assert ids[0, T:].eq(MASK_ID).all() and pos[0].tolist() == list(range(T)) * 3
    assert labels[0, :T].tolist() == x[0].tolist()
    # drafting rows see only tokens before their window's cut, and are trained only at or after it
    drafted = labels[0, T:] != IGNORE
    seen = m[2 * T:, :T].sum(1)
    assert (seen[drafted] <= torch.arange(T)[drafted]).all()


def test_random_order_masks_hide_each_target():
    T = 12
    x = torch.arange(20, 20 + T)[None]
    _, _, mask, labels = any_order_batch(x, 6, 0, 0.0, torch.Generator().manual_seed(2))
    m = mask[0, 0]
    for j in range(T):
        assert not m[T + j, j] and m[T + j, T + j]                  # a verifier mask never sees its token
        if labels[0, T + j] != IGNORE:
            assert not m[2 * T + j, j]
    assert not torch.equal(m[:T, :T], torch.ones(T, T, dtype=torch.bool).tril())


def test_smoke_run_saves_an_any_order_model(tmp_path):
    out = tmp_path / "ao"
    any_order.main(["--out", str(out), "--steps", "2", "--max-files", "40", "--seq-len", "64", "--batch", "2",
                    "--eval-seqs", "4", "--heldout-pct", "30"])
    model = load_model(out, dtype=torch.float64)
    assert model.cfg.any_order and model.cfg.qk_norm and model.cfg.mask_token_id == 1
    prompt = [100, 200, 300]
    ar = Engine(model, "ar").generate(prompt, 12, eos_token_id=[]).tokens
    assert Engine(model, "packed", width=4).generate(prompt, 12, eos_token_id=[]).tokens == ar
