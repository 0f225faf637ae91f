"""Which call shapes the default engine runs on the shipped model (16 HumanEval prompts, 128 new tokens, batch 1),
how many calls of each, their ms and the model call's share of them, against `schedule="ar"` on the same requests
(the engines taking turns prompt by prompt, two rounds). Shape -1 is the lean AR step;
the others index the printed list of the policy's shapes.

    cd /tmp && python shapes.py 0.7        # T = 0.7, top-p 0.95
    cd /tmp && python shapes.py 1          # T = 1
    cd /tmp && python shapes.py 0.7 aa     # A/A: two engines of schedule="ar" (named "default" and "ar")
"""
import collections
import sys
import time

import torch

import packed_ss
from packed_ss.lab.humaneval import humaneval_prompts
from packed_ss.runtime.batch import Batch
from packed_ss.runtime.request import SamplingParams

torch.set_num_threads(2)
model = packed_ss.load_model()
tok = packed_ss.load_tokenizer()
prompts = [tok.encode(p).ids for _, p in humaneval_prompts(16)]
temperature = float(sys.argv[1])
top_p = 0.95 if temperature < 1 else None
record = []          # (shape, s in the iteration, s of it in the model call)
iterate = Batch.iterate


def timed(self, first, shape=0):
    t, model_s = time.perf_counter(), self.clock.model_s
    out = iterate(self, first, shape)
    record.append((shape, time.perf_counter() - t, self.clock.model_s - model_s))
    return out


Batch.iterate = timed
aa = sys.argv[2:] == ["aa"]
engines = {"default": packed_ss.Engine(model, schedule="ar" if aa else None), "ar": packed_ss.Engine(model, schedule="ar")}
for engine in engines.values():
    engine.generate(prompts[0], 8, seed=1, temperature=temperature, top_p=top_p)
calls = {n: collections.Counter() for n in engines}
seconds = {n: collections.defaultdict(float) for n in engines}
in_model = {n: collections.defaultdict(float) for n in engines}
wall = collections.defaultdict(float)
for rnd in range(2):
    for i, p in enumerate(prompts):
        for name in (engines if (i + rnd) % 2 else reversed(list(engines))):
            record.clear()
            t = time.perf_counter()
            engines[name].generate(p, 128, seed=i, temperature=temperature, top_p=top_p)
            wall[name] += time.perf_counter() - t
            for shape, dt, dm in record:
                calls[name][shape] += 1
                seconds[name][shape] += dt
                in_model[name][shape] += dm
for name in engines:
    total = sum(calls[name].values())
    print(f"{name}: {total} calls, {1e3 * wall[name] / total:.3f} ms a call wall, "
          f"{1e3 * sum(seconds[name].values()) / total:.3f} ms in iterate")
    for shape in sorted(calls[name]):
        n = calls[name][shape]
        print(f"  shape {shape}: {n} calls, {1e3 * seconds[name][shape] / n:.3f} ms, of which the model call "
              f"{1e3 * in_model[name][shape] / n:.3f} and the rest {1e3 * (seconds[name][shape] - in_model[name][shape]) / n:.3f}")
if not aa:
    program = engines["default"].program(SamplingParams(temperature=temperature, top_p=top_p))
    policy = getattr(program, "policy", None) or program.program.policy
    print("  costs:", [(i, str(s), [round(c, 2) for c in policy.costs[i]]) for i, s in enumerate(policy.shapes)])
