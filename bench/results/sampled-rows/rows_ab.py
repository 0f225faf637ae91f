"""Paired A/B of truncated_probs before (sampling.py at the commit given) and now, inside whole engines: the shipped
model, 16 HumanEval prompts (8-23 of bench-adaptive's), 128 new tokens, 2 rounds, the two versions taking turns
unit by unit; the same seeds, so each engine writes the same tokens under either version (checked). Prints tok/s,
new / old per engine with a bootstrap 95% interval over the units.

    cd /tmp && python rows_ab.py BASE BATCH T [TOP_P]
"""
import importlib.util
import subprocess
import sys
import time

import torch

import packed_ss
import packed_ss.decode.epilogue.base as epilogue_base
from packed_ss.decode import sampling
from packed_ss.lab.bench.adaptive import tokenized_prompts

torch.set_num_threads(2)
base, B, T = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
top_p = float(sys.argv[4]) if len(sys.argv) > 4 else None
source = subprocess.run(["git", "-C", packed_ss.__path__[0], "show", f"{base}:packed_ss/decode/sampling.py"],
                        capture_output=True, text=True, check=True).stdout
spec = importlib.util.spec_from_loader("packed_ss.decode.sampling_old", loader=None)
old = importlib.util.module_from_spec(spec)
old.__package__ = "packed_ss.decode"
exec(compile(source, "sampling_old.py", "exec"), old.__dict__)
versions = {"old": old.truncated_probs, "new": sampling.truncated_probs}

model = packed_ss.load_model()
ids = [ids for _, ids in tokenized_prompts(packed_ss.load_tokenizer(), 24)][8:24]
engines = {"default": packed_ss.Engine(model), "ar": packed_ss.Engine(model, schedule="ar"),
           "packed W=3": packed_ss.Engine(model, schedule="packed", width=3, drafts="diffusion")}
for e in engines.values():
    e.generate_batch(ids[:B], 8, temperature=T, top_p=top_p, seed=0, batch_size=B)
seconds = {}      # (engine, version) -> [s per unit]
tokens = {}
for rnd in range(2):
    for i in range(0, len(ids), B):
        for version in (("old", "new") if (i // B + rnd) % 2 == 0 else ("new", "old")):
            epilogue_base.truncated_probs = versions[version]
            for name, e in engines.items():
                t = time.perf_counter()
                r = e.generate_batch(ids[i:i + B], 128, temperature=T, top_p=top_p, seed=rnd * 100 + i,
                                     eos_token_id=[], batch_size=B)
                seconds.setdefault((name, version), []).append(time.perf_counter() - t)
                tokens.setdefault((name, version), []).append([q.tokens for q in r])
epilogue_base.truncated_probs = sampling.truncated_probs
g = torch.Generator().manual_seed(0)
print(f"batch {B}, T = {T}, top-p {top_p}; old = {base}")
for name in engines:
    assert tokens[(name, "old")] == tokens[(name, "new")], f"{name}: the versions wrote different tokens"
    n = sum(len(t) for unit in tokens[(name, "new")] for t in unit)
    old_s, new_s = (torch.tensor(seconds[(name, v)], dtype=torch.float64) for v in ("old", "new"))
    picks = torch.randint(len(old_s), (20000, len(old_s)), generator=g)
    ratios = old_s[picks].sum(1) / new_s[picks].sum(1)
    low, high = ratios.quantile(torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    print(f"  {name:11s} old {n / old_s.sum():6.0f} tok/s  new {n / new_s.sum():6.0f} tok/s  "
          f"new / old {old_s.sum() / new_s.sum():.3f} [{low:.3f}, {high:.3f}]  (same tokens)")
