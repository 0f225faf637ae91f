"""What a caller may ask for: the engine's checks of request arguments, each failure a ValueError naming the
argument and the allowed range (before anything runs)."""
from __future__ import annotations

import math
import os

import torch

from .decode.sampling import SamplingParams
from .decode.schedules import DRAFT_SOURCES
from .runtime import Request
from .runtime.program import Program


def check_int(name, value, low, high=None):
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bound = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be an integer {bound}, got {value!r}")


def per_request(name: str, value, n: int) -> list:
    """One value per request: a list of n, or one value for all."""
    if not isinstance(value, (list, tuple)):
        return [value] * n
    if len(value) != n:
        raise ValueError(f"{name} must be one value or a list of one per prompt ({n}), got a list of {len(value)}")
    return list(value)


def token_ids(name: str, ids, vocab: int) -> list[int]:
    if any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab for t in ids):
        raise ValueError(f"{name} must be token ids in [0, {vocab})")
    return list(ids)


def check_drafts(model, schedule: type[Program], drafts: str | None) -> str | None:
    """The draft source of `schedule` (a class of the registry) on `model`: `drafts`, or by default the first of
    the schedule's `draft_sources` the model can run; None for a schedule that does not draft and the any-order
    decoders (which draft by diffusion). A ValueError for a source the schedule does not take, or one that
    drafts by diffusion (a schedule that `proposes` always does) on a model with no drafting mode (no
    mask_token_id)."""
    if drafts is not None and drafts not in DRAFT_SOURCES:
        raise ValueError(f"drafts must be one of {DRAFT_SOURCES} or None, got {drafts!r}")
    takes = schedule.draft_sources
    if not takes or model.cfg.any_order:
        if drafts not in (None, "diffusion"):
            what = (f"schedule {schedule.name!r} does not draft" if not takes else
                    "an any-order model drafts by diffusion only")
            raise ValueError(f"drafts={drafts!r}: {what}")
        return None
    if drafts is not None and drafts not in takes:
        raise ValueError(f"drafts={drafts!r}: schedule {schedule.name!r} takes drafts from {takes}")
    if model.cfg.mask_token_id is not None:
        return drafts or takes[0]
    if not schedule.proposes and drafts in (None, "lookup") and "lookup" in takes:
        return "lookup"     # a causal model: lookup drafts alone
    raise ValueError(f"schedule {schedule.name!r} with drafts={drafts or takes[0]!r} feeds the model mask rows, and "
                     "this model has no drafting mode (no mask_token_id in its config.json): use schedule='lookup' "
                     "(n-gram drafts) or 'ar'")


def check_request(engine, prompt_ids, max_new_tokens, temperature, top_k, top_p, seed, eos_token_id,
                  stop_token_ids, stop_sequences) -> tuple[Request, SamplingParams]:
    """One request as `engine` (its model, max_seq_len, schedule and order) may decode it, with its sampling."""
    vocab = engine.model.cfg.vocab_size
    prompt = [int(t) for t in prompt_ids.tolist()] if torch.is_tensor(prompt_ids) else list(prompt_ids)
    if len(prompt) == 0:
        raise ValueError("prompt_ids must contain at least one token")
    token_ids("prompt_ids", prompt, vocab)
    check_int("max_new_tokens", max_new_tokens, 1)
    if len(prompt) + max_new_tokens > engine.max_seq_len:
        raise ValueError(f"prompt length {len(prompt)} + max_new_tokens {max_new_tokens} exceeds the "
                         f"engine's max_seq_len {engine.max_seq_len}")
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if top_k is not None:
        check_int("top_k", top_k, 1)
    if top_p is not None and not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
    if seed is not None:
        check_int("seed", seed, 0, 2**63 - 1)
    if eos_token_id is None:
        eos = list(engine.model.cfg.eos_token_ids)
    else:
        eos = list(eos_token_id) if isinstance(eos_token_id, (list, tuple)) else [eos_token_id]
    for t in set(eos) | set(stop_token_ids or []):
        check_int("stop token id", t, 0, vocab - 1)
    sequences = []
    for seq in stop_sequences or []:
        if not isinstance(seq, (list, tuple)) or not seq:
            raise ValueError(f"stop_sequences must be non-empty lists of token ids in [0, {vocab}), got {seq!r}")
        sequences.append(tuple(token_ids("stop_sequences", seq, vocab)))
    params = SamplingParams(float(temperature), top_k, None if top_p == 1 else top_p)
    if not params.greedy and engine.any_order and (engine.schedule_name == "threshold" or engine.order != "ltr"):
        raise ValueError(
            f"temperature must be 0 for schedule {engine.schedule_name!r} with order {engine.order!r}: the native "
            "decoder is an argmax decoder, and a confidence order ranks positions by the sampled drafts' own "
            "probabilities, so a checked draft no longer follows its stored Q and rejection sampling would "
            "not be exact; sample with order='ltr' (or schedule='ar')")
    if seed is None:
        seed = int.from_bytes(os.urandom(7), "little")
    stop_ids = sorted(set(eos) | set(stop_token_ids or []))
    return Request(prompt, max_new_tokens, seed, stop_ids, sequences, params), params


def check_requests(engine, prompts, max_new_tokens, temperature, top_k, top_p, seed, eos_token_id, stop_token_ids,
                   stop_sequences) -> tuple[list[Request], SamplingParams]:
    """A batch's validated requests (per-request caps, seeds and sampling settings; an error names the request's
    index), and the settings that pick its program: a sampled request's if any samples (the sampled program
    decodes a temperature-0 row exactly as the greedy one), else greedy."""
    prompts = list(prompts)
    if not prompts:
        raise ValueError("prompts must contain at least one prompt")
    n = len(prompts)
    caps = per_request("max_new_tokens", max_new_tokens, n)
    if seed is None or isinstance(seed, (list, tuple)):
        seeds = per_request("seed", seed, n)
    else:
        check_int("seed", seed, 0, 2**63 - n)
        seeds = [seed + i for i in range(n)]
    settings = zip(per_request("temperature", temperature, n), per_request("top_k", top_k, n),
                   per_request("top_p", top_p, n))
    requests = []
    for i, (prompt, cap, s, (t, k, p)) in enumerate(zip(prompts, caps, seeds, settings)):
        try:
            request, _ = check_request(engine, prompt, cap, t, k, p, s, eos_token_id, stop_token_ids, stop_sequences)
        except ValueError as err:
            raise ValueError(f"request {i}: {err}") from None
        requests.append(request)
    return requests, next((r.params for r in requests if not r.params.greedy), requests[0].params)
