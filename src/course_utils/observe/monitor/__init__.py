"""GPU (or CPU) monitoring: a background sampler, its backends and parsers (notebook 02, and any run
with ``--monitor``). Its views, the live plot and the timeline, are in :mod:`.views`: only a notebook
needs them, and a training process does not pay for importing matplotlib."""

from course_utils.observe.monitor.backends import BACKEND_NAMES, BackendUnavailable, open_backend
from course_utils.observe.monitor.readings import Reading, parse_nvidia_smi, parse_rocm_smi
from course_utils.observe.monitor.sampler import Monitor, summarize, this_process_rows

__all__ = ["BACKEND_NAMES", "BackendUnavailable", "Monitor", "Reading", "open_backend", "parse_nvidia_smi",
           "parse_rocm_smi", "summarize", "this_process_rows"]
