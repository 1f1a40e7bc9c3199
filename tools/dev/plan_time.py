#!/usr/bin/env python3
"""Host time of planning a Whisper batch program (minirt.whisper.vulkan.plan_batch: bencode, the encoders of fewer
windows, the steps) of a random-weights checkpoint on a device profile of minirt/device_profile.py, optionally with
fewer encoder layers (planning time grows with them); --profile prints cProfile's top costs.

    python tools/dev/plan_time.py small --items 16 --device nvidia-h200 --precision fp16
    python tools/dev/plan_time.py large-v3-turbo --encoder-layers 4 --profile"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("size", help="a size of minirt.whisper.synthetic.SIZES (tiny, base, small, ..., large-v3-turbo)")
    ap.add_argument("--items", type=int, default=16, help="sequences of the batch (default 16)")
    ap.add_argument("--device", default="nvidia-h200", help="a profile of KNOWN_PROFILES (default nvidia-h200)")
    ap.add_argument("--precision", default="fp16", choices=("fp32", "fp16"))
    ap.add_argument("--encoder-layers", type=int, default=0, help="fewer encoder layers (0: the size's)")
    ap.add_argument("--profile", action="store_true", help="print cProfile's top costs")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from minirt.device_profile import KNOWN_PROFILES
    from minirt.whisper.synthetic import SIZES, random_checkpoint
    from minirt.whisper.vulkan import plan_batch
    cfg = dict(SIZES[a.size])
    if a.encoder_layers:
        cfg["encoder_layers"] = a.encoder_layers
    weights, config = random_checkpoint(cfg, 0)
    prof = cProfile.Profile() if a.profile else None
    t = time.perf_counter()
    if prof:
        prof.enable()
    plans = plan_batch(weights, config, KNOWN_PROFILES[a.device], a.items, {"precision": a.precision})
    if prof:
        prof.disable()
    took = time.perf_counter() - t
    if prof:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(30)
    print(f"{a.size} (encoder layers {cfg['encoder_layers']}), {a.items} sequences, {a.device} {a.precision}: "
          f"{len(plans)} entry points ({', '.join(sorted(plans))}) planned in {took:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
