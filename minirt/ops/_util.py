"""Small helpers shared by op definitions."""
from __future__ import annotations

from ..errors import ModelError



def broadcast_shapes(node, *shapes):
    """numpy broadcasting over shapes whose dims may be symbolic strings."""
    rank = max(len(s) for s in shapes)
    out = []
    for i in range(rank):
        dims = [s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0]
        known = {d for d in dims if d != 1}
        if not known:
            out.append(1)
        elif len(known) == 1:
            out.append(known.pop())
        else:
            ints = {d for d in known if isinstance(d, int)}
            if len(ints) > 1:
                raise ModelError(f"{node}: shapes {[list(s) for s in shapes]} do not broadcast")
            out.append(ints.pop() if ints else sorted(known)[0])
    return tuple(out)


def norm_axis(node, axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise ModelError(f"{node}: axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def same(node, ins, i=0):
    """Output like input i."""
    return [(ins[i].shape, ins[i].dtype)]

