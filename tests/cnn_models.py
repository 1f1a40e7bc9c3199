"""Bottleneck ResNets as ONNX, built with onnx.helper and seeded weights (BatchNorm folded into each Conv's bias, as
exporters write them): torchvision's ResNet-50 layout (a 7x7 stem with max pooling, bottleneck stages with the stride
on the 3x3 conv and a 1x1 skip conv where the shape changes, global average pooling, a Gemm head), at any width."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper


def resnet(stages=((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)), stem=64, classes=1000, batch="N", image=224,
           seed=0):
    """The model: input 'x' [batch, 3, image, image], output 'y' [batch, classes]. stages: (mid channels, blocks,
    stride); each block's output has 4 x mid channels."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []

    def const(name, a):
        inits.append(numpy_helper.from_array(np.asarray(a, np.float32), name))
        return name

    def conv(x, cin, cout, k, stride=1, relu=True, name=""):
        w = const(f"{name}.w", rng.standard_normal((cout, cin, k, k)) * np.sqrt(2.0 / (cin * k * k)))
        b = const(f"{name}.b", 0.1 * rng.standard_normal(cout))
        nodes.append(helper.make_node("Conv", [x, w, b], [f"{name}.conv"], name=name, kernel_shape=[k, k],
                                      strides=[stride, stride], pads=[k // 2] * 4))
        if not relu:
            return f"{name}.conv"
        nodes.append(helper.make_node("Relu", [f"{name}.conv"], [f"{name}.relu"], name=f"{name}/relu"))
        return f"{name}.relu"

    x = conv("x", 3, stem, 7, 2, name="stem")
    nodes.append(helper.make_node("MaxPool", [x], ["pool"], name="pool", kernel_shape=[3, 3], strides=[2, 2],
                                  pads=[1, 1, 1, 1]))
    x, cin = "pool", stem
    for s, (mid, blocks, stride) in enumerate(stages):
        for i in range(blocks):
            name, st, cout = f"s{s}b{i}", stride if i == 0 else 1, 4 * mid
            h = conv(x, cin, mid, 1, name=f"{name}.c1")
            h = conv(h, mid, mid, 3, st, name=f"{name}.c2")
            h = conv(h, mid, cout, 1, relu=False, name=f"{name}.c3")
            skip = conv(x, cin, cout, 1, st, relu=False, name=f"{name}.skip") if st != 1 or cin != cout else x
            nodes.append(helper.make_node("Add", [h, skip], [f"{name}.add"], name=f"{name}/add"))
            nodes.append(helper.make_node("Relu", [f"{name}.add"], [f"{name}.out"], name=f"{name}/relu"))
            x, cin = f"{name}.out", cout
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["gap"], name="gap"))
    nodes.append(helper.make_node("Flatten", ["gap"], ["flat"], name="flatten", axis=1))
    w = const("fc.w", rng.standard_normal((classes, cin)) / np.sqrt(cin))
    b = const("fc.b", 0.1 * rng.standard_normal(classes))
    nodes.append(helper.make_node("Gemm", ["flat", w, b], ["y"], name="fc", transB=1))
    g = helper.make_graph(nodes, "resnet", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                          [batch, 3, image, image])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m
