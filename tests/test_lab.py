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
    # -W: as if the course's settings had just changed, so that make shows where it copies them
    dry_run = subprocess.run(["make", "-n", "-W", "jupyter/overrides.json", "lab"], cwd=checkout_root(),
                             capture_output=True, text=True).stdout
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


def test_tensorboard_moves_to_the_port_the_environment_names(monkeypatch):
    """A shared node (or the browser test) may have 6006 taken: COURSE_TENSORBOARD_PORT moves the notebooks'
    TensorBoard, and make tensorboard's."""
    monkeypatch.delenv(tensorboard.PORT_VARIABLE, raising=False)
    assert tensorboard.command(Path("runs")).endswith("--port 6006")
    monkeypatch.setenv(tensorboard.PORT_VARIABLE, "16006")
    assert tensorboard.command(Path("runs")).endswith("--port 16006")
    dry_run = subprocess.run(["make", "-n", "tensorboard"], cwd=checkout_root(), capture_output=True, text=True).stdout
    assert "--port ${COURSE_TENSORBOARD_PORT:-6006}" in dry_run


def _save_hook():
    """The hook that `make lab`'s server configuration installs, read from that file as Jupyter reads it."""
    from traitlets.config import Config
    from traitlets.utils.importstring import import_item

    namespace = {"c": Config()}
    exec((checkout_root() / "jupyter" / "jupyter_server_config.py").read_text(), namespace)
    return import_item(namespace["c"].FileContentsManager.pre_save_hook)


def test_make_lab_starts_jupyterlab_with_the_course_configuration():
    dry_run = subprocess.run(["make", "-n", "lab"], cwd=checkout_root(), capture_output=True, text=True).stdout
    assert "jupyter lab --config=jupyter/jupyter_server_config.py" in dry_run


def test_running_a_notebook_and_saving_it_leaves_the_checkout_unchanged(tmp_path):
    """Jupyter's own contents manager saves a run notebook (outputs, execution counts, metadata added by
    the front-end) through the course's hook: the file is byte for byte the committed one."""
    import nbformat
    from jupyter_server.services.contents.filemanager import FileContentsManager

    committed = checkout_root() / "notebooks" / "00_setup.ipynb"
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / committed.name).write_bytes(committed.read_bytes())
    manager = FileContentsManager(root_dir=str(tmp_path))
    manager.register_pre_save_hook(_save_hook())
    model = manager.get(f"notebooks/{committed.name}")
    notebook = model["content"]
    for count, cell in enumerate(c for c in notebook.cells if c.cell_type == "code"):
        cell.execution_count = count + 1
        cell.metadata["execution"] = {"iopub.status.busy": "2026-11-23T10:00:00Z"}
        if not cell.source.startswith("# NBVAL_CHECK_OUTPUT"):  # that one's output is what the run printed again
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="what this machine printed\n")]
    notebook.metadata["language_info"] = {"name": "python", "version": "3.11.7", "file_extension": ".py"}
    manager.save(model, f"notebooks/{committed.name}")
    assert (tmp_path / "notebooks" / committed.name).read_bytes() == committed.read_bytes()


def test_the_repository_keeps_every_notebook_in_the_form_jupyterlab_saves_it_in():
    import nbformat

    from course_utils.saved_notebooks import course_form

    for path in sorted((checkout_root() / "notebooks").glob("*.ipynb")):
        text = path.read_text()
        node = nbformat.reads(text, 4)
        assert nbformat.writes(course_form(node)) + "\n" == text, f"{path.name} is not in the saved form"
