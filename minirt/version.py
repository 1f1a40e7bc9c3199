"""The version of minirt (also pyproject.toml's)."""
__version__ = "0.1.0"
