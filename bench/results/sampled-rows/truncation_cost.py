"""truncated_probs before (sampling.py at the commit given) and now, one call at a time on the same logits: us per
call (the median of 9 rounds of 200 calls, the versions taking turns), for 1 and 8 rows of 4,096 tokens (the shipped
model's vocabulary) at batch 1 and one row each at batch 8, on the logits of the shipped model's own calls (an AR
decode at T = 1 of a HumanEval prompt). Checks that both versions give the same bits.

    cd /tmp && python truncation_cost.py BASE
"""
import importlib.util
import statistics
import subprocess
import sys
import time

import torch

import packed_ss
from packed_ss.decode import sampling
from packed_ss.decode.epilogue.base import Epilogue
from packed_ss.lab.bench.adaptive import tokenized_prompts
from packed_ss.runtime.request import SamplingParams

torch.set_num_threads(2)
source = subprocess.run(["git", "-C", packed_ss.__path__[0], "show", f"{sys.argv[1]}:packed_ss/decode/sampling.py"],
                        capture_output=True, text=True, check=True).stdout
old = importlib.util.module_from_spec(importlib.util.spec_from_loader("packed_ss.decode.sampling_old", loader=None))
old.__package__ = "packed_ss.decode"
exec(compile(source, "sampling_old.py", "exec"), old.__dict__)
versions = {"old": old.truncated_probs, "new": sampling.truncated_probs}

model = packed_ss.load_model()
prompt = [ids for _, ids in tokenized_prompts(packed_ss.load_tokenizer(), 9)][8]
seen = []                       # the logits of an AR decode's calls, as the epilogue receives them
rows_of = Epilogue.rows
Epilogue.rows = lambda self, logits, sampling: seen.append(logits[:, 0].clone()) or rows_of(self, logits, sampling)
packed_ss.Engine(model, schedule="ar").generate(prompt, 64, temperature=1.0, seed=0, eos_token_id=[])
Epilogue.rows = rows_of
rows = torch.cat(seen)          # [64, 4096]
settings = {"T = 0.7 / top-p 0.95": SamplingParams(0.7, top_p=0.95), "T = 1": SamplingParams(1.0),
            "greedy rows": SamplingParams(0.0)}
shapes = {"batch 1, 1 row": (1, 1), "batch 1, 8 rows": (1, 8), "batch 8, 1 row each": (8, 1)}


def per_call(f, n=200):
    t = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t) / n * 1e6


for shape_name, (b, r) in shapes.items():
    logits = rows[-b * r:].reshape(b, r, -1).contiguous()
    for name, params in settings.items():
        st = params.rows(b)
        assert torch.equal(versions["old"](logits, st), versions["new"](logits, st)), (shape_name, name)
        times = {v: [] for v in versions}
        for k in range(9):
            for v in (("old", "new") if k % 2 else ("new", "old")):
                times[v].append(per_call(lambda: versions[v](logits, st)))
        o, n = statistics.median(times["old"]), statistics.median(times["new"])
        print(f"{shape_name:20s} {name:22s} old {o:6.0f} us  new {n:6.0f} us  ({o / n:.2f}x)  same bits")
