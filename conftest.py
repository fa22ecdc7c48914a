"""Test-wide settings: no person watches the notebooks that nbval runs, and the size is ``ci``."""

import os

os.environ["COURSE_INTERACTIVE"] = "0"  # no TensorBoard servers or live widgets under pytest
os.environ.setdefault("COURSE_SIZE", "ci")
