"""bench-scale at a scaled-down NLD-8B on the CPU: the named configs, the scaling, the option checks, and one
run end to end whose report is checked for its fields and its internal consistency (the fit is the
least-squares line of the points, the bytes and shares follow from the sizes, the auto width is the best shown,
the JSON, markdown and plots exist and agree). No timing is held to a threshold."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from packed_ss.decode.schedules.base import layout
from packed_ss.lab.bench.scale import command
from packed_ss.lab.bench.scale.configs import CONFIGS, resolve_config, scaled
from packed_ss.lab.bench.scale.iterations import plan
from packed_ss.model.config import model_config
from packed_ss.model.loading import default_model_path, random_model

FIXTURES = Path(__file__).parent / "fixtures" / "released"
RUN = ["--config", "nld-8b", "--scale", "0.05", "--batch-sizes", "1", "2", "--cache-lens", "32", "160",
       "--widths", "3", "7", "--rows", "1", "4", "16", "--reps", "3", "--new-tokens", "6", "--prompt-len", "8"]


@pytest.mark.parametrize("name, directory", [("nld-3b", "nemotron-labs-diffusion-3B"),
                                             ("nld-8b", "nemotron-labs-diffusion-8B")])
def test_named_configs_are_the_released_ones(name, directory):
    released = json.loads((FIXTURES / directory / "config.json").read_text())
    assert model_config(CONFIGS[name], name) == model_config(released, directory)


def test_scaled_keeps_head_dim_and_gqa():
    raw = scaled(CONFIGS["nld-8b"], 0.05)
    assert raw["head_dim"] == 128 and raw["num_attention_heads"] == 4 * raw["num_key_value_heads"] >= 4
    assert all(raw[k] % 64 == 0 for k in ("hidden_size", "intermediate_size", "vocab_size"))
    assert raw["vocab_size"] > max(raw["mask_token_id"], raw["eos_token_id"]) and raw["num_hidden_layers"] == 2
    assert scaled(CONFIGS["nld-14b"], 1.0) == CONFIGS["nld-14b"]
    for bad in (0.0, -0.5, 1.5):
        with pytest.raises(ValueError, match="--scale"):
            scaled(CONFIGS["nld-8b"], bad)


def test_config_path_and_random_model(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(scaled(CONFIGS["nld-3b"], 0.03)))
    name, raw = resolve_config(str(tmp_path))
    assert name == str(tmp_path / "config.json")
    model = random_model(model_config(raw, name), dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16} and model.inv_freq.dtype == torch.float32
    logits = model(torch.tensor([1, 2, 3]), torch.arange(3), layout(model.device, 3), model.new_cache(8),
                   torch.tensor(0))
    assert torch.isfinite(logits).all() and logits.abs().max() < 100
    with pytest.raises(ValueError, match="--config"):
        resolve_config("nld-80b")


@pytest.mark.parametrize("option, value", [("--scale", "0"), ("--widths", "65"), ("--batch-sizes", "0"),
                                           ("--cache-lens", "0"), ("--device", "tpu")])
def test_bad_options_name_themselves(option, value, tmp_path):
    with pytest.raises(ValueError, match=option):
        command.parse([*RUN, "--out", str(tmp_path), option, value])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where CUDA is absent")
def test_cuda_without_cuda_is_refused(tmp_path):
    with pytest.raises(ValueError, match="--device cuda"):
        command.parse([*RUN, "--out", str(tmp_path), "--device", "cuda"])
    assert command.main([*RUN, "--out", str(tmp_path), "--device", "cuda"]) == 2


def test_help_explains_each_option():
    out = subprocess.run([sys.executable, "-m", "packed_ss", "bench-scale", "--help"], capture_output=True,
                         text=True, timeout=60).stdout
    for option in ("--config", "--scale", "--device", "--dtype", "--batch-sizes", "--cache-lens", "--widths",
                   "--profile", "--quick", "--out", "--kernel-modes"):
        assert option in out


def _lstsq(points):
    rows = np.array([p["rows"] for p in points], float)
    ms = np.array([p["median_ms"] for p in points])
    (tau, delta), *_ = np.linalg.lstsq(np.stack([np.ones_like(rows), rows], 1), ms, rcond=None)
    return tau, delta, ms - (tau + delta * rows)


def test_cpu_run_report(tmp_path):
    profile = default_model_path() / "draft_profile.json"
    out = tmp_path / "scale"
    assert command.main([*RUN, "--out", str(out), "--profile", str(profile)]) == 0
    assert {p.name for p in out.iterdir()} == {"scale.json", "scale.md", "latency.png", "projection.png"}
    result, md = json.loads((out / "scale.json").read_text()), (out / "scale.md").read_text()
    meta, copy = result["meta"], result["copy_bandwidth"]
    assert meta["dims"]["head_dim"] == 128 and meta["dtype"] == "float32" and copy["gb_per_s"] > 0
    assert f"{copy['gb_per_s']:.1f} GB/s" in md and meta["command"].startswith("python -m packed_ss bench-scale")

    # 1. the fit is the least-squares line of the medians, and reproduces them within its own residuals
    assert [(f["cache_len"], f["batch"]) for f in result["latency"]] == [(32, 1), (32, 2), (160, 1), (160, 2)]
    for fit in result["latency"]:
        tau, delta, resid = _lstsq(fit["points"])
        assert np.isclose(fit["tau_ms"], tau, rtol=1e-6, atol=1e-9) and np.isclose(fit["delta_ms"], delta, atol=1e-9)
        assert np.isclose(fit["rms_residual_ms"], np.sqrt(np.mean(resid ** 2)), atol=1e-9)
        assert abs(resid.sum()) < 1e-6 * len(resid) and abs((resid * [p["rows"] for p in fit["points"]]).sum()) < 1e-4
        kinds = {p["kind"] for p in fit["points"]}
        assert {"ar", "linear-draft", "linear-verify", "packed", "packed-shape"} <= kinds
        assert max(p["rows"] for p in fit["points"]) == 16           # --rows' largest caps the calls
        for p in fit["points"]:
            assert p["fit_ms"] == pytest.approx(fit["tau_ms"] + fit["delta_ms"] * p["rows"])
            assert p["bytes"] == fit["weight_bytes"] + fit["kv_bytes"]
            assert p["copy_share"] == pytest.approx(p["bytes"] / p["median_ms"] / 1e6 / copy["gb_per_s"])
            assert f"| {p['kind']} | {p['rows']} | {p['median_ms']:.4f} | {p['fit_ms']:.4f} |" in md
        assert f"tau {fit['tau_ms']:.4f} ms" in md
    assert result["latency"][0]["kv_bytes"] * 2 == result["latency"][1]["kv_bytes"]
    assert {a["batch"] for a in result["attention_bandwidth"]} == {1, 2}

    # 2. an iteration of every planned schedule at each batch, model + the rest = the iteration
    runs = result["iterations"]
    assert [(r["batch"], r["schedule"], r["width"] or 1) for r in runs] == \
        [(b, s, w) for b in (1, 2) for s, w in plan([3, 7])]
    for r in runs:
        assert r["model_ms"] + r["nonmodel_ms"] == pytest.approx(r["ms_per_iteration"])
        assert r["mode"] == "eager" and r["model_time"] == "runtime clock" and r["iterations"] >= 1
        assert r["peak_allocated_bytes"] is None and r["graph_pool_bytes"] is None      # device-only

    # 3. projections from every source, the auto width the best of those shown, a projection by its label
    proj = result["projection"]
    assert "PROJECTION" in proj["label"] and "PROJECTION" in md
    assert set(proj["sources"]) == {"paper", "nld-linear-spec", "sglang-linearspec", "user"}
    groups = {}
    for r in proj["rows"]:
        groups.setdefault((r["source"], r["schedule"], r["cache_len"], r["batch"]), []).append(r)
        assert r["tokens_per_s"] == pytest.approx(1e3 * r["batch"] * r["tokens_per_iteration"] / r["iteration_ms"])
    assert {k[1] for k in groups if k[0] == "paper"} == {"ar", "linear", "quadratic", "packed"}
    assert {k[1] for k in groups if k[0] == "sglang-linearspec"} == {"ar", "linear", "quadratic"}
    for (source, schedule, *_), rows in groups.items():
        if schedule != "ar":
            auto = [r for r in rows if r["auto"]]
            assert len(auto) == 1 and auto[0]["tokens_per_s"] == max(r["tokens_per_s"] for r in rows)
            assert all(r["width"] <= (16 if source == "user" else 31) for r in rows)

    # 4. memory from tensor sizes; device-only figures null
    mem, dims = result["memory"], meta["dims"]
    assert mem["kv_bytes_per_token"] == 2 * dims["num_hidden_layers"] * dims["num_key_value_heads"] * 128 * 4
    assert mem["stored_draft_bytes"] >= 7 * dims["vocab_size"] * 4 and "null on the CPU" in mem["note"]
    assert all(m["peak_per_request"] is None for m in mem["measured"])

    # 5. kernels: eager counted, the others null with a reason
    kernels = {k["mode"]: k for k in result["kernels"]}
    assert kernels["eager"]["per_call"] > 0 and kernels["eager"]["reason"] is None
    assert all(kernels[m]["per_call"] is None and kernels[m]["reason"] for m in ("graph", "compile", "graph+compile"))

    t = result["targets"]
    assert t["applies"] is False and "is NOT that run" in md
    assert [c["cache_len"] for c in t["calls"]] == [32, 160] and t["calls"][0]["packed_rows"] == 16
