# JupyterLab as `make lab` starts it: notebooks under notebooks/ are saved in the form the repository keeps
# them in (course_utils.saved_notebooks), so that running the course leaves the checkout clean.
from course_utils.saved_notebooks import course_form


def save_in_course_form(model, path, contents_manager, **kwargs):
    if model.get("type") == "notebook" and path.startswith("notebooks/"):
        course_form(model["content"])


c.FileContentsManager.pre_save_hook = save_in_course_form  # noqa: F821 (c: the config Jupyter passes in)
