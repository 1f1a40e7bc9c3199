"""ONNX backend node tests (tools/conformance.py) for every ONNX op of minirt, both storages.

Every case must pass or be refused with a MinirtError (a crash or a wrong answer fails), and every
float32 case that docs/conformance.json does not list as refused must pass: a regression from
passed to refused fails too (rerun `python tools/conformance.py` when a limit changes on purpose)."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "tools"))   # last, so nothing in tools/ can shadow an installed module
import conformance  # noqa: E402

from minirt import ops  # noqa: E402

ONNX_OPS = sorted(n for n, o in ops.OPS.items() if o.domain in ("", "ai.onnx"))


@pytest.fixture(scope="module")
def cases():
    by_op = {}
    for op, case in conformance.select():      # builds every node test in memory (~7 s)
        by_op.setdefault(op, []).append(case)
    return by_op


@pytest.fixture(scope="module")
def documented_refusals():
    path = ROOT / "docs" / "conformance.json"
    doc = json.loads(path.read_text()) if path.exists() else {"failures": []}
    return {f["case"] for f in doc["failures"] if f.get("status", "refused") == "refused"}


@pytest.mark.parametrize("op", ONNX_OPS)
def test_onnx_node_tests(op, cases, documented_refusals, monkeypatch):
    monkeypatch.setenv("MINIRT_TIMEOUT_S", "60")
    problems = []
    for case in cases.get(op, []):
        status, why, f32 = conformance.run_case(case, op)
        if status == "failed":
            problems.append(f"{case.name}: {why}")
        elif f32 and status == "refused" and case.name not in documented_refusals:
            problems.append(f"{case.name}: refused, but docs/conformance.json has it passing: {why}")
    assert not problems, f"{op}: " + "\n".join(problems)
