"""width="auto" (packed_ss/width.py): the choice from an acceptance profile and a per-call cost, the engine's
use of it (engine.width reports it), and the profile file's checks."""
import dataclasses
import json

import pytest
from tiny_models import checkpoint

import packed_ss
import packed_ss.engine
from packed_ss.width import PROFILE_FILE, CallCost, call_cost, choose_width, read_profile, step_overhead

PROFILE = {"width": 6, "lagged": [1.0, 1.5, 2.0, 2.4, 2.6, 2.7], "fresh": [1.8, 2.5, 3.0, 3.3, 3.4, 3.45]}
DIFFUSION = dict(drafts="diffusion")


def test_choice_by_hand():
    packed_rows = lambda w: [2 * (w + 1)]    # noqa: E731
    # tau 5, delta 0.5: W=3 costs 9 ms for 2.0 tokens (0.222/ms), W=4 10 ms for 2.4 (0.24), W=5 11 ms (0.236)
    assert choose_width(PROFILE["lagged"], packed_rows, CallCost(5.0, 0.5)) == 4
    # rows almost free: the widest pays
    assert choose_width(PROFILE["lagged"], packed_rows, CallCost(5.0, 0.001)) == 6
    # rows expensive: the narrowest does
    assert choose_width(PROFILE["fresh"], lambda w: [w + 1, w + 1], CallCost(0.1, 10.0)) == 1
    assert choose_width([2.0, 2.0, 2.0], lambda w: [1], CallCost(1.0, 0.0)) == 1      # a tie: the smallest
    with pytest.raises(ValueError, match="tokens must list"):
        choose_width([], packed_rows, CallCost(1.0, 1.0))


@pytest.fixture
def model():
    return packed_ss.load_model(checkpoint("llama-gqa"))


def test_engine_reports_the_auto_width(model, monkeypatch):
    seen = []

    def cost(m, attend, backend, rows):
        seen.append(rows)
        return CallCost(5.0, 0.5)
    monkeypatch.setattr(packed_ss.engine, "call_cost", cost)
    monkeypatch.setattr(packed_ss.engine, "step_overhead", lambda *a: 0.0)
    model.draft_profile = PROFILE
    assert packed_ss.Engine(model, "packed", **DIFFUSION).width == 4
    assert packed_ss.Engine(model, "packed", width="auto", **DIFFUSION).width == 4
    # Linear-SS: two calls of W+1 rows, fresh drafts: 1.8 / 11 < 2.5 / 12 < 3.0 / 13 < 3.3 / 14 > 3.4 / 15
    assert packed_ss.Engine(model, "linear", **DIFFUSION).width == 4
    assert seen[0] == [4, 10, 14]     # the smallest, middle and largest of packed's 2(W+1) rows, W = 1..6
    assert packed_ss.Engine(model, "packed", width=2).width == 2
    assert packed_ss.Engine(model, "ar").width == packed_ss.engine.DEFAULT_WIDTH
    # lookup drafts read their own replays: packed with both drafters 3.5 / 9 < 4.4 / 10 < 5.0 / 11 > 5.4 / 12;
    # the verify-only schedule, one call of W+1 rows: 2.8 / 7 < 3.2 / 7.5 > 3.3 / 8
    model.draft_profile = dict(PROFILE, **{"lagged+lookup": [1.5, 2.5, 3.5, 4.4, 5.0, 5.4],
                                           "lookup": [1.7, 2.3, 2.8, 3.2, 3.3, 3.4]})
    assert packed_ss.Engine(model, "packed", drafts="both").width == 5
    assert packed_ss.Engine(model, "lookup").width == 4
    assert packed_ss.Engine(model, "packed", **DIFFUSION).width == 4
    model.draft_profile = PROFILE                  # a profile without lookup replays: the fixed default
    assert packed_ss.Engine(model, "packed", drafts="both").width == packed_ss.engine.DEFAULT_WIDTH
    model.draft_profile = None
    assert packed_ss.Engine(model, "packed").width == packed_ss.engine.DEFAULT_WIDTH


def test_step_overhead_favours_wider_calls(model, monkeypatch):
    # tau 5, delta 0.5 picks W = 4 (above); 6 ms more per call: W=4 16 ms for 2.4 tokens (0.150/ms), W=5 17 ms
    # for 2.6 (0.153), W=6 18 ms for 2.7 (0.150)
    monkeypatch.setattr(packed_ss.engine, "call_cost", lambda *a: CallCost(5.0, 0.5))
    probed = []

    def overhead(key, decode, model_ms):
        probed.append((decode(3), model_ms))
        return 6.0
    monkeypatch.setattr(packed_ss.engine, "step_overhead", overhead)
    model.draft_profile = PROFILE
    assert packed_ss.Engine(model, "packed", **DIFFUSION).width == 5
    (result, model_ms), = probed
    assert len(result.tokens) == 3 and model_ms == 5.0 + 0.5 * 4     # probed at W = 1: one call of 4 rows
    monkeypatch.setattr(packed_ss.engine, "step_overhead", lambda *a: pytest.fail("probed without a profile"))
    model.draft_profile = None
    assert packed_ss.Engine(model, "packed").width == packed_ss.engine.DEFAULT_WIDTH


def test_step_overhead_arithmetic():
    runs = {8: [(0.012, 10), (0.010, 10)], 40: [(0.050, 42), (0.060, 42)]}
    calls = []

    def decode(n):
        calls.append(n)
        wall_s, nfe = runs[n][calls.count(n) - 1]
        return packed_ss.GenerateResult(tokens=[0] * n, nfe=nfe, wall_s=wall_s, model_s=0.0)
    # the faster run of each: (0.050 - 0.010) s over 32 calls = 1.25 ms per call, 1.0 of it the model's
    assert step_overhead(("test", 1), decode, 1.0) == pytest.approx(0.25)
    assert calls == [8, 8, 40, 40]
    assert step_overhead(("test", 1), decode, 1.0) == pytest.approx(0.25) and len(calls) == 4    # measured once
    calls.clear()
    assert step_overhead(("test", 2), decode, 2.0) == 0.0          # a fit above the measurement: never below zero


def test_the_adaptive_width_is_the_lookup_width_where_the_drafter_is_narrower(model):
    """No drafter bounds a lookup draft: the adaptive schedule's widest shape is LOOKUP_WIDTH where it drafts by
    lookup and the drafter's width (the profile's, else the default) is narrower; the drafter's with diffusion
    drafts alone, or where it is wider; the block at most."""
    lookup_width = packed_ss.engine.LOOKUP_WIDTH
    for profile in (PROFILE, None):
        model.draft_profile = profile
        assert packed_ss.Engine(model).width == packed_ss.Engine(model, drafts="lookup").width == lookup_width
        assert packed_ss.Engine(model, drafts="diffusion").width == (6 if profile else packed_ss.engine.DEFAULT_WIDTH)
    model.draft_profile = dict(PROFILE, width=24)
    assert packed_ss.Engine(model).width == 24
    model.cfg = dataclasses.replace(model.cfg, block_size=12)
    assert packed_ss.Engine(model).width == 11


def test_auto_width_respects_block_size(tmp_path, monkeypatch):
    monkeypatch.setattr(packed_ss.engine, "call_cost", lambda *a: CallCost(5.0, 0.001))
    monkeypatch.setattr(packed_ss.engine, "step_overhead", lambda *a: 0.0)
    model = packed_ss.load_model(checkpoint("llama-gqa"))
    model.draft_profile = PROFILE
    model.cfg = dataclasses.replace(model.cfg, block_size=4)
    assert packed_ss.Engine(model, "packed").width == 3


def test_any_order_quadratic_reads_the_branch_replay(monkeypatch):
    monkeypatch.setattr(packed_ss.engine, "call_cost", lambda *a: CallCost(5.0, 0.001))   # rows nearly free
    monkeypatch.setattr(packed_ss.engine, "step_overhead", lambda *a: 0.0)
    model = packed_ss.load_model(checkpoint("qwen3-qknorm", any_order=True))
    model.draft_profile = None
    fixed = packed_ss.Engine(model, "quadratic").width
    model.draft_profile = dict(PROFILE, branch=[1.0, 2.0, 1.5, 1.4, 1.3, 1.2])
    assert packed_ss.Engine(model, "quadratic").width == 2      # the branch replay's best; "fresh" would give 6
    assert packed_ss.Engine(model, "linear").width == 6
    assert packed_ss.Engine(model, "packed").width == 6
    model.draft_profile = PROFILE                                 # a profile without the branch replay
    assert packed_ss.Engine(model, "quadratic").width == fixed


def test_call_cost_is_measured_once(model):
    attend = packed_ss.model.attention.reference_attention
    first = call_cost(model, attend, "torch", [2, 8])
    assert first.tau_ms > 0 and first.delta_ms >= 0
    assert call_cost(model, attend, "torch", [8, 2]) is first


def test_profile_file(tmp_path):
    assert read_profile(tmp_path) is None
    (tmp_path / PROFILE_FILE).write_text(json.dumps(PROFILE))
    assert read_profile(tmp_path) == PROFILE == read_profile(tmp_path / PROFILE_FILE)    # the directory or the file
    (tmp_path / PROFILE_FILE).write_text(json.dumps(dict(PROFILE, lagged=[1.0, 2.0])))
    with pytest.raises(ValueError, match="'lagged' must list expected tokens per iteration"):
        read_profile(tmp_path)
    (tmp_path / PROFILE_FILE).write_text(json.dumps(dict(PROFILE, branch=[1.0] * 6)))
    assert read_profile(tmp_path)["branch"] == [1.0] * 6
    (tmp_path / PROFILE_FILE).write_text(json.dumps(dict(PROFILE, branch=[0.5] * 6)))
    with pytest.raises(ValueError, match="'branch' must list expected tokens per iteration"):
        read_profile(tmp_path)


def test_width_validation_still_names_the_range(model):
    with pytest.raises(ValueError, match=r"width must be an integer \[1, 64\]"):
        packed_ss.Engine(model, "packed", width="wide")
