"""GPU (or CPU) monitoring: a background sampler, its backends and parsers (notebook 02, and any run
with ``--monitor``). Its views, the live plot and the timeline, are in :mod:`.views`: only a notebook
needs them, and a training process does not pay for importing matplotlib. The sampler, which needs PyTorch, is
imported when first asked for: the doctor reads the backends on a stuck node without waiting for PyTorch."""

from typing import Any

from course_utils.observe.monitor.backends import BACKEND_NAMES, BackendUnavailable, open_backend
from course_utils.observe.monitor.readings import Reading, parse_nvidia_smi, parse_rocm_smi

SAMPLER_NAMES = ("Monitor", "summarize", "this_process_rows")
__all__ = ["BACKEND_NAMES", "BackendUnavailable", "Reading", "open_backend", "parse_nvidia_smi", "parse_rocm_smi",
           *SAMPLER_NAMES]


def __getattr__(name: str) -> Any:
    if name in SAMPLER_NAMES:
        from course_utils.observe.monitor import sampler

        return getattr(sampler, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
