#!/usr/bin/env python3
"""A one-off experiment (docs/benchmarks.md, fourteenth session): what the executor's compute -> compute barrier costs on
this device, by recording it in other ways. Only "mem" is correct; "exec" (an execution dependency without the memory
barrier) and "none" (no barrier at all) let dispatches read stale or unwritten data and are there for their timing
alone; "event" is a set / wait / reset of one VkEvent per barrier (correct, a split barrier with nothing between).

  python docs/experiments/barrier_modes.py          # from the repository root, on the device to measure

Prints, per mode: a chain of 128 tiny dependent dispatches (tools/dispatch_cost.py's) in GPU us a dispatch, the
Whisper-tiny fp32 encoder's GPU span, and its output's largest difference from the "mem" run."""
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[0] = str(ROOT)
sys.path += [str(ROOT / "tools"), str(ROOT / "models")]

import numpy as np  # noqa: E402

from minirt import Session  # noqa: E402
from minirt.vk import executor  # noqa: E402
from dispatch_cost import chain_model  # noqa: E402
import whisper_encoder as we  # noqa: E402

shipped = executor.Executor._memory_barrier
state = {"mode": "mem", "events": []}   # events: (VkDevice, VkEvent) made while recording, destroyed after each Session


def barrier(self, cmd, src_stage, src_access, dst_stage, dst_access):
    vk = self.vk
    C = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT
    if src_stage != C or dst_stage != C or state["mode"] == "mem":
        return shipped(self, cmd, src_stage, src_access, dst_stage, dst_access)
    if state["mode"] == "exec":
        vk.vkCmdPipelineBarrier(cmd, src_stage, dst_stage, 0, 0, None, 0, None, 0, None)
    elif state["mode"] == "event":
        ev = vk.vkCreateEvent(self.d, vk.VkEventCreateInfo(), None)
        state["events"].append((self.d, ev))
        mb = vk.VkMemoryBarrier(srcAccessMask=src_access, dstAccessMask=dst_access)
        vk.vkCmdSetEvent(cmd, ev, src_stage)
        vk.vkCmdWaitEvents(cmd, 1, [ev], src_stage, dst_stage, 1, [mb], 0, None, 0, None)
        vk.vkCmdResetEvent(cmd, ev, dst_stage)


def spans(model, x, warm, runs):
    with Session(model, profile="span") as s:
        for _ in range(warm):
            y = s.run(x)
        t = []
        for _ in range(runs):
            y = s.run(x)
            t.append(s.gpu_span_ms() * 1e3)
        n = len(s.plan.dispatches)
        vk = s.device.vk
    for d, ev in state["events"]:
        vk.vkDestroyEvent(d, ev, None)
    state["events"].clear()
    return statistics.median(t), n, y


def main():
    executor.Executor._memory_barrier = barrier
    chain, xc = chain_model(64, 256), np.random.default_rng(0).standard_normal((1, 256)).astype(np.float32)
    enc, xe = we.build_whisper_encoder("tiny", opset=17, seed=0), we.sample_input(seed=1)
    ref = None
    for rnd in range(2):
        for mode in ("mem", "exec", "event", "none"):
            state["mode"] = mode
            c_us, c_n, _ = spans(chain, xc, 20, 40)
            e_us, _, y = spans(enc, xe, 10, 40)
            ref = y if ref is None else ref
            diff = float(np.nanmax(np.abs(y - ref))) if np.isfinite(y).all() else float("nan")
            print(f"round {rnd} {mode:>5}: chain {c_us / c_n:5.2f} us a dispatch ({c_n}); Whisper-tiny span {e_us:7.1f} us;"
                  f" max |diff| against mem {diff:.2e}", flush=True)


if __name__ == "__main__":
    main()
