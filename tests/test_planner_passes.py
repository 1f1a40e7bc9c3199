"""The planner's one list of passes (minirt.planner.PASSES) and its runner: a pass that declares an option runs only
while the option is on, and the plan notes when it is switched off; the list, the Options switches and the
planner's map of the passes agree."""
import dataclasses
import re

import minirt.planner as planner
from minirt.device_profile import KNOWN_PROFILES
from minirt.graph import Graph, Node, Tensor
from minirt.options import Options
from minirt.planner import PASSES, SWITCHED_OFF, Pass, fuse_silu, make_plan


def _silu_graph():
    g = Graph()
    g.add_tensor(Tensor("x", (1, 8), "float32"))
    for n in ("s", "y"):
        g.add_tensor(Tensor(n, (1, 8), "float32"))
    g.inputs, g.outputs = ["x"], ["y"]
    g.nodes = [Node("Sigmoid", "sig", ["x"], ["s"]), Node("Mul", "mul", ["x", "s"], ["y"])]
    return g


def test_switched_off_pass_does_not_run_and_is_noted():
    on = Pass(fuse_silu)(_silu_graph(), Options())
    assert [n.op for n in on.nodes] == ["Silu"] and SWITCHED_OFF not in on.notes
    off = Pass(fuse_silu)(_silu_graph(), Options(fuse_silu=False))
    assert [n.op for n in off.nodes] == ["Sigmoid", "Mul"]
    assert off.notes[SWITCHED_OFF] == ["pass fuse_silu switched off (option fuse_silu)"]
    plan = make_plan(_silu_graph(), KNOWN_PROFILES["lavapipe"], "buffer", {"fuse_silu": False})
    assert plan.notes[SWITCHED_OFF] == ["pass fuse_silu switched off (option fuse_silu)"]
    assert [d.op for d in plan.dispatches] == ["Sigmoid", "Mul"]


def test_every_switch_is_a_pass_and_every_pass_option_a_switch():
    fields = {f.name: f for f in dataclasses.fields(Options)}
    options = [p.option for p in PASSES if p.option]
    assert all(fields[o].type in (bool, "bool") and fields[o].default is True for o in options)
    assert all(p.option in (None, p.name) for p in PASSES)
    switches = {n for n, f in fields.items() if f.metadata.get("doc", "").startswith("pass: ")}
    assert switches == set(options)


def test_the_planner_map_lists_the_passes_in_order():
    listed = re.findall(r"^ *\d+\. .*?\(([a-z_0-9]+)\.py\)", planner.__doc__, re.M)
    assert [n for n in listed if n not in ("lower", "memory_plan")] == [p.name for p in PASSES]
