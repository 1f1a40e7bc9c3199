"""fuse_linear on the graph, and the Linear op (fast buffer GEMM and the fallback) against onnxruntime."""
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from minirt.options import Options
from minirt import MinirtError, Session
from minirt.kernels.gemm import LINEAR_TILES
from minirt.infer import prepare
from minirt.loaders import load
from minirt.planner import fuse_gelu, fuse_linear
from oracle import check_model, make_model, rand

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
import whisper_encoder as we  # noqa: E402


def test_whisper_layer_linears_fuse():
    m = we.build_whisper_encoder("tiny", layers=1, n_frames=64, seed=2)
    g = fuse_linear.rewrite(fuse_gelu.rewrite(prepare(load(m)), Options()), Options())
    lin = {n.name.split("/")[-2]: n for n in g.nodes if n.op == "Linear"}
    assert set(lin) == {"q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"}, list(lin)
    assert lin["q_proj"].attrs["scale"] == pytest.approx(0.125) and lin["q_proj"].inputs[2]
    assert not lin["k_proj"].inputs[2]                     # HF's k_proj has no bias
    assert lin["fc1"].attrs["act"] == "gelu"
    assert lin["out_proj"].inputs[3] and lin["fc2"].inputs[3]   # residual adds fused
    assert not any(n.op == "MatMul" and g.tensor(n.inputs[1]).is_const for n in g.nodes)


def _linear_model(k=64, n=48, act="Gelu", residual=True, scale=True):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["bias", "h"], ["hb"])]
    cur = "hb"
    if scale:
        nodes.append(helper.make_node("Mul", [cur, "s"], ["hs"]))
        cur = "hs"
    if act:
        nodes.append(helper.make_node(act, [cur], ["ha"]))
        cur = "ha"
    if residual:
        nodes.append(helper.make_node("Add", ["r", cur], ["y"]))
    else:
        nodes.append(helper.make_node("Identity", [cur], ["y"]))
    inputs = {"x": (1, 37, k)}
    if residual:
        inputs["r"] = (1, 37, n)
    return make_model(nodes, inputs, ["y"], {"w": rand(k, n, low=-.2, high=.2), "bias": rand(n),
                                             "s": np.float32(0.125)}, opset=20)


@pytest.mark.parametrize("k,n", [(64, 48), (30, 22), (384, 128)])
@pytest.mark.parametrize("act", ["Gelu", "Relu", None])
@pytest.mark.parametrize("residual", [True, False])
def test_linear_matches_onnxruntime(k, n, act, residual):
    m = _linear_model(k, n, act, residual)
    feeds = {"x": rand(1, 37, k, low=-2, high=2)}
    if residual:
        feeds["r"] = rand(1, 37, n)
    check_model(m, feeds)
    with Session(m) as s:
        kernels = [d.kernel for d in s.plan.dispatches]
    if k % 4 == 0:
        assert len(kernels) == 1 and kernels[0].startswith("linear_"), kernels


def test_hard_swish_joins_the_epilogue():
    m = _linear_model(64, 48, "HardSwish", residual=True)
    check_model(m, {"x": rand(1, 37, 64, low=-2, high=2), "r": rand(1, 37, 48)})
    with Session(m) as s:
        assert [d.op for d in s.plan.dispatches] == ["Linear"]


@pytest.mark.parametrize("tile", sorted(LINEAR_TILES))
def test_every_tile_variant(tile):
    m = _linear_model(384, 200, "Gelu", True)
    feeds = {"x": rand(1, 37, 384), "r": rand(1, 37, 200)}
    check_model(m, feeds, storages=("buffer",), options={"gemm_tile": tile})


def test_unknown_tile_is_refused():
    with pytest.raises(MinirtError, match="gemm_tile must be one of"):
        Session(_linear_model(384, 200, "Gelu", True), options={"gemm_tile": "t99"})


def test_local_size_options_as_strings():
    # the tools pass options as KEY=VALUE text: "8x4" and "gemm" mean what (8, 4, 1) and ("gemm",) do
    m = _linear_model(64, 48, "Gelu", True)
    feeds = {"x": rand(1, 37, 64), "r": rand(1, 37, 48)}
    check_model(m, feeds, storages=("buffer",), options={"local_size": "8x4", "local_size_families": "gemm"})
    with Session(m, storage="buffer", options={"local_size": "8x4", "local_size_families": "gemm+im2col"}) as s:
        assert s.options.local_size_families == ("gemm", "im2col")
        gemms = [d for d in s.plan.dispatches if d.family == "gemm"]
        assert gemms and all(d.local_size == (8, 4, 1) for d in gemms)
    with pytest.raises(MinirtError, match="option local_size must be 1 to 3 integers"):
        Session(m, options={"local_size": "8xq"})
