#!/usr/bin/env bash
# Sets up minirt on a fresh Debian or Ubuntu machine: the Vulkan loader and Mesa's lavapipe (a CPU
# Vulkan driver; a GPU driver is used instead when present), the shader tools, the validation layer,
# espeak-ng (speech the Whisper transcription tests synthesize), and a virtual environment in .venv with
# minirt, its test dependencies (torch and transformers among them, for two cross-checks; see below), Ray Data and
# the server's packages (Starlette, uvicorn).
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
$SUDO apt-get update -qq
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    mesa-vulkan-drivers libvulkan1 glslc spirv-tools vulkan-validationlayers espeak-ng python3-venv python3-pip \
    >/dev/null
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# the ray extra: tests/test_ray.py runs minirt.ray's workers on a local Ray cluster; the serve extra: `minirt serve`
# (tests/test_serve.py drives it with the openai client, in the test extra)
.venv/bin/python -m pip install -q -e ".[test,ray,serve]"
# Test-only: torch (CPU) and transformers, for the tests that compare minirt.whisper's logits with transformers'
# WhisperForConditionalGeneration (tests/test_whisper_transformers.py, tests/test_whisper_decode.py). Not in
# pyproject's test extra: there a plain torch requirement would pull a CUDA build of several GB. The CPU build is
# taken only from a local wheel (pip's find-links; this project's machines have torch 2.13.0+cpu), its pure-Python
# dependencies from the index; where there is none those tests are skipped. About 2 minutes, 1 GB in .venv.
if .venv/bin/python -m pip install -q --no-index --no-deps torch==2.13.0 2>/dev/null; then
    .venv/bin/python -m pip install -q torch==2.13.0 "transformers>=5,<6"
else
    echo "no local CPU build of torch 2.13.0: the transformers cross-checks will be skipped"
fi
echo "minirt is set up in .venv ($(.venv/bin/python -c 'import minirt; print(minirt.__version__)'))"
