"""The decoding methods the schedule benchmark times on the same weights: our schedules through the public
Engine API, and transformers' `generate` (greedy / sampling, or prompt-lookup decoding) as peers. Every
model call is timed by forward hooks."""
from __future__ import annotations

import time
from pathlib import Path

import torch

from ...decode.sampling import SamplingParams
from ...engine import Engine
from ...model.sources import is_gguf
from ...runtime.program import call_layouts


class CallTimer:
    """Times every forward of a module with hooks: the first call of a response is its prefill.

    The hooks cost a few microseconds per call (calls here take milliseconds); on CUDA they synchronise.
    """

    def __init__(self, module: torch.nn.Module, device: torch.device):
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self.calls: list[float] = []
        self._t0 = 0.0
        module.register_forward_pre_hook(self._pre)
        module.register_forward_hook(self._post)

    def _pre(self, *_):
        self.sync()
        self._t0 = time.perf_counter()

    def _post(self, *_):
        self.sync()
        self.calls.append(time.perf_counter() - self._t0)

    def take(self) -> list[float]:
        calls, self.calls = self.calls, []
        return calls


class Ours:
    """One of our schedules through the public Engine API, named after it, its drafts when they are not the
    default diffusion proposals ("packed+both", "linear+lookup") and its sampler when one is asked for rather than
    the engine's choice ("lookup~gumbel"). Such a method decodes greedy requests as the engine's choice does, so
    it runs at temperature > 0 only (`sampled_only`)."""

    def __init__(self, model, schedule: str, width: int | str, timer: CallTimer, drafts: str | None = None,
                 sampler: str | None = None):
        """`width` an integer or "auto" (the engine's choice, `self.engine.width`)."""
        self.width, self.timer = (None if schedule == "ar" else width), timer
        self.engine = Engine(model, schedule=schedule, width=width, drafts=drafts, sampler=sampler)
        self.name = (schedule if drafts in (None, "diffusion") else f"{schedule}+{drafts}") + (
            "" if sampler is None else f"~{sampler}")
        self.sampled_only = sampler is not None
        # one iteration's calls; the adaptive schedule's change from one iteration to the next
        self.layouts = None if schedule == "adaptive" else call_layouts(self.engine.program(SamplingParams()))

    def warm_up(self, prompt: list[int], max_new_tokens: int):
        self.engine.generate(prompt, min(8, max_new_tokens))
        self.timer.take()

    def run(self, prompt: list[int], max_new_tokens: int, temperature: float, seed: int, top_p: float | None = None):
        res = self.engine.generate(prompt, max_new_tokens, temperature=temperature, seed=seed,
                                   top_p=top_p if temperature > 0 else None)
        calls = self.timer.take()
        iterations = res.nfe - 1 if self.name.split("~")[0] in ("ar", "adaptive") else res.n_verify
        return res.tokens, dict(tokens=len(res.tokens), nfe=res.nfe, wall_s=res.wall_s, model_s=res.model_s,
                                prefill_s=calls[0], iterations=iterations, n_accepted=res.n_accepted)


class HF:
    """transformers' generate on the same weights: plain (greedy / sampling) or prompt lookup of W tokens."""

    sampled_only = False

    def __init__(self, hf_model, lookup: int | None, eos: list[int], timer: CallTimer):
        self.name, self.width = ("hf-lookup", lookup) if lookup else ("hf", None)
        self.model, self.lookup, self.eos, self.timer = hf_model, lookup, eos, timer

    def warm_up(self, prompt: list[int], max_new_tokens: int):
        self.run(prompt, min(8, max_new_tokens), 0.0, 0)

    def run(self, prompt: list[int], max_new_tokens: int, temperature: float, seed: int, top_p: float | None = None):
        from transformers import GenerationConfig

        # top_k=0: transformers would otherwise apply its global default top-k 50 when sampling
        sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=top_p or 1.0) if temperature > 0 else {}
        config = GenerationConfig(max_new_tokens=max_new_tokens, eos_token_id=self.eos, pad_token_id=self.eos[0],
                                  prompt_lookup_num_tokens=self.lookup, **sampling)
        device = self.model.device
        ids = torch.tensor([prompt], device=device)
        mask = torch.ones_like(ids)
        torch.manual_seed(seed)
        start = time.perf_counter()
        out = self.model.generate(ids, attention_mask=mask, generation_config=config)
        wall = time.perf_counter() - start
        tokens = out[0, len(prompt):].tolist()
        calls = self.timer.take()
        return tokens, dict(tokens=len(tokens), nfe=len(calls), wall_s=wall, model_s=sum(calls),
                            prefill_s=calls[0], iterations=len(calls) - 1,
                            n_accepted=len(tokens) - len(calls))


def load_hf(path: Path, dtype: torch.dtype, device: str):
    """The model directory or GGUF file as a transformers model for the peers (a GGUF file by transformers' own
    `gguf_file=` load), without the directory's sampling defaults."""
    from transformers import AutoModelForCausalLM, GenerationConfig
    from transformers.utils import logging

    logging.disable_progress_bar()      # keep stderr for our own progress bar
    where = dict(pretrained_model_name_or_path=path.parent, gguf_file=path.name) if is_gguf(path) else \
        dict(pretrained_model_name_or_path=path)
    try:
        model = AutoModelForCausalLM.from_pretrained(**where, dtype=dtype).to(device).eval()
    except (OSError, ValueError, KeyError) as err:
        raise ValueError(f"transformers cannot load {path} for the peers ({err}); pass --peers with no names "
                         f"to skip them") from err
    model.generation_config = GenerationConfig()    # no sampling defaults from the directory
    return model
