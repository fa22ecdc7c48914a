"""What a run measures and how a person sees it: step clocks, metrics and TensorBoard events, the profiler
and the device monitor (notebooks 01-03, and every run)."""
