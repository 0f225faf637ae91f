"""Streaming load: loading a checkpoint on the CPU holds about the model, not the checkpoint and the model.

Measured in a fresh interpreter: its peak resident memory (VmHWM, reset through /proc/self/clear_refs after
the imports, torch's lazy ones included) must stay below that baseline plus 1.3x the loaded model's size
(~200 MB float32), whether the file is float32 (the model's own size) or bfloat16 (cast while loading).
Reading every tensor first (the old loader) or memory-mapping the file would count it twice.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from packed_ss.model.config import model_config
from packed_ss.model.dual_mode import DualModeModel

CONFIG = dict(model_type="llama", vocab_size=8192, hidden_size=1024, intermediate_size=2048, num_hidden_layers=4,
              num_attention_heads=8, num_key_value_heads=8, tie_word_embeddings=True, mask_token_id=1,
              eos_token_id=0, max_position_embeddings=512, torch_dtype="float32")
PROBE = """
import sys
import torch, packed_ss
def status(key):
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(key)) * 1024
with torch.device("meta"):     # torch imports ~900 modules (sympy, ...) on its first meta init: baseline
    torch.nn.Embedding(2, 2)
baseline = status("VmRSS:")
open("/proc/self/clear_refs", "w").write("5")      # reset the peak (VmHWM) to the current RSS
model = packed_ss.load_model(sys.argv[1])
print(baseline, status("VmHWM:"), sum(p.numel() * p.element_size() for p in model.parameters()))
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("file_dtype", [torch.float32, torch.bfloat16])
def test_peak_memory_of_a_cpu_load(tmp_path, file_dtype):
    with torch.device("meta"):
        shapes = {n: p.shape for n, p in DualModeModel(model_config(CONFIG, "memory test")).named_parameters()}
    g = torch.Generator().manual_seed(0)
    save_file({n: (torch.randn(s, generator=g) * 0.02).to(file_dtype) for n, s in shapes.items()},
              tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    out = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path)], capture_output=True, text=True, check=True)
    baseline, peak, model_bytes = map(int, out.stdout.split())
    assert model_bytes == sum(s.numel() for s in shapes.values()) * 4 and 180e6 < model_bytes < 230e6
    assert peak < baseline + 1.3 * model_bytes, (f"peak {peak / 1e6:.0f} MB, baseline {baseline / 1e6:.0f} MB, "
                                                 f"model {model_bytes / 1e6:.0f} MB")
    print(f"{file_dtype}: peak - baseline = {(peak - baseline) / model_bytes:.2f}x the model")
