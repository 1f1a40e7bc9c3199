"""The memory plan: tensors alive at the same time never share bytes; dead ones are reused. The barriers between
dispatches that touch the same bytes. Both the same as a plain quadratic reference, in seconds at 20,000 tensors.
The device's memory: a plan that cannot fit is refused before anything is allocated."""
import dataclasses
import itertools
import random
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper

from minirt import Session, UnsupportedError
from minirt.device_profile import KNOWN_PROFILES
from minirt.infer import prepare
from minirt.loaders import load
from minirt.planner import make_plan
from minirt.planner.memory_plan import assign_offsets, memory_needs
from minirt.vk.recorder import barrier_points
from oracle import make_model


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


# -- the same offsets and barriers as the quadratic reference ------------------------------------------------------

def _greedy(items, alignment=256):
    """The memory plan's definition, one tensor at a time against every tensor placed before it (quadratic)."""
    placed, offsets = [], {}
    for i in sorted(range(len(items)), key=lambda i: (-items[i][1], i)):
        key, size, align, first, last = items[i]
        align = max(align, alignment)
        busy = sorted((o, e) for o, e, f, l in placed if not (l < first or last < f))
        off = 0
        for o, e in busy:
            if off + size <= o:
                break
            off = max(off, -(-e // align) * align)
        offsets[key] = off
        placed.append((off, off + size, first, last))
    return offsets, max((e for _, e, _, _ in placed), default=0)


def _barriers(accesses):
    """Barrier placement by its definition: each range against every range since the last barrier (quadratic)."""
    def overlap(a, b):
        return any(s < e2 and s2 < e for s, e in a for s2, e2 in b)
    out, written, read = [], [], []
    for i, (r, w) in enumerate(accesses):
        if overlap(r, written) or overlap(w, written) or overlap(w, read):
            out.append(i)
            written, read = [], []
        written += w
        read += r
    return out


lifetime = st.tuples(st.integers(-1, 30), st.integers(0, 30)).map(lambda t: (t[0], t[0] + t[1]))
items = st.lists(st.tuples(st.one_of(st.integers(1, 70), st.sampled_from([16, 32, 256, 1000]), st.integers(1, 5000)),
                           st.sampled_from([1, 4, 16, 64, 256]), lifetime), max_size=40).map(
    lambda xs: [(f"t{i}", size, align, f, l) for i, (size, align, (f, l)) in enumerate(xs)])


@settings(max_examples=400, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(items=items, alignment=st.sampled_from([1, 16, 256]))
def test_offsets_are_the_greedy_references(items, alignment):
    assert assign_offsets(items, alignment) == _greedy(items, alignment)


@pytest.mark.parametrize("seed", range(6))
def test_offsets_are_the_greedy_references_at_scale(seed):
    """Hundreds of tensors: runs of them alive together until one reader (as a Gather's copies before their Concat),
    chains reusing a few slots, long-lived ones across both; several alignments. Enough for each of the two indexes
    to run out of steps and hand over to the other."""
    rng = random.Random(seed)
    its, t = [], 0
    for _ in range(12):
        if rng.random() < 0.5:
            n, end = rng.randrange(5, 60), t + rng.randrange(60, 90)
            its += [(rng.choice([8, 8, 12, 24]), rng.choice([16, 64]), t + k, end + rng.randrange(0, 3)) for k in range(n)]
        else:
            n = rng.randrange(5, 40)
            its += [(rng.choice([512, 1024, 4000]), 16, t + k, t + k + rng.choice([1, 1, 2, 9])) for k in range(n)]
        t += rng.randrange(20, 80)
    its += [(rng.randrange(1, 3000), 256, rng.randrange(0, t), t + 5) for _ in range(10)]
    rng.shuffle(its)
    its = [(f"t{i}", *it) for i, it in enumerate(its)]
    for alignment in (16, 256):
        assert assign_offsets(its, alignment) == _greedy(its, alignment)


def test_tensors_of_no_bytes_overlap_nothing():
    its = [("a", 64, 16, 0, 3), ("e", 0, 16, 1, 2), ("b", 64, 16, 2, 5)]
    assert assign_offsets(its, 16) == ({"a": 0, "b": 64, "e": 0}, 128)
    with pytest.raises(ValueError, match="'r'"):
        assign_offsets([("r", 4, 16, 3, 1)])            # a lifetime that ends before it starts


byte_range = st.tuples(st.integers(0, 60), st.sampled_from([0, 1, 2, 7, 16, 40])).map(lambda t: (t[0], t[0] + t[1]))
accesses = st.lists(st.tuples(st.lists(byte_range, max_size=4), st.lists(byte_range, max_size=3)), max_size=30)


@settings(max_examples=500, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(accesses=accesses)
def test_barriers_are_the_references(accesses):
    """Reads and writes of overlapping, touching, nested and empty ranges."""
    assert barrier_points(accesses) == _barriers(accesses)


def _shuffled_gather(n):
    idx = np.random.default_rng(0).permutation(n).astype(np.int64)
    return make_model([helper.make_node("Gather", ["x", "i"], ["y"], axis=0)], {"x": [n]}, ["y"], {"i": idx}), idx


@pytest.mark.slow
def test_a_gather_of_20000_shuffled_indices_plans_and_runs_in_seconds():
    """20,000 shuffled constant indices lower to 13,334 dispatches: 10,000 copies of runs of two, all alive until a
    tree of Concats reads them. Placing each tensor against every earlier one (memory plan) and checking each
    dispatch's ranges against every range since the last barrier made this Session take 99 s on lavapipe (2-core VM:
    50 s placing, 48 s recording); either step quadratic again would pass 30 s. 7.4 s now, 15 s on a loaded VM."""
    model, idx = _shuffled_gather(20000)
    x = np.random.default_rng(1).standard_normal(20000).astype(np.float32)
    t0 = time.perf_counter()
    with Session(model, storage="buffer") as s:
        y = s.run(x)
        assert len(s.plan.dispatches) > 13000
    elapsed = time.perf_counter() - t0
    np.testing.assert_array_equal(y, x[idx])
    assert elapsed < 30, f"{elapsed:.0f} s"


# -- what a plan needs of the device's memory -----------------------------------------------------------------------

def _expand(shape):
    """x [1] -> Expand -> y of `shape`: one output of any size from nothing."""
    return make_model([helper.make_node("Expand", ["x", "s"], ["y"])], {"x": [1]}, ["y"],
                      {"s": np.array(shape, np.int64)})


def _plan(model, profile, **options):
    return make_plan(prepare(load(model)), profile, "buffer", options)


def test_memory_needs_add_up_what_the_executor_allocates():
    """Output y of 2^18 floats (1 MiB): the arena holds it and x (4 bytes, alive with it), its readback buffer another
    copy of y."""
    p = KNOWN_PROFILES["lavapipe"]
    needs = {what: (heap, n) for what, heap, n in memory_needs(_plan(_expand([512, 512]), p), p)}
    assert needs == {"activations": ("device", (1 << 20) + 4), "input 'x' staging": ("host", 4),
                     "output 'y' readback": ("host", 1 << 20)}, needs
    with Session(_expand([512, 512]), storage="buffer") as s:
        assert next(iter(s._execs.values())).res.arena_bytes == needs["activations"][1]


def test_a_plan_beyond_a_heap_is_refused():
    """Each heap on its own (a discrete GPU: device-local memory, and host-visible memory for staging and readback),
    or one sum where one heap holds both. Unknown sizes (0, as in the fake profiles) are not checked."""
    p = KNOWN_PROFILES["nvidia-h200"]
    model = _expand([512, 512])                   # 1 MiB in the arena, 1 MiB of readback
    _plan(model, p)
    for changes, match in [(dict(device_heap=1 << 19), "'y' .* needs 1.0 MiB; .* device-local memory heap of 512.0 KiB"),
                           (dict(host_heap=1 << 19), "host-visible memory heap .* of 512.0 KiB"),
                           (dict(max_allocation=1 << 19), "maxMemoryAllocationSize"),
                           (dict(device_heap=3 << 19), None),        # fits: 1.5 MiB of device-local memory
                           (dict(device_heap=3 << 19, host_heap=3 << 19, unified_heap=True),
                            r"needs 2.0 MiB of device and host-visible memory .* more than its 1.5 MiB heap: "
                            r"activations 1.0 MiB, input 'x' staging 4 bytes, output 'y' readback 1.0 MiB; the "
                            r"largest tensors: 'y' \[512, 512\] \(output\) 1.0 MiB")]:
        q = dataclasses.replace(p, **changes)
        if match is None:
            _plan(model, q)
        else:
            with pytest.raises(UnsupportedError, match=match):
                _plan(model, q)
    # with direct I/O the output lives in host memory only: 1 MiB of each heap
    q = dataclasses.replace(p, device_heap=3 << 19, host_heap=3 << 19)
    _plan(model, q, direct_io="out")
    with pytest.raises(UnsupportedError, match="host-visible"):
        _plan(model, dataclasses.replace(q, host_heap=1 << 19), direct_io="out")


def _allocations(monkeypatch):
    """Counts vkAllocateMemory calls from here on."""
    import vulkan
    real, calls = vulkan.vkAllocateMemory, []

    def counted(*a, **kw):
        calls.append(1)
        return real(*a, **kw)
    monkeypatch.setattr(vulkan, "vkAllocateMemory", counted)
    return calls


def test_an_output_beyond_the_device_heap_is_refused_before_allocating(monkeypatch):
    """On a device whose heap is smaller than the plan (here a 1 MiB heap in the device's profile): an output too big
    for it alone, or outputs that fit alone but not with their readback copies, are refused at Session creation with
    the tensor and the sizes, before any memory is allocated and with no Vulkan object left; Sessions that fit still
    run, and a model with a symbolic dim is refused at the run whose shape does not fit, and stays usable."""
    from minirt.session import get_device
    from minirt.vk.executor import live_objects
    dev = get_device()
    monkeypatch.setattr(dev, "profile", dataclasses.replace(dev.profile, device_heap=1 << 20, host_heap=1 << 20,
                                                            unified_heap=True, max_allocation=1 << 20))
    before, calls = live_objects(), _allocations(monkeypatch)
    for storage in ("buffer", "texture"):
        with pytest.raises(UnsupportedError, match=r"tensor 'y' \[2, 512, 512\] \(output\) needs 2.0 MiB; '.*' "
                                                   r"allows at most 1.0 MiB in one allocation"):
            Session(_expand([2, 512, 512]), storage=storage)
        with pytest.raises(UnsupportedError, match=r"needs 1.\d MiB of device and host-visible memory .* more than "
                                                   r"its 1.0 MiB heap: .*output 'y' readback 640.0 KiB.*'y' \[640, 256\]"):
            Session(_expand([640, 256]), storage=storage)      # 640 KiB: in the arena and again in its readback
    assert not calls and live_objects() == before
    x = np.ones(1, np.float32)
    with Session(_expand([256, 256]), storage="buffer") as s:
        np.testing.assert_array_equal(s.run(x), np.ones((256, 256), np.float32))
    m = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": ["n"]}, ["y"])
    with Session(m, storage="buffer") as s:
        np.testing.assert_array_equal(s.run(-np.ones(1000, np.float32)), np.zeros(1000, np.float32))
        with pytest.raises(UnsupportedError, match="device and host-visible memory"):
            s.run(np.ones(100_000, np.float32))                # 400 KB in, 400 KB out, each twice
        np.testing.assert_array_equal(s.run(np.ones(1000, np.float32)), np.ones(1000, np.float32))
    assert live_objects() == before


def test_the_heap_the_device_reports_is_checked(monkeypatch):
    """An output of 2.25 GiB (a texture: 4096 x 4096 x 9 texels) on the device as it is: refused where the device
    reports a smaller heap (lavapipe: 2 GiB), without allocating."""
    from minirt.session import get_device
    from minirt.vk.executor import live_objects
    p = get_device().profile
    if not p.device_heap or p.device_heap >= 5 << 30:
        pytest.skip(f"'{p.name}' reports a heap of {p.device_heap} bytes")
    before, calls = live_objects(), _allocations(monkeypatch)
    with pytest.raises(UnsupportedError, match=r"tensor 'y' \[1, 36, 4096, 4096\] \(output\) needs 2.25 GiB"):
        Session(_expand([1, 36, 4096, 4096]), storage="texture")
    assert not calls and live_objects() == before
