"""The PyTorch versions the course supports: one source (course_utils.versions) that the pins, the Makefile's
oldest environment, notebook 00 and ``python -m course_utils.devices`` agree with."""

import subprocess
import sys

import tomllib

from course_utils import devices, versions
from course_utils.config import checkout_root


def _pyproject_pins() -> dict[str, str]:
    project = tomllib.loads((checkout_root() / "pyproject.toml").read_text())["project"]
    pins = dict(requirement.split(";")[0].strip().split("==") for requirement in project["dependencies"])
    return {name: pins[name] for name in versions.PINNED}


def test_the_pins_are_pyprojects():
    assert versions.PINNED == _pyproject_pins()


def test_the_range_runs_from_the_oldest_to_the_pins_release():
    assert versions.supported_range() == "2.10 to 2.14"
    assert versions.release("2.10.0+rocm7.0") == (2, 10) and versions.release("2.15.0a0+git1234") == (2, 15)
    assert all(versions.is_supported(v) for v in ("2.10.0", "2.10.0+rocm6.4", "2.11.0+cu128", "2.14.1", "2.14.2"))
    assert not any(versions.is_supported(v) for v in ("2.9.1+rocm6.4", "2.7.1", "2.15.0", "3.0.0"))


def test_the_note_says_pin_inside_or_outside_with_the_fix():
    assert versions.support_note("2.14.1+cu130").startswith("the course's pin")
    assert versions.support_note("2.10.0+rocm7.0").startswith("inside the range")
    older = versions.support_note("2.9.1+rocm6.4")
    assert "OUTSIDE" in older and "older than" in older and "make setup" in older
    assert "newer than" in versions.support_note("2.15.0")


def test_the_report_notebook_00_prints_says_where_this_torch_stands():
    import torch

    line = next(line for line in devices.report().splitlines() if line.startswith("torch"))
    assert torch.__version__ in line and versions.support_note(torch.__version__) in line


def test_the_makefile_asks_the_module_as_a_script_before_any_environment_exists():
    """The oldest environment's pip arguments come from this file run by a bare python: no imports of its own."""
    script = checkout_root() / "src" / "course_utils" / "versions.py"
    printed = subprocess.run([sys.executable, "-I", str(script), "oldest"], capture_output=True, text=True, check=True)
    assert printed.stdout.split() == ["torch==2.10.0", "torchvision==0.25.0"]
    assert "versions.py oldest" in (checkout_root() / "Makefile").read_text()
