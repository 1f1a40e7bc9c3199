"""Stream splits of the attention (STREAM in glsl/attention.glslh, attention_combine.comp): the (query block, key block)
items cut into G equal ranges, one a work group, the pieces merged by the combine pass. Numerics against a float64
reference for forced G (ranges that cross query blocks, heads and batches; more groups than items; both storages;
fp16), and the plan rule: on by default on discrete GPUs with a multiprocessor count, one wave of groups."""
import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

import minirt.kernels.attention_split as attention_splits
from minirt.options import Options
from minirt import Session
from minirt.device_profile import KNOWN_PROFILES
from minirt.errors import MinirtError
from minirt.infer import prepare
from minirt.loaders import load
from minirt.planner import make_plan
from oracle import STORAGES, compare

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_attention_split import inputs, kernels, reference  # noqa: E402
from test_fuse_attention import attention_model  # noqa: E402

H200, LAVAPIPE = KNOWN_PROFILES["nvidia-h200"], KNOWN_PROFILES["lavapipe"]


def _run(B, Tq, Tk, H, dh, G, storage="buffer", precision="fp32", seed=0):
    m = attention_model(B, Tq, Tk, H, dh)
    fd = inputs(B, Tq, Tk, H * dh, seed)
    # (coopmat=False: at fp16 on tensor-core devices the attention is attention_cmr's, which has no stream splits)
    opts = {"poison": True, "attention_stream": G, "coopmat": False}
    with Session(m, storage=storage, precision=precision, options=opts) as s:
        split = next(d for d in s.plan.dispatches if "attention_split" in d.kernel)
        y = s.run(None, fd)[0]
        y2 = s.run(None, fd)[0]
    assert np.array_equal(y, y2), "two runs differ"
    return y, reference(fd["q"], fd["k"], fd["v"], H), split


@pytest.mark.parametrize("B,Tq,Tk,H,dh,G", [
    (1, 200, 200, 6, 64, 7),      # ranges cross query blocks and heads
    (1, 200, 200, 6, 64, 13),
    (2, 37, 45, 2, 32, 5),        # batch 2, ragged key and query blocks
    (1, 100, 300, 3, 16, 11),     # cross attention
    (1, 50, 64, 2, 16, 400),      # more groups than items: capped at one item a group
])
def test_forced_stream_matches_numpy(B, Tq, Tk, H, dh, G):
    for st in STORAGES:
        y, ref, split = _run(B, Tq, Tk, H, dh, G, st)
        compare(y, ref, 2e-5, f"stream G={G} {st}")
        assert split.global_size[1] == 1 and 1 < split.global_size[2] <= G


def test_stream_at_fp16():
    y, ref, _ = _run(1, 120, 120, 4, 32, 9, precision="fp16")
    err = np.linalg.norm(y - ref) / np.linalg.norm(ref)
    assert err < 2e-3, err


def _plan(profile, H=6, options=None):
    return make_plan(prepare(load(attention_model(1, 1500, 1500, H, 64))), profile, "buffer", options or {})


@pytest.mark.parametrize("options,rows,nb,groups", [
    ({}, 96, 63, (96, 128)),                          # paired lanes (NVIDIA): tile (128, 8, 6, 3), 24 keys a block
    ({"pair_lanes": False}, 80, 47, (114, 152)),      # tile (128, 8, 5, 4)
])
def test_rule_streams_one_wave_on_discrete_gpus(options, rows, nb, groups):
    """H200 profile: one group a multiprocessor, 132 at once. Whisper-tiny's and base's query blocks (6 and 8 heads)
    both become 132 equal ranges; CPU and mobile devices, and groups filling whole waves, stay as they were."""
    for H, g in zip((6, 8), groups):
        p = _plan(H200, H, options)
        assert kernels(p) == ["attention_split_buffer", "attention_combine_buffer"]
        split, comb = p.dispatches
        assert split.global_size == (128, 1, 132)
        assert split.push[-4:] == (1).to_bytes(4, "little")              # the STREAM flag
        assert comb.push[-16:-8] == (132).to_bytes(4, "little") + (rows).to_bytes(4, "little")   # G, rows a block
        U = g * nb
        S = max(((s * nb + nb) * 132 - 1) // U - ((s * nb + 1) * 132 - 1) // U + 1 for s in range(g))
        assert int.from_bytes(split.push[64:68], "little") == S            # slots a (batch, head), after the mask's
        assert any("stream split" in n for notes in p.notes.values() for n in notes)
    assert kernels(_plan(LAVAPIPE, options=options)) == ["attention_buffer"]
    one_wave = dataclasses.replace(H200, compute_units=groups[0])
    assert kernels(_plan(one_wave, options=options)) == ["attention_buffer"]
    assert kernels(_plan(dataclasses.replace(H200, compute_units=0), options=options)) == ["attention_buffer"]
    # the options: off, a forced G, and forced plain splits instead
    off = _plan(H200, options={**options, "attention_stream": False})   # the plain key-split rule instead
    S = attention_splits.splits(H200, groups[0], 1500)
    assert kernels(off) == (["attention_buffer"] if S == 1 else ["attention_split_buffer", "attention_combine_buffer"])
    assert S == 1 or off.dispatches[0].push[-4:] == bytes(4)                 # no STREAM flag
    assert _plan(H200, options={**options, "attention_stream": 264}).dispatches[0].global_size == (128, 1, 264)
    forced = _plan(H200, options={**options, "attention_splits": 2})
    assert forced.dispatches[0].global_size == (128, -(-1500 // rows), 12)


def test_stream_groups_are_capped_and_checked():
    class Ctx:
        profile, options = H200, Options.make({"attention_stream": 1000})
    assert attention_splits.stream_groups(Ctx, 3, 64, 32, 40000) == 3 * 2      # one item (key block) a group at most
    with pytest.raises(MinirtError, match="attention_stream"):
        Options.make({"attention_stream": "x"})


def test_combine_local_size():
    """On NVIDIA the combine pass runs in groups of a head's 16 vec4 columns by 16 rows (minirt.kernels.attention_split.head_rows_shape);
    a forced elementwise local size still wins; and that shape merges right (lavapipe, forced, against float64)."""
    comb = _plan(H200).dispatches[1]
    assert comb.kernel == "attention_combine_buffer" and comb.local_size == (16, 16, 1)
    forced = _plan(H200, options={"local_size": (8, 8, 1), "local_size_families": ("elementwise",)})
    assert forced.dispatches[1].local_size == (8, 8, 1)
    m = attention_model(1, 150, 170, 4, 64)
    fd = inputs(1, 150, 170, 256, seed=5)
    opts = {"poison": True, "attention_stream": 9, "local_size": (16, 16, 1), "local_size_families": ("elementwise",)}
    with Session(m, storage="buffer", options=opts) as s:
        c = next(d for d in s.plan.dispatches if "combine" in d.kernel)
        assert c.local_size == (16, 16, 1)
        compare(s.run(None, fd)[0], reference(fd["q"], fd["k"], fd["v"], 4), 2e-5, "combine in 16x16 groups")
