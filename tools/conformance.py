#!/usr/bin/env python3
"""ONNX conformance: runs the ONNX backend node tests that ship inside the onnx package
(onnx.backend.test.case.node.collect_testcases(), built in memory) for every ONNX op in minirt's
registry, and writes docs/conformance.json (docs/ops.md shows it: python tools/gen_ops_doc.py).

A case belongs to the op its name tests (test_softmax_axis_0_expanded, the case's function body
spelled out in primitive ops, belongs to Softmax too). Each case runs in each storage asked for and is:
  passed   every output matches in every storage (|minirt - expected| <= atol + rtol * |expected|,
           NaN where expected has NaN, the same infinities)
  failed   an output differs, or minirt raised anything but a MinirtError
  refused  minirt raised a clear MinirtError (unsupported op, dtype, rank, runtime shape input, ...)

How cases are fed: minirt takes float32 graph inputs only, and wants shapes, axes, indices and
weights to be constants (as exporters write them). So an input that is not float32 (int64 axes,
shapes, indices: an integer or bool input after the first) becomes an initializer, and so do the
inputs minirt documents as constants: Conv and ConvTranspose W and B, LayerNormalization and InstanceNormalization
scale and B, BatchNormalization scale, B, mean and var, Clip min and max, Pad constant_value, Resize roi and scales (CONST_INPUTS).
Every other input is fed at run time, whatever its dtype (minirt refuses what it cannot take). A case
is a "float32 case" when every output and every input other than integer structure is float32; only
those fill the passed/failed/refused columns of docs/ops.md. Other cases count under "other_dtypes".

  python tools/conformance.py                    # all ops, buffer and texture; writes docs/conformance.json
  python tools/conformance.py --ops Relu,Softmax --storage buffer --no-write -v
  python tools/conformance.py --ops Clip,Log --merge  # rerun these ops; the others' results kept from the JSON
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RTOL, ATOL = 1e-4, 1e-5
STORAGES = ("buffer", "texture")
# inputs (by index) that minirt needs as constants for a case to run at all: documented op limits
CONST_INPUTS = {"Conv": (1, 2), "ConvTranspose": (1, 2), "LayerNormalization": (1, 2), "Clip": (1, 2), "Pad": (2,),
                "InstanceNormalization": (1, 2), "Resize": (1, 2), "BatchNormalization": (1, 2, 3, 4)}
# ops whose optional extra outputs minirt does not produce (documented): their cases with those
# outputs are refused as they are, and run again as "<case>[first output]" with only the first output
FIRST_OUTPUT_VARIANT = {"LayerNormalization"}
_EXPANDED = re.compile(r"_expanded(_ver\d+)?$")
# cases whose expected outputs onnx writes rounded (to 4 decimals): (rtol, atol) to compare them with; onnxruntime's
# results differ from them as much as minirt's do
ROUNDED_EXPECTED = {"test_averagepool_2d_ceil_last_window_starts_on_pad": (RTOL, 1e-4)}


def collect():
    """Every ONNX node test case, quietly (building them warns about overflowing casts)."""
    from onnx.backend.test.case.node import collect_testcases
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return collect_testcases()


def op_of(case, by_name) -> str:
    """The op a case tests: its single node's op type, or for an expanded case its base case's."""
    base = _EXPANDED.sub("", case.name)
    if base != case.name and base in by_name:
        case = by_name[base]
    types = {n.op_type for n in case.model.graph.node}
    return types.pop() if len(types) == 1 else "+".join(sorted(types))


def onnx_ops() -> set:
    """minirt's ONNX-domain ops (not its internal ones such as Linear and Attention in domain 'minirt')."""
    from minirt import ops
    return {n for n, o in ops.OPS.items() if o.domain in ("", "ai.onnx")}


def select(ops=None, cases=None):
    """[(op, case)] for the cases of minirt's ONNX ops (or of `ops`), in a stable order."""
    cases = cases if cases is not None else collect()
    by_name = {c.name: c for c in cases}
    want = set(ops) if ops else onnx_ops()
    out = [(op_of(c, by_name), c) for c in cases if c.kind == "node"]
    out = [(o, c) for o, c in out if o in want]
    out += [(o, _FirstOutput(c)) for o, c in out if o in FIRST_OUTPUT_VARIANT and len(c.model.graph.node) == 1
            and len(c.model.graph.output) > 1]
    return sorted(out, key=lambda oc: (oc[0], oc[1].name))


class _FirstOutput:
    """A single-node case cut down to its first output (the node's other outputs removed)."""

    def __init__(self, case):
        import onnx
        self.name = case.name + "[first output]"
        self.kind = case.kind
        self.model = onnx.ModelProto()
        self.model.CopyFrom(case.model)
        g = self.model.graph
        del g.output[1:]
        del g.node[0].output[1:]
        self.data_sets = [(ins, outs[:1]) for ins, outs in case.data_sets]


def feeds_of(case, data_set, op):
    """(model with baked inputs, {runtime input name: array}, expected outputs, is_float32)."""
    import onnx
    from onnx import numpy_helper
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    g = model.graph
    ins, outs = data_set
    names = [vi.name for vi in g.input]
    keep_const = CONST_INPUTS.get(op, ())
    feeds, baked, f32 = {}, [], True
    for i, (name, x) in enumerate(zip(names, ins)):
        if isinstance(x, (list, dict)) or x is None:
            raise _Skip(f"input '{name}' is a sequence/map/optional, not a tensor")
        x = np.asarray(x)
        structure = i > 0 and (np.issubdtype(x.dtype, np.integer) or x.dtype == np.bool_)
        if not structure and x.dtype != np.float32:
            f32 = False
        if structure or i in keep_const:
            baked.append(numpy_helper.from_array(x, name))
        else:
            feeds[name] = x
    if baked:
        gone = {t.name for t in baked}
        kept = [vi for vi in g.input if vi.name not in gone]
        del g.input[:]
        g.input.extend(kept)
        g.initializer.extend(baked)
    expected = []
    for y in outs:
        if isinstance(y, (list, dict)) or y is None:
            raise _Skip("an output is a sequence/map/optional, not a tensor")
        y = np.asarray(y)
        if y.dtype != np.float32:
            f32 = False
        expected.append(y)
    return model, feeds, expected, f32


class _Skip(Exception):
    pass


def compare(got, want, rtol=RTOL, atol=ATOL):
    """None when they match, else what differs (shape, dtype, NaN/Inf positions, worst element)."""
    got = np.asarray(got)
    if got.shape != want.shape:
        return f"shape {list(got.shape)}, expected {list(want.shape)}"
    if want.dtype == np.bool_ or np.issubdtype(want.dtype, np.integer):
        if not np.array_equal(got.astype(want.dtype), want) or not np.array_equal(got, want.astype(got.dtype)):
            return f"values differ ({want.dtype} output; minirt gave {got.dtype})"
        return None
    g, w = got.astype(np.float64), want.astype(np.float64)
    if not np.array_equal(np.isnan(g), np.isnan(w)):
        n = int((np.isnan(g) != np.isnan(w)).sum())
        return f"NaN at {n} position(s) where expected is not NaN, or the reverse"
    inf_w, inf_g = np.isinf(w), np.isinf(g)
    if not np.array_equal(inf_g, inf_w) or not np.array_equal(g[inf_w], w[inf_w]):
        return "infinities differ from the expected ones"
    fin = np.isfinite(w)
    err = np.abs(g[fin] - w[fin])
    bad = err > atol + rtol * np.abs(w[fin])
    if bad.any():
        k = int(np.argmax(err - (atol + rtol * np.abs(w[fin]))))
        return (f"{int(bad.sum())}/{bad.size} elements beyond rtol {rtol}, atol {atol}: worst |diff| "
                f"{err[k]:.3g} at expected {w[fin][k]:.6g} (got {g[fin][k]:.6g})")
    return None


def run_case(case, op, storages=STORAGES):
    """(status, why, is_float32): status 'passed' | 'failed' | 'refused'."""
    from minirt import MinirtError, Session
    f32 = True
    for k, ds in enumerate(case.data_sets):
        try:
            model, feeds, expected, f32_k = feeds_of(case, ds, op)
        except _Skip as e:
            return "refused", f"harness: {e}", False
        f32 = f32 and f32_k
        for st in storages:
            try:
                with Session(model, storage=st) as s:
                    got = s.run(None, feeds) if feeds or s.inputs else s.run(None, {})
            except MinirtError as e:
                where = f"{st} storage only: " if st != storages[0] else ""
                return "refused", f"{where}{type(e).__name__}: {_first_line(e)}", f32
            except Exception as e:   # anything else is a bug: minirt promises MinirtError subclasses
                return "failed", f"{st}: crashed with {type(e).__name__}: {_first_line(e)}", f32
            names = [o.name for o in case.model.graph.output]
            for name, g, w in zip(names, got, expected):
                why = compare(g, w, *ROUNDED_EXPECTED.get(case.name, (RTOL, ATOL)))
                if why:
                    return "failed", f"{st}: output '{name}': {why}", f32
    return "passed", "", f32


def _first_line(e) -> str:
    text = str(e).strip().splitlines()
    text = [t.strip() for t in text if t.strip()]
    s = " ".join(text[:2]) if text else type(e).__name__
    s = re.sub(r"^<ModelProto>: ", "", s)
    s = re.sub(r"^1 node\(s\) (cannot run|use ops minirt does not support \([^)]*\)): ", "", s)
    return s[:300]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", help="comma-separated ops (default: every ONNX op in minirt's registry)")
    ap.add_argument("--storage", default=",".join(STORAGES), help="buffer,texture (default both)")
    ap.add_argument("--json", default=str(ROOT / "docs" / "conformance.json"))
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--merge", action="store_true",
                    help="with --ops: replace only these ops' results in the existing JSON, keep the others'")
    ap.add_argument("-k", help="only cases whose name contains this")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args(argv)
    if a.merge and (not a.ops or a.k):
        ap.error("--merge needs --ops and no -k (it replaces whole ops' results)")
    os.environ.setdefault("MINIRT_TIMEOUT_S", "60")     # a hang is a failure, not a stuck tool
    storages = tuple(s for s in a.storage.split(",") if s)
    chosen = select(a.ops.split(",") if a.ops else None)
    if a.k:
        chosen = [(o, c) for o, c in chosen if a.k in c.name]
    results = {}
    failures = []
    t0 = time.time()
    for op, case in chosen:
        with contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            status, why, f32 = run_case(case, op, storages)
        bucket = results.setdefault(op, {"passed": 0, "failed": 0, "refused": 0,
                                         "other_dtypes": {"passed": 0, "failed": 0, "refused": 0}})
        (bucket if f32 else bucket["other_dtypes"])[status] += 1
        if f32 and status != "passed":
            failures.append({"case": case.name, "op": op, "status": status, "why": why})
        if a.verbose or (f32 and status == "failed"):
            print(f"{status:8s} {'f32  ' if f32 else 'other'} {op:20s} {case.name}" + (f": {why}" if why else ""),
                  flush=True)
    for op in sorted(set(a.ops.split(",")) if a.ops else onnx_ops()):
        results.setdefault(op, {"passed": 0, "failed": 0, "refused": 0,
                                "other_dtypes": {"passed": 0, "failed": 0, "refused": 0}})
    ncases = len(chosen)
    if a.merge:
        old = json.loads(Path(a.json).read_text())
        if old.get("storages") != list(storages):
            raise SystemExit(f"--merge: {a.json} was made in {old.get('storages')} storage, this run in "
                             f"{list(storages)}")
        failures = sorted([f for f in old["failures"] if f["op"] not in results] + failures,
                          key=lambda f: (f["op"], f["case"]))      # a full run's order
        results = {**{op: r for op, r in old["ops"].items() if op not in results}, **results}
        ncases = sum(r[k] + r["other_dtypes"][k] for r in results.values() for k in ("passed", "failed", "refused"))
    tot = {k: sum(r[k] for r in results.values()) for k in ("passed", "failed", "refused")}
    oth = {k: sum(r["other_dtypes"][k] for r in results.values()) for k in ("passed", "failed", "refused")}
    import onnx
    none = sorted(op for op, r in results.items()
                  if not any(r[k] for k in ("passed", "failed", "refused")) and not any(r["other_dtypes"].values()))
    summary = (f"ONNX {onnx.__version__} backend node tests (`onnx.backend.test.case.node`, {ncases} cases of "
               f"minirt's ONNX ops, expanded function bodies included; LayerNormalization's cases also run with "
               f"only their Y output, as `<case>[first output]`), run by `python tools/conformance.py` in "
               f"{' and '.join(storages)} storage on {_device_name()}; a case passes when every output matches in "
               f"every storage within rtol {RTOL}, atol {ATOL} (atol 1e-4 for "
               f"{', '.join(f'`{c}`' for c in sorted(ROUNDED_EXPECTED))}, whose expected values onnx gives rounded to "
               f"4 decimals). float32 cases: {tot['passed']} passed, "
               f"{tot['failed']} failed, {tot['refused']} refused with a clear error. Cases of other dtypes "
               f"(the GPU computes in float32; integer and boolean tensors run on the host): {oth['passed']} passed, {oth['failed']} failed, "
               f"{oth['refused']} refused. Integer inputs after the first (axes, shapes, indices) and the inputs "
               f"minirt needs constant (Conv and ConvTranspose W/B, LayerNormalization and InstanceNormalization "
               f"scale/B, BatchNormalization scale/B/mean/var, Clip min/max, Pad constant_value, Resize "
               f"roi/scales) are given as initializers; other "
               f"inputs at run time."
               + (f" No node test in this onnx exercises: {', '.join(none)}." if none else ""))
    doc = {"onnx_version": onnx.__version__, "storages": list(storages), "rtol": RTOL, "atol": ATOL,
           "ops": dict(sorted(results.items())), "summary": summary, "failures": failures}
    print(summary)
    print(f"{len(chosen)} cases in {time.time() - t0:.0f} s")
    if not a.no_write:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {a.json}")
    return 1 if tot["failed"] else 0


def _device_name() -> str:
    try:
        from minirt.session import get_device
        return get_device().profile.name
    except Exception:
        return "no device"


if __name__ == "__main__":
    sys.exit(main())
