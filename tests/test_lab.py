"""JupyterLab as a learner meets it after `make lab`: no pop-up over the notebooks, and TensorBoard's magic
finds its program although the kernel's PATH lacks the venv."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from jupyterlab.commands import get_app_dir

from course_utils.config import checkout_root
from course_utils.observe import tensorboard


def test_the_lab_settings_answer_jupyters_news_question_in_the_place_jupyterlab_reads():
    overrides = json.loads((checkout_root() / "jupyter" / "overrides.json").read_text())
    schema = json.loads((Path(get_app_dir()) / "schemas" / "@jupyterlab" / "apputils-extension" /
                         "notification.json").read_text())["properties"]
    settings = overrides["@jupyterlab/apputils-extension:notification"]
    assert set(settings) <= set(schema)  # JupyterLab's own schema for these settings
    assert settings["fetchNews"] in [choice["const"] for choice in schema["fetchNews"]["oneOf"]]
    assert settings["fetchNews"] == "false"  # "none", the default, asks in a pop-up
    dry_run = subprocess.run(["make", "-n", "lab"], cwd=checkout_root(), capture_output=True, text=True).stdout
    target = Path(get_app_dir()) / "settings" / "overrides.json"
    assert f"cp jupyter/overrides.json {os.path.relpath(target, checkout_root())}" in dry_run


def test_tensorboard_is_found_from_a_kernel_whose_path_lacks_the_venv(monkeypatch):
    """`make lab` starts JupyterLab from the venv without activating it: the kernel's PATH has no
    `.venv/bin`, where the `tensorboard` program lives."""
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert shutil.which("tensorboard") is None or not shutil.which("tensorboard").startswith(sys.prefix)
    program = tensorboard.put_this_python_on_path()
    assert program == str(Path(sys.executable).parent / "tensorboard")
    assert shutil.which("tensorboard") == program
