"""The Session API: onnxruntime-like calls, clear input errors, usable after a failure, memory reuse."""
import numpy as np
import pytest
from onnx import helper

from minirt import InputError, MinirtError, Session
from oracle import make_model, rand


def _chain(n=6, shape=(3, 37)):
    nodes, prev = [], "x"
    for i in range(n):
        out = "y" if i == n - 1 else f"h{i}"
        nodes.append(helper.make_node("Tanh" if i % 2 else "Sigmoid", [prev], [out]))
        prev = out
    return make_model(nodes, {"x": shape}, ["y"])


def _ref(x, n=6):
    for i in range(n):
        x = np.tanh(x) if i % 2 else 1 / (1 + np.exp(-x))
    return x


@pytest.mark.parametrize("storage", ["buffer", "texture"])
def test_run_forms_and_metadata(storage):
    x = rand(3, 37)
    with Session(_chain(), storage=storage, options={"poison": True}) as s:
        assert [i.name for i in s.inputs] == ["x"] and s.inputs[0].shape == (3, 37)
        assert [o.name for o in s.outputs] == ["y"] and s.outputs[0].shape == (3, 37)
        y1 = s.run(x)
        (y2,) = s.run(None, {"x": x})
        (y3,) = s.run(["y"], {"x": x})
    ref = _ref(x.astype(np.float64))
    for y in (y1, y2, y3):
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)


def test_bad_inputs_are_clear_and_the_session_stays_usable():
    x = rand(3, 37)
    with Session(_chain()) as s:
        for bad, match in [({"nope": x}, "nope"), ({"x": x[:, :5]}, r"expects shape \[3, 37\]"),
                           ({"x": x.astype(np.float64)}, "float32"), ({"x": [1, 2]}, "numpy array"),
                           ({}, "missing")]:
            with pytest.raises(InputError, match=match):
                s.run(None, bad)
        with pytest.raises(InputError, match="not an output"):
            s.run(["zzz"], {"x": x})
        np.testing.assert_allclose(s.run(x), _ref(x.astype(np.float64)), rtol=1e-5, atol=1e-6)


def test_closed_session_refuses_to_run():
    s = Session(_chain())
    s.close()
    with pytest.raises(MinirtError, match="closed"):
        s.run(rand(3, 37))
    s.close()   # closing twice is harmless


@pytest.mark.parametrize("storage", ["buffer", "texture"])
def test_intermediates_reuse_memory(storage):
    with Session(_chain(8, (64, 64)), storage=storage) as s:
        plan = s.plan
        ex = next(iter(s._execs.values()))
        one = plan.tensors["h0"].nbytes
        # 7 intermediates + in + out, but never more than 3 alive at once
        assert ex.res.arena_bytes <= 3 * (one + 4096)
        spans = [plan.lifetimes[n] for n in plan.lifetimes]
        assert len(spans) == 9


def test_symbolic_batch_is_planned_at_run_time():
    m = _chain(2, ("batch", 5))
    with Session(m) as s:
        for b in (1, 3):
            x = rand(b, 5)
            np.testing.assert_allclose(s.run(x), _ref(x.astype(np.float64), 2), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("direct", ["0", "1", "in", "out"])
def test_direct_io_matches_staged_io(monkeypatch, direct):
    """MINIRT_DIRECT_IO=1 binds buffer inputs and outputs in host memory to the kernels (no staging copies): same
    results, including an output that is a view of an intermediate and an input read by two nodes."""
    from onnx import helper
    from oracle import check_model, make_model, rand
    monkeypatch.setenv("MINIRT_DIRECT_IO", direct)
    m = make_model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "x"], ["y"]),
                    helper.make_node("Tanh", ["x"], ["t"]), helper.make_node("Flatten", ["t"], ["z"], axis=1)],
                   {"x": [2, 3, 8]}, ["y", "z"])
    check_model(m, {"x": rand(2, 3, 8, seed=np.random.SeedSequence().entropy % 2**31)}, storages=("buffer",))
    with Session(m, storage="buffer") as s:
        assert s._execs and all(bool(ex.res.direct) == (direct != "0") for ex in s._execs.values())


def _zero_copy_model():
    return make_model([helper.make_node("Tanh", ["x"], ["t"]), helper.make_node("Mul", ["t", "x"], ["y"])],
                      {"x": [3, 50]}, ["y"])


def _zc_ref(x):
    return np.tanh(x.astype(np.float64)) * x


def _seed():
    return int(np.random.SeedSequence().entropy % 2**31)


def test_zero_copy_outputs_are_never_overwritten_while_held():
    """Buffer outputs are returned in slot arrays the GPU copied into (VK_EXT_external_memory_host): a result the
    caller still holds, or a view of it, is never reused; more held results than slots fall back to copies."""
    with Session(_zero_copy_model(), storage="buffer", options={"poison": True}) as s:
        ex = next(iter(s._execs.values()))
        if not ex.slots:
            pytest.skip("no VK_EXT_external_memory_host on this device")
        xs = [rand(3, 50, seed=_seed()) for _ in range(len(ex.slots) + 3)]
        held = [s.run(x) for x in xs]                      # every slot held, then copies
        raws = {id(raw) for sl in ex.slots for _, _, raw in sl["items"]}     # ids: a reference would hold them
        assert sum(id(y.base) in raws for y in held) == len(ex.slots)
        views = [y[1:] for y in held]
        del held                                           # only views remain: the slots stay busy
        again = s.run(rand(3, 50, seed=_seed()))
        assert id(again.base) not in raws                  # a copy
        for v, x in zip(views, xs):
            np.testing.assert_allclose(v, _zc_ref(x)[1:], rtol=1e-6, atol=1e-6)
        del views, again, v
        y = s.run(xs[0])                                   # all free again: zero copy
        assert id(y.base) in raws
        np.testing.assert_allclose(y, _zc_ref(xs[0]), rtol=1e-6, atol=1e-6)


def test_zero_copy_results_outlive_the_session():
    x = rand(3, 50, seed=_seed())
    s = Session(_zero_copy_model(), storage="buffer")
    y = s.run(x)
    s.close()                                              # frees the Vulkan memory that imported y's memory
    np.testing.assert_allclose(y, _zc_ref(x), rtol=1e-6, atol=1e-6)
    y[:] = 1.0                                             # still ordinary, writable numpy memory


def test_zero_copy_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("MINIRT_ZERO_COPY", "0")
    with Session(_zero_copy_model(), storage="buffer") as s:
        assert all(not ex.slots for ex in s._execs.values())
        x = rand(3, 50, seed=_seed())
        np.testing.assert_allclose(s.run(x), _zc_ref(x), rtol=1e-6, atol=1e-6)
