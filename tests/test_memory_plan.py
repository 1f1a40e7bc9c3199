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
