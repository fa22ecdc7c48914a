"""GPU (or CPU) monitoring: a background sampler, its backends and parsers, and its views (notebook 02,
and any run with ``--monitor``)."""

from course_utils.observe.monitor.backends import BACKEND_NAMES, BackendUnavailable, open_backend
from course_utils.observe.monitor.readings import Reading, parse_nvidia_smi, parse_rocm_smi
from course_utils.observe.monitor.sampler import Monitor, summarize
from course_utils.observe.monitor.views import live, timeline

__all__ = ["BACKEND_NAMES", "BackendUnavailable", "Monitor", "Reading", "live", "open_backend",
           "parse_nvidia_smi", "parse_rocm_smi", "summarize", "timeline"]
