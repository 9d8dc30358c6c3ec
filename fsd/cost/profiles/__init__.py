"""Shipped cost-model profiles (JSON, derived by `fsd.cost.analytic`) and their loader.

`load_profile("opt-13b-a100")` reads the shipped file of that name; any other
argument is taken as the path of a profile JSON (as `fsd profile` writes one).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fsd.cost.model import CostModel
from fsd.errors import ConfigError


def _shipped_dir() -> Path:
    return Path(str(resources.files(__name__)))


def shipped_profiles() -> list[str]:
    """Names of the profiles that ship with fsd, sorted."""
    return sorted(p.stem for p in _shipped_dir().glob("*.json"))


def profile_path(name: str) -> Path:
    """The file of a shipped profile; ConfigError lists the shipped names otherwise."""
    path = _shipped_dir() / f"{name}.json"
    if not path.is_file():
        raise ConfigError(
            f"unknown profile {name!r}: not a shipped profile ({', '.join(shipped_profiles())}) "
            "nor a profile JSON file"
        )
    return path


def load_profile(name_or_path: str | Path) -> CostModel:
    """A shipped profile by name ("opt-13b-a100") or a profile JSON by path."""
    text = str(name_or_path)
    if isinstance(name_or_path, str) and text in shipped_profiles():
        return CostModel.load(profile_path(text))
    path = Path(text)
    # A path-looking argument gets the file's own error (missing, bad JSON, bad field);
    # a bare word that is no shipped name gets the list of shipped names.
    if path.exists() or path.suffix == ".json" or len(path.parts) > 1:
        return CostModel.load(path)
    return CostModel.load(profile_path(text))


__all__ = ["load_profile", "profile_path", "shipped_profiles"]
