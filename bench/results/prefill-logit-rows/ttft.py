"""SmolLM2 bf16: time to the first token of 8 HumanEval prompts admitted together (one prefill call), AR and the
default engine, a fresh engine each round (no cached prefixes), 5 rounds; median seconds."""
import statistics, sys, time, torch, packed_ss
from packed_ss.lab.humaneval import humaneval_prompts
torch.set_num_threads(2)
model = packed_ss.load_model("smollm2-135m", dtype=torch.bfloat16); tok = packed_ss.load_tokenizer("smollm2-135m")
prompts = [tok.encode(p).ids for _, p in humaneval_prompts(40)][8:16]
print("prompt tokens", sum(map(len, prompts)), "longest", max(map(len, prompts)))
for kind, kw in (("ar", dict(schedule="ar")), ("default", {})):
    times = []
    for r in range(5):
        e = packed_ss.Engine(model, **kw)
        t = time.perf_counter(); e.generate_batch(prompts, 1, eos_token_id=[]); times.append(time.perf_counter() - t)
    print(kind, "median s", round(statistics.median(times), 3), [round(x, 3) for x in times])
