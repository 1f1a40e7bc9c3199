#!/usr/bin/env bash
# Sets up minirt on a fresh Debian or Ubuntu machine: the Vulkan loader and Mesa's lavapipe (a CPU
# Vulkan driver; a GPU driver is used instead when present), the shader tools, the validation layer,
# espeak-ng (speech the Whisper transcription tests synthesize), and a virtual environment in .venv with
# minirt and its test dependencies.
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
.venv/bin/python -m pip install -q -e ".[test]"
echo "minirt is set up in .venv ($(.venv/bin/python -c 'import minirt; print(minirt.__version__)'))"
