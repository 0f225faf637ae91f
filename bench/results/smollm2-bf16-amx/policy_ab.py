"""Whether the policy's constants make the default trail the fixed `lookup` on SmolLM2 in bf16: the default engine
with DOZE and MARGIN as shipped (2, 1.1), with DOZE = 0 (no quiet calls while a draft could pay), and with DOZE = 0
and MARGIN = 1.0, taking turns prompt by prompt (the order alternating), over N HumanEval prompts twice, 128 new
tokens, no stop token. The constants are module globals read at each choice, so one engine serves every variant.

    cd /tmp && python policy_ab.py smollm2 TEMPERATURE N      # here: smollm2 0 6
"""
import sys
import time

import torch

import packed_ss
import packed_ss.decode.policy as policy
from packed_ss.lab.humaneval import humaneval_prompts

torch.set_num_threads(2)
name, temperature, n = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
path = packed_ss.default_model_path() if name == "tiny" else name
model = packed_ss.load_model(path, dtype=torch.float32 if name == "tiny" else torch.bfloat16)
tok = packed_ss.load_tokenizer(path)
prompts = [tok.encode(p).ids for _, p in humaneval_prompts(n)]
engine = packed_ss.Engine(model)
variants = {"as shipped": dict(DOZE=2, MARGIN=1.1), "DOZE 0": dict(DOZE=0, MARGIN=1.1),
            "DOZE 0, MARGIN 1.0": dict(DOZE=0, MARGIN=1.0)}
engine.generate(prompts[0], 8, seed=1, temperature=temperature)
totals = {k: [0, 0.0] for k in variants}
for rnd in range(2):
    for i, p in enumerate(prompts):
        for k in list(variants) if (i + rnd) % 2 == 0 else list(reversed(variants)):
            for constant, value in variants[k].items():
                setattr(policy, constant, value)
            t = time.perf_counter()
            tokens = engine.generate(p, 128, seed=i, temperature=temperature, eos_token_id=[]).tokens
            totals[k][0] += len(tokens)
            totals[k][1] += time.perf_counter() - t
base = totals["as shipped"][0] / totals["as shipped"][1]
for k, (tokens, seconds) in totals.items():
    print(f"{k}: {tokens / seconds:.1f} tok/s, {tokens / seconds / base:.3f}x as shipped")
