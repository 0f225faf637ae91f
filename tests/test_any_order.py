"""Any-order decoding (paper appendix C): Proposition C.1, Table 2 row counts, stop sequences, API."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from tiny_models import checkpoint, hf_model

from packed_ss import Engine, default_model_path, load_model
from packed_ss.decode.any_order import AnyOrderState, serial_reference
from packed_ss.decode.any_order.rules import apply_stops
from packed_ss.decode.any_order.schedules.threshold import Threshold

SPECULATIVE = ("packed", "linear", "quadratic")
PROMPTS = [[5, 17, 33, 2, 8], [60, 3], [11, 11, 40, 7, 7, 90, 1, 4]]


@pytest.fixture(scope="module")
def random_model():
    return load_model(checkpoint("qwen3-qknorm", any_order=True), dtype=torch.float64)


@pytest.fixture(scope="module")
def trained():
    """The shipped any-order model and tokenized HumanEval-style prompts."""
    from packed_ss import load_tokenizer
    path = default_model_path("any-order")
    tok = load_tokenizer(path)
    texts = ["def fibonacci(n):", "import os\n\ndef list_files(path):\n    ",
             "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):"]
    return load_model(path, dtype=torch.float64), [tok.encode(t).ids for t in texts]


def hf_ar_greedy(path, prompt, n, mask_id):
    """transformers as the oracle of the any-order AR mode: a mask appended after the text, causal."""
    model, seq = hf_model(path), list(prompt)
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([seq + [mask_id]])).logits[0, -1]
            seq.append(int(logits.argmax()))
    return seq[len(prompt):]


@pytest.mark.parametrize("schedule", SPECULATIVE)
@pytest.mark.parametrize("order", ["ltr", "confidence"])
@pytest.mark.parametrize("width", [1, 3, 8])
def test_proposition_c1_random_weights(random_model, schedule, order, width):
    """Greedy any-order output == the serial reference replaying the run's orders; LTR == AR greedy."""
    path = checkpoint("qwen3-qknorm", any_order=True)
    engine = Engine(random_model, schedule, width=width, order=order)
    for prompt in PROMPTS:
        out = engine.generate(prompt, 24, eos_token_id=[])
        assert len(out.tokens) == 24
        assert out.tokens == serial_reference(random_model, prompt, out.iterations, 24, [])
        if order == "ltr":
            assert out.tokens == hf_ar_greedy(path, prompt, 24, random_model.cfg.mask_token_id)


@pytest.mark.parametrize("schedule", SPECULATIVE)
@pytest.mark.parametrize("order", ["ltr", "confidence"])
def test_proposition_c1_trained(trained, schedule, order):
    model, prompts = trained
    ar = Engine(model, "ar")
    out_of_order = 0
    for prompt in prompts:
        out = Engine(model, schedule, width=8, order=order).generate(prompt, 48, eos_token_id=[])
        assert out.tokens == serial_reference(model, prompt, out.iterations, 48, [])
        if order == "ltr":
            assert out.tokens == ar.generate(prompt, 48, eos_token_id=[]).tokens
        out_of_order += sum(it.order[:it.accepted] != sorted(it.order[:it.accepted]) for it in out.iterations)
        assert out.n_accepted > 0, "the trained drafter should get some drafts accepted"
    if order == "confidence":
        assert out_of_order > 0, "confidence order should accept some positions out of textual order"


def test_ltr_equals_transformers_on_trained_model(trained):
    model, prompts = trained
    path = default_model_path("any-order")
    out = Engine(model, "packed", width=8).generate(prompts[0], 32, eos_token_id=[])
    assert out.tokens == hf_ar_greedy(path, prompts[0], 32, model.cfg.mask_token_id)


def _spy_rows(model, live_below):
    """Wrap model.forward to record, per call, its padded row count and its live rows: those at a position
    id below `live_below` (padding rows sit past every output position)."""
    rows, forward = [], model.forward

    def spy(tokens, positions, *args, **kwargs):
        rows.append((tokens.numel(), int((positions < live_below).sum())))
        return forward(tokens, positions, *args, **kwargs)
    model.forward = spy
    return rows, lambda: delattr(model, "forward")


@pytest.mark.parametrize("schedule,calls,expected,padded", [
    ("packed", 1, lambda p, u: p + 3 * u, 1 + 3 * 8),
    ("linear", 2, lambda p, u: p + 3 * u, 1 + 3 * 8),
    ("quadratic", 1, lambda p, u: p + 2 * u + u * u, 1 + 2 * 8 + 8 * 8),
    ("threshold", 1, lambda p, u: p + u, 8 + 8),
    ("ar", 1, lambda p, u: p + 1, 2),
])
def test_rows_per_iteration_match_table_2(trained, schedule, calls, expected, padded):
    """Rows fed to the model per iteration are the paper's Table 2 sizes. The call has a fixed shape
    (`padded` rows, inert padding included); the spy counts the *live* rows of each call, which must be
    p + 3u_t etc. and equal the trace's count."""
    model, prompts = trained
    order = "confidence" if schedule in SPECULATIVE else None
    prompt = prompts[2]
    rows, restore = _spy_rows(model, live_below=len(prompt) + 40)
    try:
        out = Engine(model, schedule, width=8, order=order).generate(prompt, 40, eos_token_id=[])
    finally:
        restore()
    assert rows[0] == (len(prompt), len(prompt))                  # the prompt call (paper E.2)
    assert len(rows) == 1 + calls * len(out.iterations) == out.nfe
    calls_of = [rows[1 + calls * i: 1 + calls * (i + 1)] for i in range(len(out.iterations))]
    assert all(sum(total for total, _ in c) == padded for c in calls_of)
    per_iteration = [sum(live for _, live in c) for c in calls_of]
    for it, n in zip(out.iterations, per_iteration):
        assert n == it.rows == expected(it.pending_rows, it.window)
    assert {it.pending_rows for it in out.iterations} <= ({0, 1} if schedule != "threshold" else set(range(9)))
    if schedule in SPECULATIVE:
        assert max(per_iteration) == expected(1, 8)                # the paper's maximum column at W = 8


def test_stop_sequence_ends_output_at_earliest_marker(trained):
    model, prompts = trained
    base = Engine(model, "ar").generate(prompts[0], 40, eos_token_id=[]).tokens
    marker = base[10:12]
    first_end = next(e for e in range(1, 40) if base[e - 1:e + 1] == marker)
    for schedule in SPECULATIVE:
        for order in ("ltr", "confidence"):
            out = Engine(model, schedule, width=8, order=order).generate(
                prompts[0], 40, eos_token_id=[], stop_sequences=[marker, [model.cfg.vocab_size - 1] * 3])
            assert out.tokens == serial_reference(model, prompts[0], out.iterations, 40,
                                                  [tuple(marker), (model.cfg.vocab_size - 1,) * 3])
            if order == "ltr":
                assert out.tokens == base[:first_end + 1]


@pytest.mark.parametrize("schedule", ["packed", "quadratic"])
def test_truncation_reprocesses_rows_that_saw_dropped_tokens(trained, schedule):
    """A stop recognised after positions beyond it were accepted: those leave P_t, and cache rows that saw
    them are processed again; the output still equals the serial reference. Markers are picked from a
    free run where, in the iteration that completes the marker, a later position is already cached and an
    earlier one still open (the run is the same until the marker is recognised): the re-queued rows then
    overflow the call's one N slot, the step sets `hold`, and resume() runs an iteration with a wider N."""
    model, prompts = trained
    engine = Engine(model, schedule, width=8, order="confidence")
    held = 0
    for prompt in prompts:
        free = engine.generate(prompt, 48, eos_token_id=[])
        when = {j: t for t, it in enumerate(free.iterations) for j in it.order[:it.accepted]}
        tokens = free.tokens
        candidates = [i for i in range(1, 48) if all(tokens[e - 1:e + 1] != tokens[i - 1:i + 1] for e in range(1, i))
                      and any(when[j] < max(when[i - 1], when[i]) for j in range(i + 1, 48))
                      and any(when[k] > max(when[i - 1], when[i]) for k in range(i - 1))]
        for i in candidates[:3]:
            marker = tokens[i - 1:i + 1]
            out = engine.generate(prompt, 48, eos_token_id=[], stop_sequences=[marker])
            assert out.tokens == tokens[:i + 1]
            assert out.tokens == serial_reference(model, prompt, out.iterations, 48, [tuple(marker)])
            held += sum(it.pending_rows > 1 for it in out.iterations)
    assert held > 0, "no run exercised the truncation path"


def _state(tokens: dict[int, int], accepted: list[int], n_cached: int, stops) -> AnyOrderState:
    st = AnyOrderState.new(3, 1, prompt_len=3, max_new=6, seed=0, stops=stops, device="cpu").request()
    for j, t in tokens.items():
        st.out[j] = t
    st.acc_pos[:len(accepted)] = torch.tensor(accepted)
    st.n_acc.fill_(len(accepted))
    st.n_cached.fill_(n_cached)
    return st


def test_apply_stops_keeps_acceptance_order():
    """P_t = [0, 4 | 1, 2] (cache | pending) with stop (7, 8) at positions 1-2: E = 2, pair 4 leaves, the
    pending rows keep their order, and the cache keeps the rows before the dropped one."""
    st = _state({0: 1, 4: 5, 1: 7, 2: 8}, [0, 4, 1, 2], 2, [(7, 8)])
    apply_stops(st, torch.tensor(True))
    assert int(st.end) == 2 and st.out[:3].tolist() == [1, 7, 8] and int(st.out[4]) == -1
    assert st.acc_pos[:int(st.n_acc)].tolist() == [0, 1, 2] and int(st.n_cached) == 1
    assert int(st.n_out) == 3 and bool(st.done)


def test_apply_stops_requeues_cache_rows_that_saw_a_dropped_token():
    """Cache [0, 4, 1], pending [2]: the row of 1 saw the dropped 4, so it leaves the cache and is pending
    again, before 2; a step on an inactive state changes nothing."""
    st = _state({0: 1, 4: 5, 1: 7, 2: 8}, [0, 4, 1, 2], 3, [(7, 8), (9,)])
    before = {k: v.clone() for k, v in st.tensors().items()}
    apply_stops(st, torch.tensor(False))
    assert all(torch.equal(before[k].nan_to_num(), v.nan_to_num()) for k, v in st.tensors().items())
    apply_stops(st, torch.tensor(True))
    assert st.acc_pos[:int(st.n_acc)].tolist() == [0, 1, 2] and int(st.n_cached) == 1
    assert int(st.end) == 2 and int(st.n_out) == 3


@pytest.mark.parametrize("schedule", ["packed", "quadratic", "threshold"])
def test_triton_backend_matches_torch(schedule):
    """The fused kernel takes the any-order layouts (TRITON_INTERPRET=1 on the CPU)."""
    model = load_model(checkpoint("qwen3-qknorm", any_order=True))
    order = "confidence" if schedule != "threshold" else None
    outs = [Engine(model, schedule, width=4, order=order, backend=b).generate(PROMPTS[0], 10, eos_token_id=[])
            for b in ("torch", "triton")]
    assert outs[0].tokens == outs[1].tokens and outs[0].nfe == outs[1].nfe


@pytest.mark.parametrize("threshold", [0.9, 0.3])
def test_native_threshold_decoder(trained, monkeypatch, threshold):
    """Every call commits at least one position; a lower threshold commits several per call (this tiny
    model rarely reaches 0.9)."""
    monkeypatch.setattr(Threshold, "threshold", threshold)
    model, prompts = trained
    out = Engine(model, "threshold", width=8).generate(prompts[0], 48, eos_token_id=[])
    assert len(out.tokens) == 48 and all(t is not None for t in out.tokens)
    assert all(len(it.order) >= 1 for it in out.iterations)
    assert sum(len(it.order) for it in out.iterations) == 48
    if threshold < 0.9:
        assert out.nfe < 1 + 48


def test_ar_sampling_is_seeded(trained):
    model, prompts = trained
    engine = Engine(model, "ar")
    a = engine.generate(prompts[0], 16, temperature=1.0, seed=3, eos_token_id=[]).tokens
    assert a == engine.generate(prompts[0], 16, temperature=1.0, seed=3, eos_token_id=[]).tokens
    assert engine.generate(prompts[0], 16, temperature=1.0, top_k=1, seed=5, eos_token_id=[]).tokens == \
        engine.generate(prompts[0], 16, eos_token_id=[]).tokens


def test_errors(random_model):
    ltr = load_model(checkpoint("qwen3-qknorm"))
    with pytest.raises(ValueError, match="order"):
        Engine(ltr, "packed", order="confidence")
    with pytest.raises(ValueError, match="schedule"):
        Engine(ltr, "threshold")
    with pytest.raises(ValueError, match="order must be one of"):
        Engine(random_model, "packed", order="random")
    with pytest.raises(ValueError, match="order="):
        Engine(random_model, "threshold", order="confidence")
    with pytest.raises(ValueError, match="temperature"):
        Engine(random_model, "packed", order="confidence").generate([1, 2], 4, temperature=1.0)
    with pytest.raises(ValueError, match="stop_sequences"):
        Engine(random_model, "packed").generate([1, 2], 4, stop_sequences=[[]])


@pytest.mark.parametrize("marker", [{"any_order": True}, {"model_type": "setdlm"},
                                    {"architectures": ["SetDLM"]}])
def test_setdlm_directory(tmp_path, marker):
    """A SetDLM-style directory: any-order by flag or by name, its mask token named only by the tokenizer."""
    src = default_model_path("any-order")
    for f in src.iterdir():
        if f.is_file():      # the weights and tokenizer, not the drafting adapter's directory
            shutil.copy(f, tmp_path / f.name)
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["mask_token_id"], cfg["any_order"]
    cfg.pop("draft_adapter", None)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, **marker}))
    model = load_model(tmp_path)
    assert model.cfg.mask_token_id == 1 and model.cfg.any_order and model.cfg.qk_norm
