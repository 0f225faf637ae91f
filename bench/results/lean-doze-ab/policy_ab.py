"""SmolLM2-135M-Instruct: the default engine under variants of its policy's constants (DOZE, MARGIN: module globals
read at each choice, so one engine serves every variant) against `lookup` W = 8, taking turns prompt by prompt in
one process (the policy's cost table is measured per process), with the calls each ran per shape (-1: the lean AR
step). Prompts: HumanEval 0..N-1 (128 new tokens, two rounds) or five chat turns, the Quickstart's first among them
(`--chat`: 64 new tokens, three rounds).

    cd /tmp && python policy_ab.py --limit 8 --no-eos --variants "DOZE=0" "DOZE=0 MARGIN=0.9"   # first table
    cd /tmp && python policy_ab.py --chat [--fp32] --variants "DOZE=0"                           # chat turns
    cd /tmp && python policy_ab.py --limit 8 --fp32 --variants "DOZE=0"                          # HumanEval, EOS
"""
import argparse
import collections
import time

import torch

import packed_ss
import packed_ss.decode.policy as policy
from packed_ss.cli import resolve_model, user_turn
from packed_ss.lab.humaneval import humaneval_prompts
from packed_ss.runtime.batch import Batch

CHAT = ["Write a Python function that checks whether a number is prime.", "Explain what a hash map is.",
        "Write a function that reverses a linked list in Python.",
        "What is the capital of France? Answer in one sentence.",
        "Write a bash script that counts the lines of every .py file in a directory."]
SHIPPED = dict(DOZE=policy.DOZE, MARGIN=policy.MARGIN)

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--limit", type=int, default=8)
p.add_argument("--chat", action="store_true")
p.add_argument("--fp32", action="store_true", help="float32 (the same texts across variants); default bfloat16")
p.add_argument("--no-eos", action="store_true", help="every reply runs to its token limit")
p.add_argument("--variants", nargs="+", default=["DOZE=0"], help='e.g. "DOZE=0 MARGIN=0.9"')
args = p.parse_args()
torch.set_num_threads(2)
model = packed_ss.load_model("smollm2-135m", dtype=torch.float32 if args.fp32 else torch.bfloat16)
tok = packed_ss.load_tokenizer("smollm2-135m")
if args.chat:
    turn = user_turn(resolve_model("smollm2-135m"))
    prompts, new_tokens, rounds = [tok.encode(turn(q)).ids for q in CHAT], 64, 3
else:
    prompts, new_tokens, rounds = [tok.encode(t).ids for _, t in humaneval_prompts(args.limit)], 128, 2
calls = []
iterate = Batch.iterate


def recorded(self, first, shape=0):
    calls.append(shape)
    return iterate(self, first, shape)


Batch.iterate = recorded
default, lookup = packed_ss.Engine(model), packed_ss.Engine(model, schedule="lookup")
variants = {"as shipped": (default, {})} | {
    v: (default, {k: float(x) if k == "MARGIN" else int(x) for k, x in (kv.split("=") for kv in v.split())})
    for v in args.variants} | {"lookup W=8": (lookup, {})}
for engine in (default, lookup):
    engine.generate(prompts[0], 4)
totals = {k: [0, 0.0, collections.Counter()] for k in variants}
for rnd in range(rounds):
    for i, prompt in enumerate(prompts):
        for k in list(variants) if (i + rnd) % 2 == 0 else list(reversed(variants)):
            engine, constants = variants[k]
            for name, value in (SHIPPED | constants).items():
                setattr(policy, name, value)
            calls.clear()
            t = time.perf_counter()
            out = engine.generate(prompt, new_tokens, eos_token_id=[] if args.no_eos else None).tokens
            totals[k][1] += time.perf_counter() - t
            totals[k][0] += len(out)
            totals[k][2].update(calls)
base = totals["as shipped"][0] / totals["as shipped"][1]
for k, (tokens, seconds, shapes) in totals.items():
    print(f"{k}: {tokens / seconds:.1f} tok/s, {tokens / seconds / base:.3f}x as shipped, "
          f"{tokens / sum(shapes.values()):.2f} tok/call, calls per shape {dict(sorted(shapes.items()))}")
