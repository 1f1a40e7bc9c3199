"""The child process the fuzz tests run their cases in (tests/test_fuzz.py): one JSON case per line of stdin,
one JSON result per line on fd 3, under an address-space limit and an audit hook that records every file
opened inside the fuzz folder but outside the case's own model folder.

A case runs in a child so that a crash, a hang or a runaway allocation shows as what it is (a dead or silent
child, a MemoryError) instead of taking the test session down; one child serves many cases to keep the
per-case cost low, and the parent starts a fresh one after any case that killed it.

    python tests/fuzz_worker.py LIMIT_MIB FUZZ_ROOT
"""
from __future__ import annotations

import json
import os
import resource
import sys
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    limit, root = int(sys.argv[1]) << 20, os.path.realpath(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    out = os.fdopen(os.dup(1), "w")         # results only; stray prints from libraries go to stderr
    os.dup2(2, 1)
    sys.path.insert(0, str(HERE))
    import numpy as np
    import onnxruntime  # noqa: F401  (imported before the hook: its own files are not the model's)

    from minirt import MinirtError, Session
    from minirt.vk.executor import live_objects
    from oracle import compare

    state = {"folder": None, "outside": []}

    def hook(event, args):
        if event != "open" or state["folder"] is None or not isinstance(args[0], (str, bytes, os.PathLike)):
            return
        p = os.path.realpath(os.fsdecode(args[0]))
        if p.startswith(root + os.sep) and not p.startswith(state["folder"] + os.sep):
            state["outside"].append(p)
        elif p in ("/etc/hostname", "/etc/passwd"):
            state["outside"].append(p)

    sys.addaudithook(hook)
    out.write("ready\n")
    out.flush()

    def feeds_for(s, seed):
        rng = np.random.default_rng(seed)
        return {i.name: rng.uniform(-1, 1, [d if isinstance(d, int) else 1 for d in i.shape]).astype(np.float32)
                for i in s.inputs}

    def reference(case, feeds):
        if not case.get("oracle"):
            return None
        import onnxruntime as ort
        so = ort.SessionOptions()
        so.log_severity_level = 4
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        try:
            return ort.InferenceSession(case["oracle"], so, providers=["CPUExecutionProvider"]).run(None, feeds)
        except Exception:
            return None

    def check(outs, declared, case, feeds):
        """None when the outputs are right, else what is wrong."""
        for o, shape in zip(outs, declared):
            if shape is not None and len(shape) != np.ndim(o):
                return f"output rank {np.ndim(o)} where the Session declared {shape}"
        ref = reference(case, feeds)
        for o, r in zip(outs, ref or ()):
            if np.shape(o) != np.shape(r):
                return f"output shape {np.shape(o)}, onnxruntime's {np.shape(r)}"
            if np.isfinite(r).all():
                try:
                    compare(o, r, 1e-3)
                except AssertionError as e:
                    return str(e)
        return None

    def selftest(kind):
        """Cases that are bad for the harness, not for minirt: the parent's test that it sees them."""
        if kind == "crash":
            os.abort()
        if kind == "hang":
            import time
            time.sleep(3600)
        if kind == "memory":
            return bytearray(8 << 30)
        if kind == "raise":
            raise KeyError("internal")
        open(os.path.join(root, "secret.bin"), "rb").close()

    def run(case):
        if case.get("selftest"):
            return selftest(case["selftest"])
        kw = {"storage": case.get("storage", "buffer")}
        if case.get("weights"):
            kw["weights"] = case["weights"]
        with Session(case["model"], **kw) as s:
            declared = [o.shape for o in s.outputs]
            if case.get("feeds"):
                # a bad input is refused (or runs correctly), and the Session runs a good one right after
                with np.load(case["feeds"], allow_pickle=False) as z:
                    bad = {k: z[k] for k in z.files}
                try:
                    wrong = check(s.run(None, bad), declared, case, bad)
                    if wrong:
                        return wrong
                except MinirtError:
                    pass
            feeds = feeds_for(s, 1)
            return check(s.run(None, feeds), declared, case, feeds)

    for line in sys.stdin:
        case = json.loads(line)
        state["folder"], state["outside"] = os.path.realpath(case["folder"]), []
        before = live_objects()
        result = {"outcome": "ran"}
        try:
            result["mismatch"] = run(case)
        except MinirtError as e:
            result = {"outcome": "refused", "error": type(e).__name__, "message": str(e)[:300]}
        except BaseException as e:              # MemoryError included: a small file must not cost gigabytes
            result = {"outcome": "internal", "error": type(e).__name__, "message": str(e)[:300],
                      "traceback": traceback.format_exc()[-2000:]}
        state["folder"] = None
        result["leaked"] = live_objects() - before
        result["outside"] = sorted(set(state["outside"]))
        out.write(json.dumps(result) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
