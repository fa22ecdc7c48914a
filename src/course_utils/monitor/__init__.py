"""GPU (or CPU) monitoring: a background sampler, its backends and parsers, and its views."""

from course_utils.monitor.backends import BACKEND_NAMES, BackendUnavailable, open_backend
from course_utils.monitor.readings import Reading, parse_nvidia_smi, parse_rocm_smi
from course_utils.monitor.sampler import Monitor, summarize
from course_utils.monitor.views import live, timeline

__all__ = ["BACKEND_NAMES", "BackendUnavailable", "Monitor", "Reading", "live", "open_backend",
           "parse_nvidia_smi", "parse_rocm_smi", "summarize", "timeline"]
