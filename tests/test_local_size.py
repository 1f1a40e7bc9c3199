"""Tests for the local-size rules (minirt.kernels.local_size, the family table minirt.kernels.rules and the GEMM
family's rules in minirt.kernels.gemm) and minirt.device_profile (no GPU needed)."""
import dataclasses
import itertools
import math
import subprocess
import sys
from pathlib import Path

import pytest

from minirt.device_profile import KNOWN_PROFILES, DeviceProfile, classify_vendor
from minirt.kernels import gemm
from minirt.kernels.local_size import FAMILIES, check_local_size, wave_places
from minirt.kernels.rules import RULES, describe_rule, pick_local_size

# Extra fakes with odd, small limits so clamping is exercised too.
ODD_PROFILES = {
    "odd-limits": DeviceProfile(name="odd-limits", max_invocations=40,
                                max_local_size=(48, 3, 1), subgroup_size=4),
    "adreno-tiny": DeviceProfile(name="adreno-tiny", vendor="adreno", max_invocations=32,
                                 max_local_size=(8, 8, 1), subgroup_size=64),
}
PROFILES = {**KNOWN_PROFILES, **ODD_PROFILES}

EXTENTS = (0, 1, 2, 3, 5, 8, 17, 64, 100, 1000, 10**7)
GLOBALS = list(itertools.product(EXTENTS, repeat=3))
ORDERINGS = sorted(set(itertools.permutations((2, 100, 50))))  # all 6
DEFAULT_FAMILIES = ("elementwise", "copy", "conv")


def assert_within(local, p):
    assert isinstance(local, tuple) and len(local) == 3
    assert all(type(n) is int and n >= 1 for n in local), local
    assert all(n <= cap for n, cap in zip(local, p.max_local_size)), (local, p.name)
    assert math.prod(local) <= p.max_invocations, (local, p.name)


@pytest.mark.parametrize("pname", PROFILES)
@pytest.mark.parametrize("family", FAMILIES)
def test_limits_and_determinism(pname, family):
    p = PROFILES[pname]
    first = {g: pick_local_size(family, g, p) for g in GLOBALS}
    for g, local in first.items():
        assert_within(local, p)
        if 0 in g:
            assert local == (1, 1, 1)
    # Same answers when called again in reverse order.
    assert {g: pick_local_size(family, g, p) for g in reversed(GLOBALS)} == first


@pytest.mark.parametrize("g", GLOBALS[::7] + ORDERINGS)
def test_adreno_gemm_always_16x4(g):
    p = KNOWN_PROFILES["adreno-840"]
    local = pick_local_size("gemm", g, p)
    assert local == ((1, 1, 1) if 0 in g else (16, 4, 1))
    assert "16x4x1" in describe_rule("gemm", p)


@pytest.mark.parametrize("pname", [k for k, p in PROFILES.items() if p.vendor == "adreno"])
def test_adreno_gemm_and_im2col_never_bad_shapes(pname):
    p = PROFILES[pname]
    for family in ("gemm", "im2col"):
        for g in GLOBALS:
            assert pick_local_size(family, g, p) not in ((8, 8, 1), (4, 16, 1)), (family, g)


@pytest.mark.parametrize("pname", PROFILES)
@pytest.mark.parametrize("family", DEFAULT_FAMILIES)
def test_default_axes_map_to_their_own_axis(pname, family):
    p = PROFILES[pname]
    for g in GLOBALS + ORDERINGS:
        if 0 in g:
            continue
        local = pick_local_size(family, g, p)
        for i, j in itertools.permutations(range(3), 2):
            # A larger axis never gets less, unless the device caps it.
            if g[i] > g[j] and local[i] < p.max_local_size[i] // 2:
                assert local[i] >= local[j], (g, local)
        for i in range(3):
            if g[i] == 1:
                assert local[i] == 1, (g, local)
            # Never more than the extent rounded up to a power of two.
            assert local[i] <= max(1, 1 << (g[i] - 1).bit_length()), (g, local)


@pytest.mark.parametrize("family", DEFAULT_FAMILIES)
def test_default_three_cycle_orderings(family):
    # ExecuTorch maps (2,100,50) -> (4,2,8); each size must stay on its own axis.
    p = KNOWN_PROFILES["nvidia-h200"]
    expected = {(2, 100, 50): (2, 8, 4), (50, 2, 100): (4, 2, 8), (100, 50, 2): (8, 4, 2),
                (2, 50, 100): (2, 4, 8), (100, 2, 50): (8, 2, 4), (50, 100, 2): (4, 8, 2)}
    assert {g: pick_local_size(family, g, p) for g in ORDERINGS} == expected


@pytest.mark.parametrize("pname", PROFILES)
def test_gemm_and_im2col_shapes(pname):
    p = PROFILES[pname]
    for g in GLOBALS:
        if 0 in g:
            continue
        for family in ("gemm", "im2col"):
            local = pick_local_size(family, g, p)
            assert local[2] == 1  # batches go to the group count
            if p.vendor != "adreno" or family == "im2col":
                assert all(local[i] == 1 for i in (0, 1) if g[i] == 1), (family, g, local)
    if p is KNOWN_PROFILES.get(pname) and p.vendor in ("nvidia", "amd"):
        # Without a multiprocessor count: 256-invocation groups on desktop GPUs when there are at least 256 of
        # them, else 128 while those make 256, else 64
        p = dataclasses.replace(p, compute_units=0)
        assert pick_local_size("gemm", (512, 512, 1), p) == (16, 16, 1)
        assert pick_local_size("gemm", (96, 375, 1), p) == (16, 8, 1)      # Whisper's 1500 x 384 GEMMs
        assert pick_local_size("gemm", (40, 40, 1), p) == (8, 8, 1)
        assert pick_local_size("gemm", (384, 188, 1), p) == (16, 16, 1)    # and its 1500 x 1536 one
        assert pick_local_size("gemm", (2048, 1, 1), p) == (64, 1, 1)
        assert pick_local_size("gemm", (65536, 1, 1), p) == (256, 1, 1)
    elif p is KNOWN_PROFILES.get(pname) and p.vendor != "adreno":
        assert pick_local_size("gemm", (512, 512, 1), p) == (8, 8, 1)
        assert pick_local_size("gemm", (2048, 1, 1), p) == (64, 1, 1)
        assert pick_local_size("gemm", (4096, 3, 8), p) == (16, 4, 1)
    p = PROFILES[pname]
    if p is KNOWN_PROFILES.get(pname) and p.vendor != "adreno":
        # desktop GPUs: 4 x 16 (runs of consecutive positions); the others as ExecuTorch
        want = (4, 16, 1) if p.vendor in ("nvidia", "amd") else (16, 4, 1)
        assert pick_local_size("im2col", (4096, 300, 1), p) == want
        assert pick_local_size("im2col", (1, 300, 1), p) == (1, 64, 1)


def test_gemm_by_waves_with_a_multiprocessor_count():
    """The H200 profile (132 SMs): the shape with the fewest waves x (x + y); small GEMMs as without a count."""
    p = KNOWN_PROFILES["nvidia-h200"]
    assert pick_local_size("gemm", (96, 375, 1), p) == (24, 12, 1)     # 1500 x 384: 4 x 32 = 128 groups, one wave
    assert pick_local_size("gemm", (384, 375, 1), p) == (24, 16, 1)    # 1500 x 1536: 16 x 24 = 384, three waves
    assert pick_local_size("gemm", (96, 750, 1), p) == (24, 12, 1)     # 3000 x 384 (conv1): 252, two waves
    assert pick_local_size("gemm", (40, 40, 1), p) == (16, 8, 1)       # one wave each: the smallest x + y first
    assert pick_local_size("gemm", (20, 40, 1), p) == (8, 8, 1)        # narrower than 24: the old rule
    for g in ((96, 375, 1), (384, 375, 1), (288, 375, 1), (1000, 1000, 1), (24, 16, 1), (500, 17, 1)):
        x, y, _ = pick_local_size("gemm", g, p)
        groups = -(-g[0] // x) * -(-g[1] // y)
        cost = -(-groups // 132) * (x + y)
        assert all(cost <= -(-(-(-g[0] // a) * -(-g[1] // b)) // 132) * (a + b) for a, b in gemm.WAVE_SHAPES)
    small = dataclasses.replace(p, max_invocations=256, max_local_size=(256, 256, 64))
    assert pick_local_size("gemm", (96, 375, 1), small) in ((16, 16, 1), (16, 8, 1), (16, 12, 1))   # 288, 384 don't fit
    assert "fewest waves" in describe_rule("gemm", p)


def test_gemm_waves_count_the_groups_a_multiprocessor_holds():
    """With the kernel's shared memory declared (glsl/linear.comp, 32-deep slices: 512 bytes per local x and per y),
    a wave is the groups that fit at once: 48 KiB a multiprocessor on the H200 holds 4 groups of 16 x 8 (12 KiB),
    3 of 16 x 12 or 16 x 16 (14, 16 KiB), 2 of 24 x 12 or 24 x 16 (18, 20 KiB)."""
    p, sxy = KNOWN_PROFILES["nvidia-h200"], (512, 512)
    assert [wave_places(s, p, sxy) for s in ((16, 8), (16, 12), (16, 16), (24, 12), (24, 16))] == \
        [528, 396, 396, 264, 264]
    assert wave_places((16, 8), p) == 132                               # undeclared: one a multiprocessor
    assert pick_local_size("gemm", (96, 750, 1), p, None, sxy) == (16, 12, 1)   # conv1: 378 groups, one wave
    assert pick_local_size("gemm", (288, 375, 1), p, None, sxy) == (16, 8, 1)   # QKV: 846 in 2 waves of 528
    assert pick_local_size("gemm", (384, 375, 1), p, None, sxy) == (16, 12, 1)  # fc1: 768 in 2 waves of 396
    for g in ((96, 375, 1), (384, 375, 1), (288, 375, 1), (1000, 1000, 1), (512, 375, 1)):
        x, y, _ = pick_local_size("gemm", g, p, None, sxy)
        cost = -(-(-(-g[0] // x) * -(-g[1] // y)) // wave_places((x, y), p, sxy)) * (x + y)
        assert all(cost <= -(-(-(-g[0] // a) * -(-g[1] // b)) // wave_places((a, b), p, sxy)) * (a + b)
                   for a, b in gemm.WAVE_SHAPES)
    # K-split GEMMs: the shape whose splits fill the most of a wave; none where no shape splits
    assert gemm.gemm_split_shape((96, 375, 1), p, sxy, 48, 8, 4) == ((16, 12, 1), 2)     # 384 of 396 places
    assert gemm.gemm_split_shape((288, 375, 1), p, sxy, 48, 8, 4) is None               # every shape fills a wave
    assert gemm.gemm_split_shape((96, 375, 1), p, sxy, 12, 8, 4) is None                # K too short to split
    assert gemm.gemm_split_shape((96, 375, 1), dataclasses.replace(p, compute_units=0), sxy, 48, 8, 4) is None


@pytest.mark.parametrize("pname", PROFILES)
def test_reduction_follows_global_x(pname):
    p = PROFILES[pname]
    cap = min(p.max_local_size[0], p.max_invocations)
    for threads in (1, 2, 32, 64, 128, 256, 512, 1024, 4096):
        local = pick_local_size("reduction", (threads, 37, 1), p)
        expected = min(threads, 1 << (cap.bit_length() - 1))
        assert local == (expected, 1, 1)
    # Not a power of two: the largest power of two below it.
    assert pick_local_size("reduction", (100, 1, 1), p)[0] == min(64, 1 << (cap.bit_length() - 1))
    assert "gl_WorkGroupSize.x" in describe_rule("reduction", p)


@pytest.mark.parametrize("family", ["coopmat", "attention"])
@pytest.mark.parametrize("pname", PROFILES)
def test_coopmat_and_attention_take_global_x_exactly(pname, family):
    """Cooperative-matrix and flash-attention kernels size their tiles from the thread count: the local x is exactly
    the global x the dispatcher asked for (not rounded to a power of two), y and z are 1."""
    p = PROFILES[pname]
    fits = min(p.max_local_size[0], p.max_invocations)
    for threads in (1, 3, 32, 96, 112, 128, 192, 256, 1024):
        local = pick_local_size(family, (threads, 47, 6), p)
        if threads <= fits:
            assert local == (threads, 1, 1)
        assert_within(local, p)
    assert describe_rule(family, p).startswith(family) and "never forced" in describe_rule(family, p)


def test_forced():
    p = KNOWN_PROFILES["adreno-840"]
    assert pick_local_size("gemm", (64, 64, 1), p, forced=(8, 8, 1)) == (8, 8, 1)  # override wins
    assert pick_local_size("copy", (0, 0, 0), p, forced=[32, 2, 1]) == (32, 2, 1)
    with pytest.raises(ValueError, match=r"max_local_size.*Adreno \(TM\) 840"):
        pick_local_size("gemm", (64, 64, 1), p, forced=(1, 1, 128))
    with pytest.raises(ValueError, match=r"max_invocations.*Adreno \(TM\) 840"):
        pick_local_size("gemm", (64, 64, 1), p, forced=(64, 32, 1))
    for bad in ((0, 4, 1), (16, 4), (16.0, 4, 1), (True, 4, 1), "abc", 64):
        with pytest.raises(ValueError, match="local size"):
            pick_local_size("gemm", (64, 64, 1), p, forced=bad)
    tiny = KNOWN_PROFILES["tiny-limits"]
    assert check_local_size((128, 1, 1), tiny) == (128, 1, 1)
    with pytest.raises(ValueError, match=r"maxComputeWorkGroupInvocations=128.*tiny-limits"):
        check_local_size((64, 4, 1), tiny)


def test_bad_arguments():
    p = KNOWN_PROFILES["nvidia-h200"]
    with pytest.raises(ValueError, match="'softmaxx'"):
        pick_local_size("softmaxx", (1, 1, 1), p)
    with pytest.raises(ValueError, match="'softmaxx'"):
        describe_rule("softmaxx", p)
    for bad in ((-1, 1, 1), (1, 1), (1.5, 1, 1), None):
        with pytest.raises(ValueError, match="global size"):
            pick_local_size("copy", bad, p)


def test_describe_rule_every_family():
    for p in PROFILES.values():
        for family in FAMILIES:
            text = describe_rule(family, p)
            assert isinstance(text, str) and text.startswith(family)


@pytest.mark.parametrize("name, vendor_id, expected", [
    ("Adreno (TM) 840", 0x5143, "adreno"),
    ("Mali-G715", 0x13B5, "mali"),
    ("NVIDIA H200", 0x10DE, "nvidia"),
    ("llvmpipe (LLVM 15.0.6, 256 bits)", 0x10005, "llvmpipe"),
    ("AMD Radeon RX 7900", 0x1002, "amd"),
    ("Intel(R) Arc(tm)", 0x8086, "intel"),
    ("PowerVR D-Series DXT-48-1536", 0x1010, "powervr"),
])
def test_classify_vendor(name, vendor_id, expected):
    assert classify_vendor(vendor_id, name) == expected
    assert classify_vendor(0, name) == expected  # by name alone


def test_classify_vendor_fallbacks():
    assert classify_vendor(0, "Immortalis-G720") == "mali"
    assert classify_vendor(0x10005, "zink Vulkan 1.3") == "other"
    assert classify_vendor(0x5143, "Turnip Adreno (TM) 740") == "adreno"
    assert classify_vendor(0xABCD, "Some Accelerator") == "other"


def test_profiles():
    assert [k for k, p in KNOWN_PROFILES.items() if p.tuning.storage == "texture"] == ["adreno-840", "mali-g715", "powervr"]
    for p in KNOWN_PROFILES.values():
        assert classify_vendor(p.vendor_id, p.name) == p.vendor
    with pytest.raises(ValueError, match="vendor"):
        DeviceProfile(vendor="qualcomm")
    with pytest.raises(Exception):
        KNOWN_PROFILES["powervr"].subgroup_size = 64  # frozen


def test_no_vulkan_import():
    root = Path(__file__).resolve().parent.parent
    code = ("import sys, minirt.kernels.rules, minirt.device_profile; "
            "sys.exit('vulkan' in sys.modules)")
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True)


def test_attention_combine_shape_on_nvidia_only():
    """The combine pass: a head's vec4 columns by rows up to 256 invocations on NVIDIA (measured on an H200);
    everywhere else (and for head widths that do not divide 256) the elementwise rule decides."""
    from minirt.kernels.attention_split import head_rows_shape
    h200 = KNOWN_PROFILES["nvidia-h200"]
    assert head_rows_shape(16, h200) == (16, 16, 1)
    assert head_rows_shape(32, h200) == (32, 8, 1)
    assert head_rows_shape(24, h200) is None
    for name in ("lavapipe", "adreno-840", "mali-g715"):
        assert head_rows_shape(16, KNOWN_PROFILES[name]) is None


@pytest.mark.parametrize("pname", PROFILES)
def test_gemm_groups_fit_shared_memory(pname):
    """A GEMM's group never declares more shared memory than the device has (a 1-row GEMM over a vocabulary-wide
    output grew to 256 x 1 on an H200, 131 KiB of a 48 KiB limit, and lost the device); a forced size over it is an
    error that names the limit."""
    from minirt.kernels.gemm import LINEAR_TILES, linear_shared_xy
    p = PROFILES[pname]
    for tile in LINEAR_TILES:
        sxy = linear_shared_xy(tile)
        for g in [(12967, 1, 1), (12967, 2, 1), (1, 12967, 1), (96, 375, 1), (10**7, 3, 1)] + GLOBALS[::97]:
            loc = pick_local_size("gemm", g, p, shared_xy=sxy)
            assert_within(loc, p)
            if 0 not in g:
                assert sxy[0] * loc[0] + sxy[1] * loc[1] <= p.max_shared_memory, (g, loc, tile)
    h200 = KNOWN_PROFILES["nvidia-h200"]
    with pytest.raises(ValueError, match=r"shared memory, 131584 bytes, exceeds maxComputeSharedMemorySize=49152"):
        pick_local_size("gemm", (12967, 1, 1), h200, forced=(256, 1, 1), shared_xy=linear_shared_xy("t44k32"))


def test_one_rule_per_family():
    """The planner's table names a rule for every family a dispatch may declare, and nothing else."""
    assert set(RULES) == set(FAMILIES)
