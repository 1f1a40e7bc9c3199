#!/usr/bin/env python3
"""Hash the default plans of Whisper tiny and base, fp32 and fp16, on the H200, lavapipe, Adreno and Mali profiles of
minirt/device_profile.py (and on the machine's own device with --real), and the plans of every entry point of the
Whisper program (minirt.whisper.vulkan.plan_program) of a random-weights tiny and of its batch of 16 sequences
(plan_batch: fitted to each profile's limits), and (with --families) the default plans of every model in
models/families/*.onnx in both storages on those profiles: a refactor that must leave the plans as they were compares
these hashes between two trees.

    python tools/dev/plan_hash.py                 # this tree
    python tools/dev/plan_hash.py OTHER_TREE      # another checkout's minirt, with this script
    python tools/dev/plan_hash.py --families      # also every model of models/families

A hash covers what the executor consumes: every tensor's shape, role, storage, layout, dtype, view and data, and every
dispatch's kernel, node, bindings, push constants, specialization constants, sizes, FLOPs and bytes, and the
lifetimes; not the planner's notes."""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path


def digest(plan, np) -> str:
    h = hashlib.sha256()

    def put(*x):
        h.update(repr(x).encode())
    put(plan.storage, plan.precision, plan.inputs, plan.outputs, sorted(plan.host_in.items()),
        sorted(plan.host_out.items()), plan.poison)
    for n in sorted(plan.tensors):
        t = plan.tensors[n]
        put(n, tuple(t.shape), t.role, t.storage, t.packed_dim, t.dtype, t.view_of, t.view_offset,
            None if t.data is None else hashlib.sha256(np.ascontiguousarray(t.data).tobytes()).hexdigest())
    for d in plan.dispatches:
        put(d.kernel, d.node, d.op, [tuple(a) for a in d.args], d.push.hex(), tuple(d.spec), tuple(d.global_size),
            tuple(d.local_size), d.family, d.flops, d.bytes, tuple(d.shared_xy))
    put(sorted(plan.lifetimes.items()))
    return h.hexdigest()[:16]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tree", nargs="?", default=str(Path(__file__).resolve().parents[2]),
                    help="the checkout whose minirt and models/ to use (default: this one)")
    ap.add_argument("--real", action="store_true", help="also the profile of the machine's own Vulkan device")
    ap.add_argument("--families", action="store_true", help="also every model in models/families/*.onnx")
    a = ap.parse_args(argv)
    sys.path[:0] = [a.tree, str(Path(a.tree) / "models")]
    import numpy as np
    import whisper_encoder as we
    from minirt.device_profile import KNOWN_PROFILES
    from minirt.infer import prepare
    from minirt.loaders import load
    from minirt.planner import make_plan
    profiles = {k: KNOWN_PROFILES[k] for k in ("nvidia-h200", "lavapipe", "adreno-840", "mali-g715")}
    if a.real:
        from minirt.session import get_device
        profiles["real:" + get_device().profile.name] = get_device().profile
    out = {}
    try:
        from minirt.whisper.synthetic import SIZES, random_checkpoint
        from minirt.whisper.vulkan import plan_batch, plan_program
        weights, cfg = random_checkpoint(SIZES["tiny"], 0)
    except ImportError as e:        # a tree from before the Whisper program
        out["program"] = f"error {type(e).__name__}: {e}"[:120]
        weights = None
    for precision in ("fp32", "fp16") if weights is not None else ():
        for name, p in profiles.items():
            for kind, plan_fn, rows in (("program", plan_program, 5), ("batch", plan_batch, 16)):
                try:
                    plans = plan_fn(weights, cfg, p, rows, {"precision": precision})
                    out.update({f"{kind}/{precision}/{name}/{e}": f"{digest(plan, np)} n={len(plan.dispatches)}"
                                for e, plan in plans.items()})
                except Exception as e:
                    out[f"{kind}/{precision}/{name}"] = f"error {type(e).__name__}: {e}"[:120]
    for size in ("tiny", "base"):
        g = prepare(load(we.build_whisper_encoder(size)))
        for precision in ("fp32", "fp16"):
            for name, p in profiles.items():
                try:
                    plan = make_plan(g, p, "auto", {"precision": precision})
                    out[f"{size}/{precision}/{name}"] = f"{digest(plan, np)} n={len(plan.dispatches)}"
                except Exception as e:      # a tree that cannot plan it: say so, keep going
                    out[f"{size}/{precision}/{name}"] = f"error {type(e).__name__}: {e}"[:120]
    if a.families:
        import onnx
        from minirt.infer import bind_inputs
        for path in sorted((Path(a.tree) / "models" / "families").glob("*.onnx")):
            try:    # as a Session prepares it; symbolic dims (the text families' batch, sequence) bound to 1 x 8
                g = load(onnx.load(path))
                g = prepare(bind_inputs(g, {n: tuple(d if isinstance(d, int) else (1 if i == 0 else 8)
                                                     for i, d in enumerate(g.tensor(n).shape)) for n in g.inputs}),
                            host=True)
            except Exception as e:
                out[f"families/{path.stem}"] = f"error {type(e).__name__}: {e}"[:120]
                continue
            for storage in ("buffer", "texture"):
                for name, p in profiles.items():
                    try:
                        plan = make_plan(g, p, storage)
                        out[f"families/{path.stem}/{storage}/{name}"] = f"{digest(plan, np)} n={len(plan.dispatches)}"
                    except Exception as e:
                        out[f"families/{path.stem}/{storage}/{name}"] = f"error {type(e).__name__}: {e}"[:120]
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
