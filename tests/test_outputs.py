"""How outputs come back (minirt/vk/outputs.py): a returned array is never written by a later run, whichever way the
run delivered it (zero-copy sets, plain sets, fresh arrays once the caller keeps every set); Session.run(..., out=)
writes the same bits into the caller's arrays and refuses unfit ones by name; nothing leaks."""
import numpy as np
import pytest
from onnx import helper

from minirt import InputError, Session
from minirt.vk.executor import live_objects
from minirt.vk.outputs import OUTPUT_SETS, fresh
from oracle import make_model, rand

# (storage, options): zero-copy sets where the driver imports host memory, plain sets and host copies otherwise
DELIVERIES = [("buffer", {}), ("buffer", {"zero_copy": False}), ("texture", {})]
IDS = ["buffer", "buffer-copy", "texture"]


def _seed():
    return int(np.random.SeedSequence().entropy % 2**31)


def _model():
    """Two outputs: y = relu(x) + x and z = tanh(x)."""
    return make_model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "x"], ["y"]),
                       helper.make_node("Tanh", ["x"], ["z"])], {"x": [3, 40]}, ["y", "z"])


def _ref(x):
    x = x.astype(np.float64)
    return [np.maximum(x, 0) + x, np.tanh(x)]


@pytest.fixture
def no_leaks():
    before = live_objects()
    yield
    assert live_objects() == before, f"{live_objects() - before} Vulkan object(s) leaked"


@pytest.mark.parametrize("storage,options", DELIVERIES, ids=IDS)
def test_kept_outputs_are_never_overwritten(no_leaks, storage, options):
    """Keep 5 results (more than the sets), run 5 more on other inputs, with more kept and some dropped: every kept
    result still holds its own input's output, bit for bit what a later run of that input gives."""
    xs = [rand(3, 40, seed=_seed()) for _ in range(10)]
    with Session(_model(), storage=storage, options={"poison": True, **options}) as s:
        kept = [s.run(None, {"x": x}) for x in xs[:5]]
        for i, x in enumerate(xs[5:]):
            out = s.run(None, {"x": x})
            if i % 2:
                kept.append(out)
            del out
        inputs = xs[:5] + xs[6::2]
        assert len({id(a) for pair in kept for a in pair}) == 2 * len(kept)      # no two results share an array
        for (y, z), x in zip(kept, inputs):
            ref_y, ref_z = _ref(x)
            np.testing.assert_allclose(y, ref_y, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(z, ref_z, rtol=1e-5, atol=1e-6)
            again = s.run(None, {"x": x})
            assert again[0].tobytes() == y.tobytes() and again[1].tobytes() == z.tobytes()


@pytest.mark.parametrize("storage,options", DELIVERIES, ids=IDS)
def test_one_distinct_output_kept_or_dropped(storage, options):
    """Determinism through every set and the fresh arrays: 8 runs of one input, kept, then 8 dropped, one digest."""
    x = rand(3, 40, seed=_seed())
    with Session(_model(), storage=storage, options=options) as s:
        kept = [s.run(None, {"x": x})[0] for _ in range(2 * OUTPUT_SETS + 2)]
        digests = {y.tobytes() for y in kept}
        digests |= {s.run(None, {"x": x})[0].tobytes() for _ in range(2 * OUTPUT_SETS + 2)}
    assert len(digests) == 1


def test_sets_are_reused_once_dropped_and_never_while_held():
    """Plain sets (option zero_copy off): a dropped result's memory serves the next run; while every set is held the
    runs fill fresh arrays, and a set is handed out again once the caller lets go of it."""
    with Session(_model(), storage="buffer", options={"zero_copy": False}) as s:
        ex = next(iter(s._execs.values()))
        assert not ex.slots and len(ex.plain) == OUTPUT_SETS
        sets = {id(arr) for st in ex.plain for _, arr, _ in st["items"]}
        x = rand(3, 40, seed=_seed())
        a = s.run(None, {"x": x})[0]
        assert id(a) in sets
        ida = id(a)
        del a
        assert id(s.run(None, {"x": x})[0]) == ida                   # dropped: the same memory again
        held = [s.run(None, {"x": x}) for _ in range(OUTPUT_SETS + 2)]
        assert sum(id(y) in sets for y, _ in held) == OUTPUT_SETS    # then fresh arrays
        assert all(y.flags.writeable and y.flags.c_contiguous and y.base is None for y, _ in held[OUTPUT_SETS:])
        del held
        assert id(s.run(None, {"x": x})[0]) in sets


def test_fresh_arrays():
    for shape in [(3, 40), (0, 5), (1, 1500, 384), ()]:
        a = fresh(shape)
        assert a.shape == shape and a.dtype == np.float32 and a.flags.c_contiguous and a.flags.writeable


@pytest.mark.parametrize("storage,options", DELIVERIES, ids=IDS)
def test_out_writes_the_same_bits_into_the_callers_arrays(no_leaks, storage, options):
    x = rand(3, 40, seed=_seed())
    with Session(_model(), storage=storage, options={"poison": True, **options}) as s:
        y, z = s.run(None, {"x": x})
        oy, oz = np.full((3, 40), 7.0, np.float32), np.full((3, 40), 7.0, np.float32)
        res = s.run(None, {"x": x}, out={"y": oy, "z": oz})
        assert res[0] is oy and res[1] is oz
        assert oy.tobytes() == y.tobytes() and oz.tobytes() == z.tobytes()
        # a list matching the outputs asked for; a dict for some of them (the others come back as usual)
        x2 = rand(3, 40, seed=_seed())
        (rz,) = s.run(["z"], {"x": x2}, out=[oz])
        assert rz is oz and oz.tobytes() == s.run(["z"], {"x": x2})[0].tobytes()
        ry, rz2 = s.run(None, {"x": x}, out={"y": oy})
        assert ry is oy and rz2 is not oz and oy.tobytes() == y.tobytes() and rz2.tobytes() == z.tobytes()
        # out= overwrites the caller's array on every run, as asked; plain results stay as they were
        s.run(None, {"x": x2}, out={"y": oy})
        assert oy.tobytes() != y.tobytes() and y.tobytes() == s.run(None, {"x": x})[0].tobytes()


def test_out_single_form():
    x = rand(3, 40, seed=_seed())
    m = make_model([helper.make_node("Tanh", ["x"], ["y"])], {"x": [3, 40]}, ["y"])
    with Session(m, storage="buffer") as s:
        buf = np.empty((3, 40), np.float32)
        assert s.run(x, out=buf) is buf
        assert buf.tobytes() == s.run(x).tobytes()
        assert s.run(x, out={"y": buf}) is buf
        with pytest.raises(InputError, match="out names .*'q'"):
            s.run(x, out={"q": buf})


def test_out_refuses_unfit_arrays_by_name_and_the_session_stays_usable(no_leaks):
    x = rand(3, 40, seed=_seed())
    good = np.zeros((3, 40), np.float32)
    ro = np.zeros((3, 40), np.float32)
    ro.flags.writeable = False
    big = np.zeros((3, 80), np.float32)
    cases = [({"y": np.zeros((3, 40))}, r"output 'y' must be a writeable C-contiguous float32 .* got dtype float64"),
             ({"z": np.zeros((40, 3), np.float32)}, r"output 'z' .*shape \[3, 40\]; got shape \[40, 3\]"),
             ({"y": big[:, ::2]}, r"output 'y' .*got not C-contiguous"),
             ({"y": ro}, r"output 'y' .*got read-only"),
             ({"y": [0.0] * 120}, r"output 'y' .*got list"),
             ({"y": good, "z": good}, r"'y' and 'z' share memory"),
             ({"y": good, "z": good.reshape(-1)[:120].reshape(3, 40)}, "share memory"),
             ({"w": good}, r"out names \['w'\], which this run does not return"),
             ([good], r"out has 1 arrays for 2 outputs"),
             (good, r"out must be \{output name: array\}")]
    with Session(_model(), storage="buffer") as s:
        for out, match in cases:
            sentinel = [a.copy() for a in (out.values() if isinstance(out, dict) else [])
                        if isinstance(a, np.ndarray)]
            with pytest.raises(InputError, match=match):
                s.run(None, {"x": x}, out=out)
            after = [a for a in (out.values() if isinstance(out, dict) else []) if isinstance(a, np.ndarray)]
            assert all(np.array_equal(a, b) for a, b in zip(after, sentinel))    # nothing was written
        y, z = s.run(None, {"x": x})
        np.testing.assert_allclose(y, _ref(x)[0], rtol=1e-5, atol=1e-6)
        oz = np.empty((3, 40), np.float32)
        assert s.run(["z"], {"x": x}, out={"z": oz})[0] is oz and oz.tobytes() == z.tobytes()
