"""Outputs recorded before a refactor of the decode core (tests/golden/outputs.json, with the torch epilogue) are
reproduced exactly: tokens, NFE, verification calls and accepted drafts, for every case of
tests/golden/cases.py, with the torch and with the compiled epilogue.

Recorded with the models in float64, so that a CPU whose kernels round differently cannot flip a token: the
float32 recording (issue 14) failed on an AVX-512/AMX Xeon in one sampled case (linear, W = 3, T = 1, seed
7: the 8th token at an inverse-CDF near-tie), which `ATEN_CPU_CAPABILITY=avx2` reproduces on such a machine.
The float64 recording equals the float32 one in the other 80 cases, and passes on AVX-512 with AMX and under
ATEN_CPU_CAPABILITY=avx2 / default, MKL_ENABLE_INSTRUCTIONS=AVX2 and 1 or 2 threads."""
import json

import pytest
from golden.cases import OUTPUTS, case_id, run

from packed_ss.decode.epilogue import native_available

RECORDED = json.loads(OUTPUTS.read_text())
EPILOGUES = ["torch", pytest.param("native", marks=pytest.mark.skipif(not native_available("cpu"),
                                                                       reason="native epilogue not built"))]


@pytest.mark.parametrize("epilogue", EPILOGUES)
@pytest.mark.parametrize("entry", RECORDED, ids=[case_id(e["case"]) for e in RECORDED])
def test_golden_outputs_unchanged(entry, epilogue):
    assert run(entry["case"], epilogue) == entry["outputs"]


GREEDY_SPECULATIVE = [e for e in RECORDED if e["case"]["model"] == "default" and "temperature" not in e["case"]
                      and e["case"]["schedule"] != "ar"]


@pytest.mark.parametrize("entry", GREEDY_SPECULATIVE, ids=[case_id(e["case"]) for e in GREEDY_SPECULATIVE])
def test_golden_greedy_tokens_with_lookup_drafts(entry):
    """The recorded greedy tokens again with both drafters (other drafts, other call counts, the same tokens)."""
    got = run(dict(entry["case"], drafts="both"))
    assert [r["tokens"] for r in got] == [r["tokens"] for r in entry["outputs"]]
    assert sum(r["nfe"] for r in got) < sum(r["nfe"] for r in entry["outputs"])   # the lookup drafts were used
