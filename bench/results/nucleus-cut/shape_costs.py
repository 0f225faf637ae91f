"""The shipped 4M model: what the default engine's cost probe (Runtime.shape_costs) measures for each of its
shapes, ms per iteration at batch 1 and 8, for requests at T = 1, at T = 1 / top-p 0.95 (the setting the engine
prices sampled requests at, engine.PRICED) and greedy.

    cd /tmp && python shape_costs.py
"""
import torch

import packed_ss
from packed_ss.runtime.request import SamplingParams

torch.set_num_threads(2)
engine = packed_ss.Engine(packed_ss.load_model())
for params in (SamplingParams(temperature=1.0), SamplingParams(temperature=1.0, top_p=0.95), SamplingParams()):
    program = engine.program(params)
    costs = engine.runtime.shape_costs(program, (1, 8), params)
    print(f"T = {params.temperature}, top-p {params.top_p}:",
          {str(s): tuple(round(x, 2) for x in c) for s, c in zip(program.policy.shapes, costs)})
