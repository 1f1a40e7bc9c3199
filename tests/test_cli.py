"""The command line: help with examples, distinct exit codes, the plan table and its notes, devices."""
import numpy as np
import pytest
from click.testing import CliRunner
from onnx import helper

from minirt.cli import EXIT_MODEL, EXIT_OK, EXIT_USAGE, main
from oracle import make_model, rand

COMMANDS = ("run", "devices", "plan", "profile")


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIRT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("MINIRT_LOCAL_SIZE", raising=False)
    monkeypatch.delenv("MINIRT_NO_CONV1D_REWRITE", raising=False)


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture
def files(tmp_path):
    """A small elementwise model and its input."""
    m = make_model([helper.make_node("Tanh", ["x"], ["y"])], {"x": (3, 17)}, ["y"])
    model, x = tmp_path / "tanh.onnx", tmp_path / "x.npy"
    model.write_bytes(m.SerializeToString())
    np.save(x, rand(3, 17))
    return model, x


def conv_model(path, cout=128, k=3):
    """A 1-D conv (eligible for the conv1d rewrite when cout >= 128) followed by Relu."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1]),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    m = make_model(nodes, {"x": (1, 8, 16)}, ["y"], {"w": rand(cout, 8, k, seed=1), "b": rand(cout, seed=2)})
    path.write_bytes(m.SerializeToString())
    return path


@pytest.mark.parametrize("cmd", COMMANDS)
def test_every_command_has_help_with_an_example(cmd):
    r = invoke(cmd, "--help")
    assert r.exit_code == EXIT_OK
    assert "Example" in r.output and f"minirt {cmd}" in r.output


def test_top_level_help_documents_exit_codes():
    r = invoke("--help")
    assert r.exit_code == EXIT_OK
    for code, what in (("0", "success"), ("2", "usage"), ("3", "bad model"), ("4", "runtime"),
                       ("5", "nondeterminism")):
        assert any(line.strip().startswith(code) and what in line for line in r.output.splitlines()), code
    for cmd in COMMANDS:
        assert cmd in r.output


def test_missing_model_file_is_exit_3(files, tmp_path):
    _, x = files
    r = invoke("run", tmp_path / "nope.onnx", x)
    assert r.exit_code == EXIT_MODEL and "nope.onnx" in r.output


def test_bad_npy_is_exit_3(files, tmp_path):
    model, _ = files
    bad = tmp_path / "bad.npy"
    bad.write_bytes(b"this is not numpy")
    r = invoke("run", model, bad)
    assert r.exit_code == EXIT_MODEL and "bad.npy" in r.output


def test_wrong_input_shape_is_exit_3(files, tmp_path):
    model, _ = files
    np.save(tmp_path / "wrong.npy", rand(2, 2))
    assert invoke("run", model, tmp_path / "wrong.npy").exit_code == EXIT_MODEL


@pytest.mark.parametrize("cmd", ["run", "plan", "profile"])
@pytest.mark.parametrize("value", ["100000,1,1", "64,64,64", "abc", "0,1,1"])
def test_bad_local_size_is_a_usage_error(files, cmd, value):
    model, x = files
    args = [cmd, model] + ([x] if cmd == "run" else []) + ["--local-size", value]
    r = invoke(*args)
    assert r.exit_code == EXIT_USAGE, r.output
    assert "--local-size" in r.output


def test_bad_local_size_from_the_environment_is_a_usage_error(files, monkeypatch):
    model, x = files
    monkeypatch.setenv("MINIRT_LOCAL_SIZE", "100000")
    assert invoke("run", model, x).exit_code == EXIT_USAGE


def test_run_repeat_succeeds(files, tmp_path):
    model, x = files
    out = tmp_path / "y.npy"
    r = invoke("run", model, x, "--repeat", 3, "-o", out)
    assert r.exit_code == EXIT_OK, r.output
    assert "3 runs: 1 distinct output(s)" in r.output
    np.testing.assert_allclose(np.load(out), np.tanh(np.load(x)), rtol=1e-5, atol=1e-6)


def test_run_with_a_valid_local_size_and_no_rewrite(files):
    model, x = files
    r = invoke("run", model, x, "--local-size", "16,1,1", "--no-conv1d-rewrite", "-q")
    assert r.exit_code == EXIT_OK, r.output


def test_progress_is_quiet_when_piped(files):
    model, x = files
    r = CliRunner().invoke(main, ["run", str(model), str(x), "--repeat", "4"], catch_exceptions=False)
    assert r.exit_code == EXIT_OK
    assert "\r" not in r.output and "loading" not in r.output and "running" not in r.output


def test_plan_names_conv_kernels_and_the_rewrite(tmp_path):
    model = conv_model(tmp_path / "conv.onnx")
    r = invoke("plan", model)
    assert r.exit_code == EXIT_OK, r.output
    lines = r.output.splitlines()
    conv_line = next(ln for ln in lines if ln.startswith("conv "))
    assert "Conv" in conv_line and "im2col" in conv_line and "[1,8,1,16]" in conv_line and "[1,128,1,16]" in conv_line
    assert any("im2col_" in ln for ln in lines)                      # the im2col kernel is dispatched
    assert "conv: conv1d rewrite: yes" in r.output and "route: im2col" in r.output
    assert any(ln.startswith("relu ") for ln in lines) or "Relu 'relu'" in r.output   # own row, or fused (noted)

    r = invoke("plan", model, "--no-conv1d-rewrite")
    assert r.exit_code == EXIT_OK, r.output
    assert "conv1d rewrite: off" in r.output and "route: direct" in r.output
    assert any(ln.startswith("conv ") and "conv_" in ln and "[1,8,16]" in ln for ln in r.output.splitlines())


def test_plan_explains_why_a_conv_is_not_rewritten(tmp_path):
    r = invoke("plan", conv_model(tmp_path / "small.onnx", cout=16))
    assert r.exit_code == EXIT_OK, r.output
    assert "conv1d rewrite: no (out_channels 16 < 128)" in r.output
    assert "route: direct (" in r.output


def test_plan_with_a_symbolic_input_needs_a_shape(tmp_path):
    m = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": ("batch", 5)}, ["y"])
    (tmp_path / "dyn.onnx").write_bytes(m.SerializeToString())
    r = invoke("plan", tmp_path / "dyn.onnx")
    assert r.exit_code == EXIT_MODEL and "--shape" in r.output
    r = invoke("plan", tmp_path / "dyn.onnx", "--shape", "x=2,5")
    assert r.exit_code == EXIT_OK and "[2,5]" in r.output
    assert invoke("plan", tmp_path / "dyn.onnx", "--shape", "x=two").exit_code == EXIT_USAGE


def test_profile_quiet(files):
    model, x = files
    r = invoke("profile", model, x, "--runs", 2, "--warmup", 1, "--quiet")
    assert r.exit_code == EXIT_OK, r.output
    assert "by kernel" in r.output


def test_devices_lists_every_device():
    from minirt.vk.device import physical_devices
    names = [p.name for _, _, p in physical_devices()]
    r = invoke("devices")
    assert r.exit_code == EXIT_OK
    assert all(n in r.output for n in names)     # lavapipe in CI, the GPU on a GPU host
    assert r.output.count("*") >= 1


def test_a_device_by_uuid(files):
    """`minirt devices` shows each device's UUID; --device takes it (with GPU-, or a leading part); a UUID of no
    device is a usage error that lists the UUIDs there are, as is a --device that is neither index nor UUID."""
    from minirt.vk.device import physical_devices
    model, x = files
    uuids = [p.uuid for _, _, p in physical_devices() if p.uuid]
    if not uuids:
        pytest.skip("no device reports a UUID")
    r = invoke("devices")
    assert all(f"uuid: {u}" in r.output for u in uuids)
    for spec in (uuids[0], "GPU-" + uuids[0][:8]):
        r = invoke("run", model, x, "--device", spec, "-q")
        assert r.exit_code == EXIT_OK, r.output
    other = "GPU-" + ("e" if uuids[0][0] == "f" else "f") * 32
    r = invoke("run", model, x, "--device", other)
    assert r.exit_code == EXIT_USAGE and "--device" in r.output and "matches no Vulkan device" in r.output
    assert all(u in r.output for u in uuids)
    r = invoke("plan", model, "--device", "GPU-xyz")
    assert r.exit_code == EXIT_USAGE and "is not a device index or UUID" in r.output


def test_run_a_text_model_from_an_npz(tmp_path):
    """A model with several inputs (token ids and a mask, int64) takes them as one .npz, an array per input name; the
    first output equals onnxruntime's; a wrong archive names the missing input and the stray array."""
    import onnx
    from pathlib import Path
    from oracle import cosine, onnxruntime_run
    model = Path(__file__).resolve().parents[1] / "models" / "families" / "bert.onnx"
    rng = np.random.default_rng(21)
    feeds = {"input_ids": rng.integers(0, 900, (2, 16)).astype(np.int64), "attention_mask": np.ones((2, 16), np.int64)}
    feeds["attention_mask"][1, 11:] = 0
    np.savez(tmp_path / "feeds.npz", **feeds)
    r = invoke("run", model, tmp_path / "feeds.npz", "--repeat", 2, "-o", tmp_path / "y.npy")
    assert r.exit_code == EXIT_OK, r.output
    ref = onnxruntime_run(onnx.load(model), feeds)[0]
    y = np.load(tmp_path / "y.npy")
    assert y.shape == ref.shape and cosine(y, ref) >= 0.99999
    np.savez(tmp_path / "bad.npz", input_ids=feeds["input_ids"], mask=feeds["attention_mask"])
    r = invoke("run", model, tmp_path / "bad.npz")
    assert r.exit_code == EXIT_MODEL
    assert "no array for input(s) attention_mask" in r.output and "mask name no input" in r.output
    r = invoke("run", model, tmp_path / "y.npy")
    assert r.exit_code == EXIT_MODEL and "give them as one .npz" in r.output
