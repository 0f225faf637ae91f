"""Which call shapes the default engine runs on SmolLM2-135M-Instruct in bf16 (6 HumanEval prompts, 128 new
tokens, batch 1), how many calls of each and their ms, and the costs per shape its policy bets with (ms at batch 1
and 8). Shape -1 is the lean AR step; the others index the printed list.

    cd /tmp && python shapes.py 0          # greedy
    cd /tmp && python shapes.py 0.7        # T = 0.7, top-p 0.95
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
model = packed_ss.load_model("smollm2-135m", dtype=torch.bfloat16)
tok = packed_ss.load_tokenizer("smollm2-135m")
prompts = [tok.encode(p).ids for _, p in humaneval_prompts(6)]
temperature = float(sys.argv[1])
top_p = 0.95 if temperature > 0 else None
record = []
iterate = Batch.iterate


def timed(self, first, shape=0):
    t = time.perf_counter()
    out = iterate(self, first, shape)
    record.append((shape, time.perf_counter() - t))
    return out


Batch.iterate = timed
engine = packed_ss.Engine(model)
engine.generate(prompts[0], 8, seed=1, temperature=temperature, top_p=top_p)
calls, seconds, tokens = collections.Counter(), collections.defaultdict(float), 0
for i, p in enumerate(prompts):
    record.clear()
    tokens += len(engine.generate(p, 128, seed=i, temperature=temperature, top_p=top_p).tokens)
    for shape, dt in record:
        calls[shape] += 1
        seconds[shape] += dt
print(f"width {engine.width}, sampler {engine.sampler}: {tokens} tokens in {sum(calls.values())} calls")
for shape in sorted(calls):
    print(f"  shape {shape}: {calls[shape]} calls, {1e3 * seconds[shape] / calls[shape]:.1f} ms")
program = engine.program(SamplingParams(temperature=temperature, top_p=top_p))
policy = getattr(program, "policy", None) or program.program.policy     # SharedNoise wraps the greedy program
print("  costs:", [(i, str(s), [round(c, 1) for c in policy.costs[i]]) for i, s in enumerate(policy.shapes)])
