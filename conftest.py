"""Test-wide settings: no person watches the notebooks that nbval runs, the size is ``ci``, and what the course
keeps between processes (the generated data's sums) goes to a folder of the session's own."""

import os
import tempfile

os.environ["COURSE_INTERACTIVE"] = "0"  # no TensorBoard servers or live widgets under pytest
os.environ.setdefault("COURSE_SIZE", "ci")
os.environ.setdefault("COURSE_CACHE_DIR", tempfile.mkdtemp(prefix="course-cache-"))
