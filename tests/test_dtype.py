"""dtype="auto" (packed_ss/dtype.py): the CPU dtype whose measured calls are faster wins, the choice is
remembered per model and machine, and the model it gives is the one load_model gives in that dtype, its
drafting adapter attached after the cast."""
import pytest
import torch

import packed_ss
from packed_ss import dtype as auto
from packed_ss.cli import main
from packed_ss.width import CallCost


def costs(ms_by_dtype: dict, calls: list):
    """A stand-in for width.call_cost: tau by the candidate's dtype, no per-row cost; counts its calls."""
    def call_cost(model, attend, backend, rows):
        calls.append(model.dtype)
        return CallCost(ms_by_dtype[model.dtype], 0.0)
    return call_cost


@pytest.mark.parametrize("faster", [torch.float32, torch.bfloat16])
def test_the_faster_dtype_wins_and_is_remembered(monkeypatch, faster):
    slower = torch.bfloat16 if faster == torch.float32 else torch.float32
    calls = []
    monkeypatch.setattr(auto, "call_cost", costs({faster: 2.0, slower: 3.0}, calls))
    model = packed_ss.load_model(draft_adapter=None)
    chosen, how = auto.faster_dtype(model)
    assert chosen == faster and how.startswith("measured now") and sorted(map(str, calls)) == sorted(
        map(str, auto.CANDIDATES))
    assert model.dtype == torch.float32                      # the candidate was a copy
    chosen, how = auto.faster_dtype(packed_ss.load_model(draft_adapter=None))     # a second load: remembered
    assert chosen == faster and how.startswith("remembered from") and len(calls) == 2
    monkeypatch.setattr(torch, "get_num_threads", lambda: 7)  # another machine (threads are part of it)
    assert auto.faster_dtype(model)[1].startswith("measured now") and len(calls) == 4


@pytest.mark.parametrize("faster", [torch.float32, torch.bfloat16])
def test_auto_loads_what_the_chosen_dtype_loads(monkeypatch, faster):
    slower = torch.bfloat16 if faster == torch.float32 else torch.float32
    monkeypatch.setattr(auto, "call_cost", costs({faster: 1.0, slower: 5.0}, []))
    adapter = packed_ss.default_model_path() / "drafter"
    got = packed_ss.load_model(dtype="auto", draft_adapter=adapter)
    want = packed_ss.load_model(dtype=faster, draft_adapter=adapter)
    assert got.dtype == faster and got.dtype_source.startswith("measured now")
    for (name, a), (_, b) in zip(got.state_dict().items(), want.state_dict().items(), strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b), name
    assert got.inv_freq.dtype == torch.float32
    adapted = [(m.lora, w.lora) for m, w in zip(got.modules(), want.modules()) if getattr(m, "lora", None) is not None]
    assert adapted and all(a.a.dtype == torch.float32 and torch.equal(a.a, b.a) and torch.equal(a.b, b.b)
                           for a, b in adapted)             # attached after the cast: never below float32
    assert packed_ss.load_model(dtype=torch.float32).dtype_source == "asked for"
    assert packed_ss.load_model().dtype_source == "default"


def test_a_bad_dtype_is_a_value_error(capsys):
    for bad in ("bf16", torch.int32):
        with pytest.raises(ValueError, match="dtype must be a floating torch dtype, 'auto' or None"):
            packed_ss.load_model(dtype=bad)
    with pytest.raises(SystemExit):
        main(["generate", "x", "--dtype", "bf16"])
    assert "invalid choice: 'bf16'" in capsys.readouterr().err


def test_the_cli_says_which_dtype_it_chose(monkeypatch, capsys):
    monkeypatch.setattr(auto, "call_cost", costs({torch.float32: 5.0, torch.bfloat16: 1.0}, []))
    assert main(["generate", "def add(a, b):", "--schedule", "ar", "--max-new-tokens", "4"]) == 0
    assert "dtype bfloat16 (measured now: ms per call at [1, 16] rows" in capsys.readouterr().err
    assert main(["generate", "def add(a, b):", "--schedule", "ar", "--max-new-tokens", "4", "--dtype",
                 "float32"]) == 0
    assert "dtype float32 (asked for)" in capsys.readouterr().err
