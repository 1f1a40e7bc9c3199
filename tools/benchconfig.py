"""The PRECISION[:KEY=VALUE,...] configurations that tools/gemm_bench.py and tools/attn_bench.py take."""
from __future__ import annotations

import re

_DIMS = re.compile(r"^\d+(x\d+)+$")


def parse_config(text: str, local_size_families=("gemm",)) -> dict:
    """Session options from "fp16:cm_tile=m64n64k32,local_size=16x8,coopmat=0": 0/false -> False, NxM.. -> a tuple of
    ints (local_size padded to 3 and applied to `local_size_families` only), digits -> int, else the string."""
    prec, _, rest = text.partition(":")
    opts = {"precision": prec}
    for item in filter(None, rest.split(",")):
        k, _, v = item.partition("=")
        if v in ("0", "false"):
            opts[k] = False
        elif _DIMS.match(v):
            opts[k] = tuple(int(a) for a in v.split("x"))
        else:
            opts[k] = int(v) if v.isdigit() else v
    if "local_size" in opts:
        size = opts["local_size"] if isinstance(opts["local_size"], tuple) else (int(opts["local_size"]),)
        opts["local_size"], opts["local_size_families"] = (size + (1, 1))[:3], tuple(local_size_families)
    return opts
