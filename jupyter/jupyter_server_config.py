# JupyterLab as `make lab` starts it: notebooks under notebooks/ are saved in the form the repository keeps
# them in (course_utils.saved_notebooks), so that running the course leaves the checkout clean.
c.FileContentsManager.pre_save_hook = "course_utils.saved_notebooks.pre_save_hook"  # noqa: F821 (c: Jupyter's)
