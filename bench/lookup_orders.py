"""How far lookup drafts are right, by the order of the n-gram match they follow, on a model's own greedy text.

    python bench/lookup_orders.py [--model smollm2-135m] [--dtype bfloat16] [--limit 32] [--max-new-tokens 128]

Each prompt's greedy continuation (`schedule="ar"`, batches of 8) is replayed: at every output position the
lookup drafter (decode/lookup.py) drafts `--width` tokens from the prefix, and its leading matches against the
continuation are counted by the order of the match the draft follows (4, 3, 2 or 1 tokens; 0: no match). Prints
a markdown table: positions, P(first k tokens right) for each k, and the mean leading match. Every position
counts once, so repetitive stretches weigh more than in decoding, which crosses them in few calls.
"""
import argparse

import torch

import packed_ss
from packed_ss.decode.lookup import CONTEXT, NGRAMS, continuation
from packed_ss.lab.humaneval import tokenized_prompts


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="a model name, directory or GGUF file")
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float64"])
    ap.add_argument("--limit", type=int, default=32, help="first N HumanEval prompts")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--width", type=int, default=8, help="draft tokens")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = packed_ss.load_model(args.model, dtype=getattr(torch, args.dtype))
    prompts = [ids for _, ids in tokenized_prompts(packed_ss.load_tokenizer(args.model), args.limit)]
    outputs = packed_ss.Engine(model, schedule="ar").generate_batch(prompts, args.max_new_tokens, batch_size=8)
    positions, right = torch.zeros(max(NGRAMS) + 1), torch.zeros(max(NGRAMS) + 1, args.width)
    for prompt, result in zip(prompts, outputs):
        seq = torch.tensor(prompt[-CONTEXT:] + result.tokens)
        starts = torch.arange(len(prompt[-CONTEXT:]) + 1, len(seq) - args.width)
        if not len(starts):
            continue
        drafts, order = continuation(seq[None].expand(len(starts), -1), starts, args.width)
        truth = seq[starts[:, None] + torch.arange(args.width)]
        leading = (drafts == truth).int().cumprod(1).sum(1)
        positions += torch.bincount(order, minlength=len(positions))
        right.index_add_(0, order, (torch.arange(args.width) < leading[:, None]).float())
    print(f"{args.model}, {args.dtype}: {args.limit} HumanEval prompts, {args.max_new_tokens} greedy tokens, "
          f"drafts of {args.width}\n")
    print("| match order | positions | " + " | ".join(f"P(h >= {k + 1})" for k in range(args.width))
          + " | mean h |")
    print("|---" * (args.width + 3) + "|")
    for n in range(len(positions) - 1, 0, -1):
        seen = max(positions[n].item(), 1.0)
        print(f"| {n} | {int(positions[n])} | "
              + " | ".join(f"{p:.2f}" for p in (right[n] / seen).tolist()) + f" | {right[n].sum() / seen:.2f} |")
    print(f"| none | {int(positions[0])} |" + " |" * (args.width + 1))


if __name__ == "__main__":
    main()
