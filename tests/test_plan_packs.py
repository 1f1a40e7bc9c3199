"""The plans of one planning call pack each weight once (minirt.planner.lower.Packs): a Whisper batch's entry points
(bencode and the encoders of fewer windows, the steps) hold one array object for a packed weight they share, made
by one call of its packing, and equal to what a plan made on its own packs."""
import hashlib

import numpy as np

from test_whisper_vulkan import small_whisper

OPTS = {"precision": "fp16"}


def _h200():
    from minirt.device_profile import KNOWN_PROFILES
    return KNOWN_PROFILES["nvidia-h200"]     # tensor cores: the register-fed packing (pack_regfed) is planned


def test_a_batch_program_packs_each_weight_once(monkeypatch):
    from minirt.kernels import gemm
    from minirt.plan import WEIGHT
    from minirt.whisper.vulkan import plan_batch
    packed = []
    real = gemm.pack_regfed
    monkeypatch.setattr(gemm, "pack_regfed", lambda w: packed.append(hashlib.sha1(
        np.ascontiguousarray(w)).hexdigest()) or real(w))
    w, cfg = small_whisper(max_target_positions=16)
    plans = plan_batch(w, cfg, _h200(), 4, OPTS)
    assert {"bencode", "bencode1", "bencode2"} <= set(plans)
    assert packed and len(packed) == len(set(packed)), "a weight was packed more than once"
    holders = {}       # packed weight -> the arrays the plans hold for it
    for p in plans.values():
        for t in p.tensors.values():
            if t.role == WEIGHT:
                holders.setdefault(t.name, []).append(t.data)
    shared = {k: v for k, v in holders.items() if len(v) > 1}
    assert any("@regfed" in k for k in shared) and any(k.startswith("model.decoder.") for k in shared)
    for name, arrays in shared.items():
        assert all(a is arrays[0] for a in arrays), f"'{name}': plans hold separate copies"


def test_the_program_and_its_batch_pack_the_encoder_once(monkeypatch):
    """plan_program and plan_batch given one Packs (as VulkanBackend and `minirt plan --items` do): the batch's
    encoders hold the program encoder's packed arrays, and no weight is packed twice."""
    from minirt.kernels import gemm
    from minirt.planner.lower import Packs
    from minirt.plan import WEIGHT
    from minirt.whisper.vulkan import plan_batch, plan_program
    packed = []
    real = gemm.pack_regfed
    monkeypatch.setattr(gemm, "pack_regfed", lambda w: packed.append(hashlib.sha1(
        np.ascontiguousarray(w)).hexdigest()) or real(w))
    w, cfg = small_whisper(seed=2, max_target_positions=16)
    packs = Packs()
    program = plan_program(w, cfg, _h200(), 2, OPTS, packs)
    batch = plan_batch(w, cfg, _h200(), 4, OPTS, program, packs)
    assert packed and len(packed) == len(set(packed)), "a weight was packed more than once"
    ours = {id(t.data) for t in program["encode"].tensors.values() if t.role == WEIGHT and "@regfed" in t.name}
    theirs = {id(t.data) for t in batch["bencode"].tensors.values() if t.role == WEIGHT and "@regfed" in t.name}
    assert ours and ours == theirs


def test_shared_packings_equal_a_plan_made_alone():
    from minirt.driver import plan_graph
    from minirt.options import Options
    from minirt.whisper import decoder_graph
    from minirt.whisper.vulkan import plan_batch
    w, cfg = small_whisper(seed=1, max_target_positions=16)
    plans = plan_batch(w, cfg, _h200(), 4, OPTS)
    dm = decoder_graph.dims_of(w, cfg)
    alone = {k: plan_graph(decoder_graph.batch_graphs(w, dm, 4)[k], _h200(), "buffer",
                           Options.of(OPTS).replace(storage="buffer"))[1] for k in ("bencode1", "bstep2")}
    for k, p in alone.items():
        got = plans[k].tensors
        assert set(got) == set(p.tensors)
        for name, t in p.tensors.items():
            if t.data is not None:
                assert got[name].data.dtype == t.data.dtype and np.array_equal(got[name].data, t.data), name


def test_packs_tell_arrays_apart_bit_for_bit():
    from minirt.planner.lower import Packs
    rng = np.random.default_rng()
    a = rng.standard_normal((300, 40)).astype(np.float32)
    packs, made = Packs(), []

    def pack(x):
        return packs.once(("pack", x, 2.0), lambda: made.append(x) or x * 2)
    assert pack(a) is pack(a.copy()) is pack(np.asfortranarray(a)) and len(made) == 1
    b = a.copy()
    b[1, 1] += 1          # off the sampled elements
    c = a.copy()
    c[0, 0] = -0.0 if a[0, 0] == 0 else -a[0, 0]
    z, nz = np.zeros(8, np.float32), np.zeros(8, np.float32)
    nz[3] = -0.0          # equal as numbers, not as bits
    for x in (b, c, a[:, :20], a.astype(np.float64), z, nz):
        assert np.array_equal(pack(x), x * 2)
    assert len(made) == 7 and packs.once(("other", a, 2.0), lambda: "made") == "made"
