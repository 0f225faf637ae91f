"""Outputs recorded before the decode-core refactor (tests/golden/outputs.json, with the torch epilogue) are
reproduced exactly: tokens, NFE, verification calls and accepted drafts, for every case of
tests/golden/cases.py, with the torch and with the compiled epilogue.

Re-recorded once, for batched decoding (issue 14): one request's attention became a batch of one, and the
CPU's SDPA rounds 4-D inputs differently from 3-D ones (max difference 3.9e-7 on a [4, 9, 64] case); one
sampled case (linear, W = 3, T = 1, seed 7) moved by one token at an inverse-CDF boundary, the other 80
stayed identical."""
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
