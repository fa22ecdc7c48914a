"""pyproject.toml and environment.yml must pin the same packages at the same versions."""

import re

import tomllib

from course_utils.config import checkout_root

PIN = re.compile(r"^([A-Za-z0-9_.-]+)==([^\s;]+)$")


def _pins(requirements):
    """name -> version, environment markers (after ';') set aside."""
    specs = [r.strip().strip('"').split(";")[0].strip() for r in requirements]
    return dict(PIN.match(spec).groups() for spec in specs if PIN.match(spec))


def test_pins_agree():
    project = tomllib.loads((checkout_root() / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + project["optional-dependencies"]["test"]
    assert all(PIN.match(r.split(";")[0].strip()) for r in declared), "every dependency must be pinned with =="
    yml = (checkout_root() / "environment.yml").read_text()
    conda = [line.strip()[2:] for line in yml.splitlines() if line.strip().startswith("- ") and "==" in line]
    assert _pins(declared) == _pins(conda)
