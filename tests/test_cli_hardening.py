"""The command line under bad input and failing writes: bad output paths and MINIRT_* variables are usage errors found
before any run, outputs are written whole or not at all at exactly the path given, `--repeat` holds one output, and
every error is one line with the documented exit code, never a traceback."""
import errno
import json
import os
import subprocess
import sys
import weakref

import numpy as np
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

from minirt.cli import EXIT_MODEL, EXIT_NONDETERMINISTIC, EXIT_OK, EXIT_RUNTIME, EXIT_USAGE, _deviation, main
from oracle import make_model, rand

OPTION_VARS = ("MINIRT_LOCAL_SIZE", "MINIRT_NO_CONV1D_REWRITE", "MINIRT_DIRECT_IO", "MINIRT_ZERO_COPY",
               "MINIRT_TIMEOUT_S", "MINIRT_SPIN_MS", "MINIRT_DEVICE")


@pytest.fixture(autouse=True)
def _clean_env(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIRT_CACHE_DIR", str(tmp_path / "cache"))
    for var in OPTION_VARS:
        monkeypatch.delenv(var, raising=False)


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def error_lines(r):
    return [ln for ln in r.output.splitlines() if ln.lower().startswith("error")]


@pytest.fixture
def files(tmp_path):
    """A small elementwise model and its input, in their own folder."""
    d = tmp_path / "in"
    d.mkdir()
    m = make_model([helper.make_node("Tanh", ["x"], ["y"])], {"x": (3, 17)}, ["y"])
    model, x = d / "tanh.onnx", d / "x.npy"
    model.write_bytes(m.SerializeToString())
    np.save(x, rand(3, 17))
    return model, x


@pytest.fixture
def no_session(monkeypatch):
    """Fail the test if a Session is created: what it checks must be found before any work."""
    from minirt.session import Session

    def refuse(self, *a, **k):
        pytest.fail("a Session was created before the bad argument was reported")
    monkeypatch.setattr(Session, "__init__", refuse)


def tree(folder):
    return sorted(p.name for p in folder.iterdir())


# -- output paths: checked before any run ----------------------------------------------------------------------------

BAD_PATHS = ("no/such/dir/o.npy", "x.npy/o.npy", "sub/")     # a missing folder, a file as folder, a folder


@pytest.mark.parametrize("bad", BAD_PATHS)
@pytest.mark.parametrize("cmd,flag", [("run", "-o"), ("profile", "--json"), ("profile", "--csv"),
                                      ("profile", "--trace")])
def test_a_bad_output_path_is_a_usage_error_before_any_run(files, tmp_path, monkeypatch, no_session, cmd, flag, bad):
    model, x = files
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    if bad.startswith("x.npy/"):
        bad = os.path.relpath(x, tmp_path) + "/o.npy"
    r = invoke(cmd, model, x, flag, bad)
    assert r.exit_code == EXIT_USAGE, r.output
    assert "Traceback" not in r.output
    (line,) = error_lines(r)
    assert repr(bad) in line and flag in line


def test_an_output_folder_that_takes_no_file_is_a_usage_error(files, tmp_path, monkeypatch, no_session):
    """A read-only folder (made to refuse here through mkstemp: root may write anywhere)."""
    import tempfile
    model, x = files

    def refuse(*a, **k):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    r = invoke("run", model, x, "-o", tmp_path / "y.npy")
    assert r.exit_code == EXIT_USAGE, r.output
    (line,) = error_lines(r)
    assert "-o" in line and os.strerror(errno.EACCES) in line and str(tmp_path) in line


def test_profile_outputs_naming_one_file_twice_is_a_usage_error(files, tmp_path, no_session):
    model, x = files
    out = tmp_path / "p.json"
    r = invoke("profile", model, x, "--json", out, "--trace", out)
    assert r.exit_code == EXIT_USAGE, r.output
    (line,) = error_lines(r)
    assert "--trace" in line and "--json" in line


# -- outputs: exactly the path given, whole or not at all ------------------------------------------------------------

def test_output_is_written_at_exactly_the_path_given(files, tmp_path):
    model, x = files
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "result.bin"
    r = invoke("run", model, x, "-o", out)
    assert r.exit_code == EXIT_OK, r.output
    assert tree(out_dir) == ["result.bin"]       # no result.bin.npy, no temporary left
    assert f"wrote    {out}" in r.output
    np.testing.assert_allclose(np.load(out), np.tanh(np.load(x)), rtol=1e-5, atol=1e-6)
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask      # as a plain open() makes it, not mkstemp's 0600


def test_output_to_a_device_is_written_in_place(files):
    model, x = files
    r = invoke("run", model, x, "-o", os.devnull)
    assert r.exit_code == EXIT_OK, r.output
    assert not os.path.isfile(os.devnull)         # still the device, not a file renamed over it
    assert not os.path.exists(os.devnull + ".npy")


def _fail_after_some_bytes(target, *a, **k):
    """np.save that writes part of the file, then finds the disk full."""
    if isinstance(target, (str, os.PathLike)):
        target = open(target, "wb")
    target.write(b"\x93NUMPY partial")
    target.flush()
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("existing", [False, True])
def test_a_failed_output_write_leaves_no_partial_file(files, tmp_path, monkeypatch, existing):
    model, x = files
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "y.npy"
    if existing:
        np.save(out, np.arange(4.0))
    monkeypatch.setattr(np, "save", _fail_after_some_bytes)
    r = invoke("run", model, x, "-o", out)
    assert r.exit_code == EXIT_RUNTIME, r.output
    assert "Traceback" not in r.output
    (line,) = error_lines(r)
    assert str(out) in line and os.strerror(errno.ENOSPC) in line
    if existing:
        assert tree(out_dir) == ["y.npy"]
        np.testing.assert_array_equal(np.load(out), np.arange(4.0))     # the old file, whole
    else:
        assert tree(out_dir) == []


def test_profile_writes_whole_files_or_none(files, tmp_path, monkeypatch):
    model, x = files
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    js, trace = out_dir / "p.json", out_dir / "t.json"
    r = invoke("profile", model, x, "--runs", 1, "--warmup", 0, "-q", "--json", js, "--trace", trace)
    assert r.exit_code == EXIT_OK, r.output
    assert tree(out_dir) == ["p.json", "t.json"]
    assert "dispatches" in json.loads(js.read_text()) and "traceEvents" in json.loads(trace.read_text())

    real_replace = os.replace

    def full_disk(src, dst):
        if os.path.dirname(os.fspath(dst)) == os.path.realpath(out_dir):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_replace(src, dst)
    before = js.read_bytes()
    monkeypatch.setattr(os, "replace", full_disk)
    r = invoke("profile", model, x, "--runs", 1, "--warmup", 0, "-q", "--json", js)
    assert r.exit_code == EXIT_RUNTIME, r.output
    (line,) = error_lines(r)
    assert str(js) in line
    assert tree(out_dir) == ["p.json", "t.json"] and js.read_bytes() == before


# -- MINIRT_* variables and devices ----------------------------------------------------------------------------------

BAD_ENV = [("MINIRT_TIMEOUT_S", "abc"), ("MINIRT_TIMEOUT_S", "-1"), ("MINIRT_TIMEOUT_S", "inf"),
           ("MINIRT_SPIN_MS", "soon"), ("MINIRT_ZERO_COPY", "maybe"), ("MINIRT_DIRECT_IO", "sideways"),
           ("MINIRT_NO_CONV1D_REWRITE", "perhaps"), ("MINIRT_LOCAL_SIZE", "abc"), ("MINIRT_DEVICE", "gpu")]


@pytest.mark.parametrize("var,value", BAD_ENV)
@pytest.mark.parametrize("cmd", ["run", "plan", "profile", "devices"])
def test_a_bad_environment_variable_is_a_usage_error_naming_it(files, monkeypatch, cmd, var, value):
    model, x = files
    monkeypatch.setenv(var, value)
    args = [cmd] + ([] if cmd == "devices" else [model]) + ([x] if cmd in ("run", "profile") else [])
    r = invoke(*args)
    assert r.exit_code == EXIT_USAGE, r.output
    (line,) = error_lines(r)
    assert var in line and repr(value) in line
    assert "--option" not in line           # the variable is at fault, not an option


def test_a_device_that_is_not_there_is_a_usage_error(files, monkeypatch, no_session):
    model, x = files
    r = invoke("run", model, x, "--device", 99)
    assert r.exit_code == EXIT_USAGE, r.output
    (line,) = error_lines(r)
    assert "--device" in line and "99" in line
    monkeypatch.setenv("MINIRT_DEVICE", "99")
    for args in (["run", model, x], ["plan", model], ["devices"]):
        r = invoke(*args)
        assert r.exit_code == EXIT_USAGE, (args, r.output)
        (line,) = error_lines(r)
        assert "MINIRT_DEVICE=99" in line


def test_errors_in_a_real_process_are_one_line_without_a_traceback(files, tmp_path):
    model, x = files
    env = {k: v for k, v in os.environ.items() if k not in OPTION_VARS}
    env["MINIRT_CACHE_DIR"] = str(tmp_path / "cache")
    cases = [(["run", model, x, "-o", tmp_path / "no" / "o.npy"], {}, EXIT_USAGE),
             (["run", model, x], {"MINIRT_TIMEOUT_S": "soon"}, EXIT_USAGE),
             (["run", model, tmp_path / "missing.npy"], {}, EXIT_MODEL)]
    for args, extra, code in cases:
        p = subprocess.run([sys.executable, "-m", "minirt"] + [str(a) for a in args], env={**env, **extra},
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == code, (args, p.stderr)
        assert "Traceback" not in p.stderr
        assert len([ln for ln in p.stderr.splitlines() if ln.lower().startswith("error")]) == 1, p.stderr


# -- --repeat: memory flat, nondeterminism still found --------------------------------------------------------------

def _watch_outputs(monkeypatch, perturb=None):
    """Session.run returning fresh arrays (so their lifetime is the caller's), counting at each call how many earlier
    outputs the caller still holds."""
    from minirt.session import Session
    real, returned, held = Session.run, [], []

    def run(self, *a, **k):
        held.append(sum(r() is not None for r in returned))
        y = np.array(real(self, *a, **k))
        if perturb is not None:
            perturb(len(returned), y)
        returned.append(weakref.ref(y))
        return y
    monkeypatch.setattr(Session, "run", run)
    return held


def test_repeat_holds_one_output_not_all(files, monkeypatch):
    model, x = files
    held = _watch_outputs(monkeypatch)
    r = invoke("run", model, x, "--repeat", 8)
    assert r.exit_code == EXIT_OK, r.output
    assert "8 runs: 1 distinct output(s), max deviation 0" in r.output
    assert len(held) == 9 and max(held) <= 1, held      # the first timed output, nothing more


def test_repeat_still_finds_a_differing_run(files, monkeypatch):
    model, x = files

    def perturb(i, y):
        if i == 4:
            y.flat[5] += 0.25
    _watch_outputs(monkeypatch, perturb)
    r = invoke("run", model, x, "--repeat", 6)
    assert r.exit_code == EXIT_NONDETERMINISTIC, r.output
    assert "6 runs: 2 distinct output(s), max deviation 0.25" in r.output


def test_deviation_treats_nan_and_inf_as_values():
    a = np.array([1.0, np.nan, np.inf, -np.inf], np.float32)
    assert _deviation(a, a.copy()) == 0.0
    b = a.copy()
    b[0] = np.nan
    assert _deviation(a, b) == np.inf
    b = a.copy()
    b[0] = 1.5
    assert _deviation(a, b) == 0.5
    assert _deviation(a, a[:2]) == np.inf


# -- other bad arguments ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", ["x=-1,17", "x=0,17", "x=", "=3,17", "x3,17"])
def test_plan_shape_must_be_positive_integers(files, shape):
    model, _ = files
    r = invoke("plan", model, "--shape", shape)
    assert r.exit_code == EXIT_USAGE, r.output
    (line,) = error_lines(r)
    assert "--shape" in line


def test_plan_shape_of_a_name_that_is_not_an_input(files):
    model, _ = files
    r = invoke("plan", model, "--shape", "nope=3,17")
    assert r.exit_code == EXIT_USAGE, r.output
    (line,) = error_lines(r)
    assert "'nope'" in line and "x" in line


@pytest.mark.parametrize("top", ["0", "-3"])
def test_profile_top_must_be_positive(files, no_session, top):
    model, x = files
    assert invoke("profile", model, x, "--top", top).exit_code == EXIT_USAGE


def test_profile_of_a_two_input_model_is_a_bad_input(tmp_path):
    m = make_model([helper.make_node("Add", ["a", "b"], ["y"])], {"a": (2, 3), "b": (2, 3)}, ["y"])
    (tmp_path / "add.onnx").write_bytes(m.SerializeToString())
    r = invoke("profile", tmp_path / "add.onnx", "--runs", 1, "--warmup", 0)
    assert r.exit_code == EXIT_MODEL, r.output
    (line,) = error_lines(r)
    assert "2 inputs" in line


def test_plan_of_an_input_without_a_shape_asks_for_one(tmp_path):
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", ins, outs)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    (tmp_path / "noshape.onnx").write_bytes(m.SerializeToString())
    r = invoke("plan", tmp_path / "noshape.onnx")
    assert r.exit_code in (EXIT_MODEL, EXIT_USAGE), r.output
    assert "Traceback" not in r.output and len(error_lines(r)) == 1


def test_host_out_of_memory_is_a_runtime_failure(files, monkeypatch):
    model, x = files
    from minirt.session import Session

    def oom(self, *a, **k):
        raise MemoryError()
    monkeypatch.setattr(Session, "__init__", oom)
    r = invoke("run", model, x)
    assert r.exit_code == EXIT_RUNTIME, r.output
    (line,) = error_lines(r)
    assert "out of host memory" in line


@pytest.mark.parametrize("cmd", ["run", "plan", "profile"])
@pytest.mark.parametrize("how", ["env", "option"])
def test_a_local_size_beyond_the_device_is_a_usage_error_however_forced(files, monkeypatch, no_session, cmd, how):
    model, x = files
    args = [cmd, model] + ([x] if cmd in ("run", "profile") else [])
    if how == "env":
        monkeypatch.setenv("MINIRT_LOCAL_SIZE", "100000")
    else:
        args += ["--option", "local_size=100000"]
    r = invoke(*args)
    assert r.exit_code == EXIT_USAGE, r.output
    (line,) = error_lines(r)
    assert ("MINIRT_LOCAL_SIZE" if how == "env" else "--option local_size") in line and "100000" in line


@pytest.mark.parametrize("cmd", ["run", "profile"])
def test_a_missing_wav_input_is_named_before_the_model_loads(files, tmp_path, no_session, cmd):
    model, _ = files
    r = invoke(cmd, model, tmp_path / "speech.wav")
    assert r.exit_code == EXIT_MODEL, r.output
    (line,) = error_lines(r)
    assert "speech.wav: no such file" in line
