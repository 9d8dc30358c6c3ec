"""fsd's version, in a leaf of its own: `fsd --version`, `fsctl version` and the daemon's
status read it here, not through `fsd/__init__` (nothing imports upward into it)."""

__version__ = "0.1.0"
