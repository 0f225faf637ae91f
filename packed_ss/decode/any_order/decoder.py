"""The Engine's any-order entry point until it hands any-order programs to its runtime itself (then this
module goes): a schedule of packed_ss.decode.any_order.schedules is a runtime program like any other,
decoded by `Runtime.decode`."""
from __future__ import annotations

from dataclasses import dataclass

from ...runtime import GenerateResult, Request, Runtime
from ..sampling import SamplingParams
from .schedules import SCHEDULES, AnyOrderSchedule


@dataclass
class Decoded:
    """What Engine._stream_any_order reads."""
    result: GenerateResult

    @property
    def nfe(self) -> int:
        return self.result.nfe

    @property
    def trace(self):
        return self.result.iterations

    def output(self) -> list[int]:
        return self.result.tokens


class AnyOrderDecoder:
    def __init__(self, model, schedule: str, width: int, order: str, attend, cache_for=None):
        """`cache_for(capacity)` returns a KV cache view (the Engine shares its own)."""
        self.model, self.schedule_name, self.width, self.order = model, schedule, width, order
        self.runtime = Runtime(model, attend)
        if cache_for is not None:
            self.runtime.cache_for = cache_for
        self.programs: dict[SamplingParams, AnyOrderSchedule] = {}
        self.model_s = 0.0

    def generate(self, prompt: list[int], max_new_tokens: int, params: SamplingParams, seed: int,
                 stop_sequences: list[tuple[int, ...]]) -> Decoded:
        if params not in self.programs:
            self.programs[params] = SCHEDULES[self.schedule_name](self.model, self.width, params, self.order)
        decoding = self.runtime.decode(self.programs[params], Request(prompt, max_new_tokens, seed, [], stop_sequences))
        while True:
            try:
                next(decoding)
            except StopIteration as end:
                result = end.value
                break
        self.model_s = result.model_s
        return Decoded(result)
