"""minirt/vk/host_copy.py: large copies and page faulting split over threads give exactly what one thread gives."""
import numpy as np
import pytest

from minirt.vk import host_copy


@pytest.mark.parametrize("n", [1, 1000, (4 << 20) // 4 - 1, (4 << 20) // 4 + 12345, 3 * (4 << 20) // 4 + 7])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_copy_is_exact(n, dtype):
    rng = np.random.default_rng(n)
    src = (rng.standard_normal(n) * 1e3).astype(dtype)
    dst = np.full(n, np.nan if dtype == np.float32 else -7, dtype)     # poisoned: an unwritten element shows
    host_copy.copy(dst, src)
    assert dst.tobytes() == src.tobytes()


def test_copy_refuses_another_dtype():
    with pytest.raises(TypeError):
        host_copy.copy(np.empty(5 << 20, np.float32), np.ones(5 << 20, np.float64))


@pytest.mark.parametrize("n", [0, 1, 4097, (4 << 20) + 4095])
def test_touch_writes_one_byte_a_page_and_the_last(n):
    b = np.full(n, 0xAB, np.uint8)
    host_copy.touch(b)
    import mmap
    want = np.full(n, 0xAB, np.uint8)
    want[::mmap.PAGESIZE] = 0
    if n:
        want[-1] = 0
    assert np.array_equal(b, want)
