"""Any-order decoding (paper appendix C): Proposition C.1, Table 2 row counts, stop sequences, API."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from tiny_models import checkpoint, hf_model

import packed_ss.decode.any_order.schedules as any_order_schedules
from packed_ss import Engine, SamplingParams, default_model_path, load_model
from packed_ss.decode.any_order import AnyOrderDecoder, AnyOrderState, serial_reference
from packed_ss.model.attention import packed_attention_ref

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


def _spy_rows(model):
    """Wrap model.forward to record the number of input rows of every call."""
    rows, forward = [], model.forward

    def spy(tokens, *args, **kwargs):
        rows.append(tokens.numel())
        return forward(tokens, *args, **kwargs)
    model.forward = spy
    return rows, lambda: delattr(model, "forward")


@pytest.mark.parametrize("schedule,calls,expected", [
    ("packed", 1, lambda p, u: p + 3 * u),
    ("linear", 2, lambda p, u: p + 3 * u),
    ("quadratic", 1, lambda p, u: p + 2 * u + u * u),
    ("native", 1, lambda p, u: p + u),
    ("ar", 1, lambda p, u: p + 1),
])
def test_rows_per_iteration_match_table_2(trained, schedule, calls, expected):
    """Rows fed to the model per iteration, counted at the model call, are the paper's Table 2 sizes."""
    model, prompts = trained
    order = "confidence" if schedule in SPECULATIVE else None
    rows, restore = _spy_rows(model)
    try:
        out = Engine(model, schedule, width=8, order=order).generate(prompts[2], 40, eos_token_id=[])
    finally:
        restore()
    assert rows[0] == len(prompts[2])                          # the prompt call (paper E.2)
    per_iteration = [sum(rows[1 + calls * i: 1 + calls * (i + 1)]) for i in range(len(out.iterations))]
    assert len(rows) == 1 + calls * len(out.iterations) == out.nfe
    for it, n in zip(out.iterations, per_iteration):
        assert n == it.rows == expected(it.pending_rows, it.window)
    assert {it.pending_rows for it in out.iterations} <= ({0, 1} if schedule != "native" else set(range(9)))
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


def test_truncation_reprocesses_rows_that_saw_dropped_tokens(trained):
    """A stop recognised after positions beyond it were accepted: those leave P_t, and cache rows that saw
    them are processed again; the output still equals the serial reference. Markers are picked from a
    free run where a later position was accepted no later than the marker's end (the run is the same
    until the marker is recognised)."""
    model, prompts = trained
    decoder = AnyOrderDecoder(model, "packed", 8, "confidence", packed_attention_ref)
    reprocessed = 0
    for prompt in prompts:
        free = decoder.generate(prompt, 48, SamplingParams(), 0, [])
        when = {j: t for t, it in enumerate(free.trace) for j in it.order[:it.accepted]}
        tokens = free.output()
        candidates = [i for i in range(1, 48) if any(j > i and when[j] <= when[i] for j in range(i + 1, 48))
                      and all(tokens[e - 1:e + 1] != tokens[i - 1:i + 1] for e in range(1, i))]
        for i in candidates[:4]:
            marker = tuple(tokens[i - 1:i + 1])
            st = decoder.generate(prompt, 48, SamplingParams(), 0, [marker])
            assert st.output() == tokens[:i + 1]
            assert st.output() == serial_reference(model, prompt, st.trace, 48, [marker])
            reprocessed += st.reprocessed
    assert reprocessed > 0, "no run exercised the truncation path"


def test_apply_stops_keeps_acceptance_order():
    st = AnyOrderState(prompt_len=3, limit=6, stop_sequences=[(7, 8)])
    for j, t in [(0, 1), (4, 5), (1, 7)]:
        st.tokens[j] = t
    st.cached, st.pending = [0, 4], [(1, 7)]
    st.tokens[2] = 8
    st.pending.append((2, 8))
    st.apply_stops()
    assert st.end == 2 and st.output() == [1, 7, 8]
    assert st.cached == [0] and st.pending == [(1, 7), (2, 8)] and st.tokens[4] is None


@pytest.mark.parametrize("schedule", ["packed", "quadratic", "native"])
def test_triton_backend_matches_torch(schedule):
    """The fused kernel takes the any-order layouts (TRITON_INTERPRET=1 on the CPU)."""
    model = load_model(checkpoint("qwen3-qknorm", any_order=True))
    order = "confidence" if schedule != "native" else None
    outs = [Engine(model, schedule, width=4, order=order, backend=b).generate(PROMPTS[0], 10, eos_token_id=[])
            for b in ("torch", "triton")]
    assert outs[0].tokens == outs[1].tokens and outs[0].nfe == outs[1].nfe


@pytest.mark.parametrize("threshold", [0.9, 0.3])
def test_native_threshold_decoder(trained, monkeypatch, threshold):
    """Every call commits at least one position; a lower threshold commits several per call (this tiny
    model rarely reaches 0.9)."""
    monkeypatch.setattr(any_order_schedules, "NATIVE_THRESHOLD", threshold)
    model, prompts = trained
    out = Engine(model, "native", width=8).generate(prompts[0], 48, eos_token_id=[])
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
        Engine(ltr, "native")
    with pytest.raises(ValueError, match="order must be one of"):
        Engine(random_model, "packed", order="random")
    with pytest.raises(ValueError, match="order="):
        Engine(random_model, "native", order="confidence")
    with pytest.raises(ValueError, match="compile"):
        Engine(random_model, "packed", compile=True)
    with pytest.raises(ValueError, match="temperature"):
        Engine(random_model, "packed", order="confidence").generate([1, 2], 4, temperature=1.0)
    with pytest.raises(ValueError, match="several tokens"):
        Engine(ltr, "packed").generate([1, 2], 4, stop_sequences=[[3, 4]])
    with pytest.raises(ValueError, match="stop_sequences"):
        Engine(random_model, "packed").generate([1, 2], 4, stop_sequences=[[]])


@pytest.mark.parametrize("marker", [{"any_order": True}, {"model_type": "setdlm"},
                                    {"architectures": ["SetDLM"]}])
def test_setdlm_directory(tmp_path, marker):
    """A SetDLM-style directory: any-order by flag or by name, its mask token named only by the tokenizer."""
    src = default_model_path("any-order")
    for f in src.iterdir():
        shutil.copy(f, tmp_path / f.name)
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["mask_token_id"], cfg["any_order"]
    (tmp_path / "config.json").write_text(json.dumps({**cfg, **marker}))
    model = load_model(tmp_path)
    assert model.cfg.mask_token_id == 1 and model.cfg.any_order and model.cfg.qk_norm
