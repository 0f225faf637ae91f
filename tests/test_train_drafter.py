"""The drafter trainer (packed_ss/lab/drafter): its drafting calls are the engine's, its replay of greedy
decoding is the engine's, and `train-drafter` runs end to end on a tiny budget and writes an adapter that
load_model(draft_adapter=...) attaches, that changes the drafts and never the output."""
import json

import pytest
import torch
from tiny_models import checkpoint

import packed_ss
from packed_ss.cli import main
from packed_ss.decode.schedules.base import layout
from packed_ss.lab.drafter import lora, resume, train
from packed_ss.lab.drafter.calls import base_cache, drafting_logits, targets
from packed_ss.lab.drafter.data import function_prompts
from packed_ss.lab.drafter.profile import acceptance, leading, replay
from packed_ss.model.attention import Layout
from packed_ss.width import PROFILE_FILE

SEQ = torch.tensor([5, 17, 42, 8, 9, 60, 3, 12, 77, 31, 2, 44, 50, 7])


@pytest.mark.parametrize("any_order", [False, True])
def test_drafting_calls_are_the_engines(any_order):
    """A batch of groups gives the logits of the engine's own drafting call from each prefix (LoRA on)."""
    name = "qwen3-qknorm" if any_order else "llama-gqa"
    model = packed_ss.load_model(checkpoint(name, any_order=True) if any_order else checkpoint(name),
                                 dtype=torch.float64)
    lora.attach(model, ["q_proj", "o_proj", "down_proj"], 4, 8.0, torch.Generator().manual_seed(0))
    for linear in lora.modules(model, ["q_proj", "o_proj", "down_proj"]).values():
        torch.nn.init.normal_(linear.lora.b, std=0.1)
    width, starts = 3, torch.tensor([4, 7, 9])
    with torch.no_grad():
        batched = drafting_logits(model, SEQ, base_cache(model, SEQ), starts, width, any_order)
        for g, n in enumerate(starts.tolist()):
            cached = n if any_order else n - 1
            cache = model.new_cache(cached + width + 1)
            lay = Layout(cached, torch.zeros(cached, dtype=torch.int64), torch.arange(cached))
            model(SEQ[:cached], torch.arange(cached), lay, cache, torch.tensor(0))     # the base model's prefix
            if any_order:      # R rows: each mask alone over the prefix
                tokens, lay = torch.full((width,), model.cfg.mask_token_id), layout("cpu", 0, range(1, width + 1),
                                                                                     [-1] * width)
            else:              # Packed-SS's proposal region / Linear-SS's draft call [x_(n-1), MASK^W]
                tokens = torch.cat([SEQ[n - 1:n], torch.full((width,), model.cfg.mask_token_id)])
                lay = layout("cpu", 0, [1] * (width + 1), [-1] * (width + 1))
            out = model(tokens, cached + torch.arange(len(tokens)), lay, cache, torch.tensor(cached))
            torch.testing.assert_close(batched[g], out[-width:], rtol=1e-9, atol=1e-9)


def test_targets_and_leading():
    assert targets(SEQ, torch.tensor([12]), 3).tolist() == [[50, 7, -100]]
    assert leading(torch.tensor([[1, 2, 3], [1, 0, 3], [0, 2, 3]]), torch.tensor([[1, 2, 3]] * 3)).tolist() == [3, 1, 0]


def test_replay_of_perfect_and_useless_drafts():
    seq = torch.arange(40)
    width, first = 4, 10
    perfect = torch.stack([seq[n:n + width] for n in range(first, 40 - width + 1)])
    tokens, iterations = replay(perfect, seq, first, width, "fresh")
    assert tokens == iterations * (width + 1)               # every draft accepted, plus the bonus token
    tokens, iterations = replay(perfect, seq, first, width, "lagged")
    # W+1 first; then the call's proposal is all emitted: 1 token, then the W-1 proposals left plus a bonus
    assert tokens == (width + 1) + (iterations - 1) // 2 * (width + 1) + (iterations - 1) % 2
    # any-order: an iteration resolves its window of W positions only, so a full window brings no bonus
    tokens, iterations = replay(perfect, seq, first, width, "fresh", any_order=True)
    assert tokens == iterations * width
    for kind in ("lagged", "branch"):     # W, then 1 (nothing drafted past the window), then W - 1 + 1, ...
        tokens, iterations = replay(perfect, seq, first, width, kind, any_order=True)
        assert tokens == width + (iterations - 1) // 2 * (width + 1) + (iterations - 1) % 2
    useless = torch.full_like(perfect, -1)
    for kind in ("fresh", "lagged", "branch"):
        for any_order in (False, True):
            tokens, iterations = replay(useless, seq, first, width, kind, any_order)
            assert tokens == iterations


def test_branch_replay_drafts_from_before_the_correction():
    """Any-order Quadratic-SS: after accepting A tokens (A - 1 drafts and a correction), the selected branch's
    proposals for the rest of the window come from the prefix before the correction, at offsets 1..W - A."""
    seq = torch.arange(40)
    width, first = 3, 10
    drafts = torch.tensor([[10, 99, 99],          # from prefix 10: accept 10, then the correction 11 (A = 2)
                           [99, 12, 99],          # from prefix 11, before the correction: 12 at offset 1
                           [99, 99, 99]])         # from prefix 12: what "fresh" verifies
    # iteration 2 verifies [12] (the window's one position left): accepted, plus the window's last token
    assert replay(drafts, seq, first, width, "branch", any_order=True) == (4, 2)
    assert replay(drafts, seq, first, width, "lagged", any_order=True) == (3, 2)     # verifies [99] from prefix 10
    assert replay(drafts, seq, first, width, "fresh", any_order=True) == (3, 2)      # verifies [99, 99, 99]


def test_acceptance_skips_continuations_shorter_than_a_draft():
    """A continuation that stopped early (EOS) within W tokens of its prompt has no full draft to score."""
    model = packed_ss.load_model(checkpoint("llama-gqa"))
    measured = acceptance(model, [(10, SEQ[:12]), (4, SEQ)], 4, False, "acceptance")
    assert measured["drafts"] == len(SEQ) - 4 - 4 + 1       # prefixes 4..10 of the full sequence only
    assert len(measured["profile"]["lagged"]) == 4


def test_function_prompts_end_after_a_docstring():
    tok = packed_ss.load_tokenizer()
    docstring = '"""The area of a circle of radius r."""'
    texts = [f"x = 1\n\nclass A:\n    def area(self, r):\n        {docstring}\n        return 3.14 * r * r\n\n"
             "def no_doc(a):\n    return a\n",
             "def two(a, b):\n    '''Add a and b.'''\n    return a + b\n"]
    chosen = function_prompts(texts, tok, 5, 6, torch.Generator().manual_seed(0))
    assert len(chosen) == 2 and all(len(ids) == 6 for ids in chosen)      # not the function without a docstring
    assert sorted(tok.decode(ids) for ids in chosen) == [" a and b.'''\n", 'adius r."""\n']    # the bodies follow
    assert function_prompts(texts, tok, 1, 6, torch.Generator().manual_seed(0)) == chosen[:1]
    assert function_prompts(texts, tok, 5, 500, torch.Generator()) == []      # no function has 500 tokens before it


TRAINED = ["--steps", "3", "--sequences", "4", "--eval-sequences", "2", "--eval-functions", "1", "--prompt-tokens",
           "16", "--gen-tokens", "24", "--width", "4", "--batch", "2", "--queries", "8", "--rank", "4", "--targets",
           "q_proj,o_proj,down_proj", "--threads", "1", "--seed", "1"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("drafter") / "adapter"
    assert main(["train-drafter", "default", "--out", str(out), *TRAINED]) == 0
    return out


def test_train_drafter_writes_a_peft_adapter_that_loads(trained):
    config = json.loads((trained / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4
    assert sorted(config["target_modules"]) == ["down_proj", "o_proj", "q_proj"]
    report = json.loads((trained / "report.json").read_text())
    assert report["training"]["steps"] == 3 and len(report["after"]["slot_accuracy"]) == 4
    profile = json.loads((trained / "draft_profile.json").read_text())
    assert profile["width"] == 4 and len(profile["lagged"]) == len(profile["fresh"]) == 4
    model = packed_ss.load_model(packed_ss.default_model_path(), draft_adapter=trained)
    assert model.model.layers[0].self_attn.q_proj.lora is not None
    assert model.model.layers[0].self_attn.k_proj.lora is None
    assert model.draft_profile == profile


def test_trained_adapter_changes_drafts_never_output(trained):
    tok = packed_ss.load_tokenizer()
    prompt = tok.encode("def add(a, b):\n    return").ids
    base = packed_ss.load_model(draft_adapter=None)
    adapted = packed_ss.load_model(draft_adapter=trained)
    gen = torch.Generator().manual_seed(0)
    for linear in lora.modules(adapted, ["q_proj", "o_proj", "down_proj"]).values():   # make sure the drafts move
        linear.lora.b.add_(torch.randn(linear.lora.b.shape, generator=gen), alpha=0.1)
    moved = False
    for schedule in ("linear", "quadratic", "packed"):
        a = packed_ss.Engine(adapted, schedule, width=4, drafts="diffusion").generate(prompt, 32, eos_token_id=[])
        b = packed_ss.Engine(base, schedule, width=4, drafts="diffusion").generate(prompt, 32, eos_token_id=[])
        assert a.tokens == b.tokens
        moved |= a.n_accepted != b.n_accepted
    assert moved


def test_train_drafter_is_deterministic(trained, tmp_path):
    assert main(["train-drafter", "default", "--out", str(tmp_path / "again"), *TRAINED]) == 0
    assert (tmp_path / "again" / "adapter_model.safetensors").read_bytes() == \
        (trained / "adapter_model.safetensors").read_bytes()


def test_an_interrupted_run_resumes_to_the_same_adapter(trained, tmp_path, monkeypatch, capsys):
    """A run stopped after step 2 (checkpoint after step 1) and resumed ends where the uninterrupted run did:
    the same continuations (read back, not regenerated), adapter, optimizer and batches."""
    out = str(tmp_path / "stopped")
    whole = train.step_loss

    def stops_at_step_2(*args):
        loss, calls = whole(*args), []

        def step():
            calls.append(1)
            if len(calls) == 2:
                raise KeyboardInterrupt
            return loss()
        return step

    monkeypatch.setattr(train, "step_loss", stops_at_step_2)
    with pytest.raises(KeyboardInterrupt):
        main(["train-drafter", "default", "--out", out, *TRAINED, "--checkpoint-every", "1"])
    monkeypatch.setattr(train, "step_loss", whole)
    assert len(torch.load(tmp_path / "stopped" / resume.STATE_FILE)["history"]) == 1
    monkeypatch.setattr(train.data, "continuations", None)        # resuming must not generate them again
    assert main(["train-drafter", "default", "--out", out, *TRAINED, "--resume", "--eval-every", "2"]) == 0
    assert (tmp_path / "stopped" / "adapter_model.safetensors").read_bytes() == \
        (trained / "adapter_model.safetensors").read_bytes()
    report = json.loads((tmp_path / "stopped" / "report.json").read_text())
    assert [p["step"] for p in report["curve"]] == [0, 2, 3]
    assert report["curve"][-1]["tokens_per_call"]["lagged"] == report["after"]["profile"]["lagged"][3]
    assert report["training"]["loss_last"] == json.loads((trained / "report.json").read_text())["training"]["loss_last"]
    capsys.readouterr()
    assert main(["train-drafter", "default", "--out", out, *TRAINED[:-2], "--seed", "2", "--resume"]) == 2
    err = capsys.readouterr().err
    assert "--resume:" in err and "seed 1 there, 2 now" in err


def test_train_drafter_rejects_bad_arguments(tmp_path, capsys):
    assert main(["train-drafter", "default", "--out", str(tmp_path / "x"), "--targets", "lm_head"]) == 2
    assert "--targets must be" in capsys.readouterr().err


def test_profile_drafter_measures_what_train_drafter_wrote(trained, tmp_path):
    """profile-drafter with the trainer's options replays the same held-out continuations with the same drafts,
    so it writes the trainer's profile; by default it writes beside the adapter, where load_model reads it."""
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        (adapter / name).write_bytes((trained / name).read_bytes())
    argv = ["profile-drafter", "default", "--draft-adapter", str(adapter), "--sequences", "4", "--eval-sequences",
            "2", "--eval-functions", "1", "--prompt-tokens", "16", "--gen-tokens", "24", "--width", "4", "--threads", "1", "--seed", "1"]
    assert main(argv) == 0
    profile = json.loads((adapter / PROFILE_FILE).read_text())
    assert profile == json.loads((trained / PROFILE_FILE).read_text())
    assert packed_ss.load_model(draft_adapter=adapter).draft_profile == profile
    # another held-out set (the trainer's default 400 training prompts drawn first): another profile
    assert main(argv[:4] + argv[6:] + ["--out", str(tmp_path / "other")]) == 0
    assert json.loads((tmp_path / "other" / PROFILE_FILE).read_text()) != profile


@pytest.mark.parametrize("option, value, message", [("--width", "0", "--width must be in [1, "),
                                                    ("--sequences", "-1", "--sequences must be an integer >= 0"),
                                                    ("--gen-tokens", "1", "--gen-tokens must be an integer >= 2")])
def test_profile_drafter_rejects_bad_arguments(tmp_path, capsys, option, value, message):
    assert main(["profile-drafter", "default", "--out", str(tmp_path), option, value]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / PROFILE_FILE).exists()
