"""Dependencies: the library declares ranges (pyproject.toml, for those who install it beside
their own packages); the app and the tests run on exact pins (requirements*.txt), each inside
its range, so the pins are one tested point of what the library claims."""
from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent


def pins(*files: str) -> dict[str, Requirement]:
    out = {}
    for name in files:
        for line in (ROOT / name).read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line and not line.startswith("-"):
                req = Requirement(line)
                out[req.name.lower()] = req
    return out


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_the_library_declares_ranges_and_the_app_pins_a_point_inside_each():
    meta = project()
    declared = [Requirement(r) for r in meta["dependencies"]]
    declared += [Requirement(r) for extra in meta["optional-dependencies"].values() for r in extra]
    pinned = pins("requirements.txt", "requirements-ray.txt")
    for req in declared:
        ops = {s.operator for s in req.specifier}
        assert ">=" in ops and "<" in ops and "==" not in ops, f"{req}: give a range (>=, <)"
        pin = pinned.get(req.name.lower())
        assert pin is not None, f"{req.name}: not pinned in requirements*.txt"
        # an exact pin (a lower bound only for the few the app takes as they come)
        versions = [s.version for s in pin.specifier if s.operator == "=="]
        floor = [s.version for s in pin.specifier if s.operator == ">="]
        assert versions or floor, f"{pin}: pin it"
        assert (versions or floor)[0] in req.specifier, f"{pin} is outside {req}"


def test_the_dev_tools_are_pinned():
    dev = pins("requirements-dev.txt")
    assert "ruff" in dev and str(dev["ruff"].specifier).startswith("==")
