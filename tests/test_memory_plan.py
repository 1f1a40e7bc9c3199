"""The memory plan: tensors alive at the same time never share bytes; dead ones are reused."""
import itertools
import random

from minirt.planner.memory_plan import assign_offsets


def _check(items, offsets, align):
    for (k1, s1, _, f1, l1), (k2, s2, _, f2, l2) in itertools.combinations(items, 2):
        if not (l1 < f2 or l2 < f1):      # alive together
            a, b = offsets[k1], offsets[k2]
            assert a + s1 <= b or b + s2 <= a, f"{k1} and {k2} overlap while both alive"
    assert all(o % align == 0 for o in offsets.values())


def test_chain_reuses_memory():
    # a -> b -> c -> d: each tensor dies when the next is made, so two buffers suffice
    items = [(n, 1000, 16, i, i + 1) for i, n in enumerate("abcd")]
    offsets, total = assign_offsets(items, 16)
    _check(items, offsets, 16)
    assert total <= 2 * 1008


def test_random_lifetimes_never_overlap():
    rng = random.Random(7)
    for _ in range(50):
        items = []
        for i in range(30):
            f = rng.randrange(-1, 40)
            items.append((f"t{i}", rng.randrange(1, 5000), rng.choice([16, 64, 256]), f, f + rng.randrange(0, 10)))
        offsets, total = assign_offsets(items, 16)
        _check(items, offsets, 16)
        for k, s, a, _, _ in items:
            assert offsets[k] % a == 0
            assert offsets[k] + s <= total
        assert total < sum(s + 256 for _, s, _, _, _ in items)


def test_deterministic():
    items = [(f"t{i}", (i * 37) % 11 + 1, 16, i % 5, i % 5 + 2) for i in range(20)]
    assert assign_offsets(items) == assign_offsets(list(items))


def test_memory_reuse_off_gives_every_tensor_its_own_bytes():
    """Session option memory_reuse=False (to rule aliasing out when chasing a wrong result): the plan keeps every
    activation alive for the whole run, so no two share bytes, and the result is the same as with reuse."""
    import numpy as np
    from onnx import helper
    from minirt import Session
    from oracle import make_model, onnxruntime_run, rand
    n = helper.make_node
    model = make_model([n("Relu", ["x"], ["a"]), n("Sigmoid", ["a"], ["b"]), n("Neg", ["b"], ["c"]),
                        n("Exp", ["c"], ["y"])], {"x": (3, 64)}, ["y"])
    x = rand(3, 64, seed=11)
    ref = onnxruntime_run(model, {"x": x})[0]
    bytes_ = {}
    for reuse in (True, False):
        with Session(model, storage="buffer", options={"poison": True, "memory_reuse": reuse}) as s:
            plan, ex = s.plan, next(iter(s._execs.values()))
            y = s.run(x)
            np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-6)
            spans = sorted(ex.res.ranges[t] for t in plan.lifetimes if t in ex.res.ranges)
            overlaps = any(b[0] < a[1] for a, b in zip(spans, spans[1:]))
            assert overlaps == reuse, (reuse, spans)     # the chain reuses bytes; without reuse nothing overlaps
            bytes_[reuse] = ex.res.arena_bytes
    assert bytes_[False] > bytes_[True]
