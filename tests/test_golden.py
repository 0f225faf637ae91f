"""Outputs recorded before the decode-core refactor (tests/golden/outputs.json) are reproduced exactly:
tokens, NFE, verification calls and accepted drafts, for every case of tests/golden/cases.py."""
import json

import pytest
from golden.cases import OUTPUTS, case_id, run

RECORDED = json.loads(OUTPUTS.read_text())


@pytest.mark.parametrize("entry", RECORDED, ids=[case_id(e["case"]) for e in RECORDED])
def test_golden_outputs_unchanged(entry):
    assert run(entry["case"]) == entry["outputs"]
