"""Same model files, arguments and seed: the same tokens in every process, whatever the load (width="auto" is
measured once per machine and install and remembered, packed_ss/width.py)."""
import json
import os
import subprocess
import sys

import torch
from tiny_models import checkpoint

import packed_ss
from packed_ss.width import CHOICES_FILE, cache_dir, model_fingerprint

DECODE = """
import json, sys, packed_ss
model = packed_ss.load_model()
tok = packed_ss.load_tokenizer()
engine = packed_ss.Engine(model, schedule="packed")
res = engine.generate(tok.encode("def fibonacci(n):").ids, 48, temperature=1.0, seed=0)
print(json.dumps({"width": engine.width, "source": engine.width_source, "tokens": res.tokens}))
"""


def test_fresh_processes_agree_under_load(tmp_path):
    """Three fresh processes started together, one beside a CPU burner, share one choices file: one measures
    (the others wait on its lock), and all three decode the same sampled tokens."""
    env = {**os.environ, "PACKED_SS_CACHE_DIR": str(tmp_path / "cache")}
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        procs = [subprocess.Popen([sys.executable, "-c", DECODE], env=env, stdout=subprocess.PIPE, text=True)
                 for _ in range(3)]
        runs = [json.loads(p.communicate(timeout=300)[0].splitlines()[-1]) for p in procs]
    finally:
        burner.kill()
        burner.wait()
    assert all(p.returncode == 0 for p in procs)
    assert len({(r["width"], tuple(r["tokens"])) for r in runs}) == 1, runs
    assert sorted(r["source"].split()[0] for r in runs) == ["measured", "remembered", "remembered"]
    assert len(json.loads((tmp_path / "cache" / CHOICES_FILE).read_text())) == 1


def test_choice_is_remembered_per_model_and_setting(monkeypatch):
    measured = []
    measure = packed_ss.Engine._measure_width
    monkeypatch.setattr(packed_ss.Engine, "_measure_width",
                        lambda self, *a: measured.append(self.schedule_name) or measure(self, *a))
    model = packed_ss.load_model()
    first = packed_ss.Engine(model, schedule="packed")
    again = packed_ss.Engine(packed_ss.load_model(), schedule="packed")                  # another load of the same files
    assert (first.width_source, again.width_source.split()[0]) == ("measured now", "remembered")
    assert again.width == first.width and measured == ["packed"]
    packed_ss.Engine(model, schedule="linear")                        # another setting: measured
    assert measured == ["packed", "linear"]
    assert packed_ss.Engine(model, schedule="packed", width=3).width_source == "given"
    assert (cache_dir() / CHOICES_FILE).is_file()


def test_fingerprint_follows_the_weights():
    path = checkpoint("llama-gqa")
    a, b = packed_ss.load_model(path), packed_ss.load_model(path)
    assert model_fingerprint(a) == model_fingerprint(b)
    with torch.no_grad():
        next(b.parameters()).add_(1e-3)
    assert model_fingerprint(a) != model_fingerprint(b)
