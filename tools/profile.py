#!/usr/bin/env python3
"""Per-dispatch GPU timing of a model: the same command as `minirt profile` (see --help)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from minirt.cli import main  # noqa: E402

if __name__ == "__main__":
    main(["profile", *sys.argv[1:]], prog_name="tools/profile.py")
