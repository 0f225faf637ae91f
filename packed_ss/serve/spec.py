"""What a served engine is built from, and the same settings fixed for engines built elsewhere.

`EngineSpec.build()` loads the model and makes the Engine, as `python -m packed_ss serve` runs it. Some
settings are chosen when the engine is built: dtype "auto" (measured on a CPU), width "auto" (measured for a
fixed schedule), the sampler and the drafting adapter (named by the model). `resolved(engine)` is the spec
with those choices written in, so that every replica built from it (serve/ray/) decodes with the same dtype,
width, sampler and adapter, and returns the same text for the same seeded request. A pydantic model, so that
`serve run ... width=3` strings become the fields' types; the engine checks the values when it is built.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from ..engine import Engine
from ..model.loading import dtype_named, load_model
from ..model.sources import resolve_model


class EngineSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str | None = None                 # directory, GGUF file or name (model/sources.py); None: the tiny model
    device: str = "cpu"
    dtype: str = "auto"                      # a name in loading.DTYPE_NAMES
    schedule: str | None = None              # None: the engine's default
    width: int | Literal["auto"] = "auto"
    sampler: str | None = None               # None: the one the drafter's profile names, else the default
    draft_adapter: str | None = "auto"       # "auto": the model's own; None: none
    cuda_graph: bool = False
    prefix_cache: bool = True
    max_batch: int = 64                      # requests running at once; later ones wait in the engine's queue

    def build(self) -> Engine:
        model = load_model(resolve_model(self.model), device=self.device, dtype=dtype_named(self.dtype),
                           draft_adapter=self.draft_adapter)
        return Engine(model, schedule=self.schedule, width=self.width, sampler=self.sampler,
                      cuda_graph=self.cuda_graph, prefix_cache=self.prefix_cache, max_batch=self.max_batch)

    def resolved(self, engine: Engine):
        """This spec with what `engine`, built from it, chose."""
        adapter = engine.model.adapter_dir
        return self.model_copy(update=dict(
            model=str(resolve_model(self.model)), dtype=str(engine.model.dtype).removeprefix("torch."),
            schedule=engine.schedule_name, width=engine.width, sampler=engine.sampler,
            draft_adapter=None if adapter is None else str(adapter)))
