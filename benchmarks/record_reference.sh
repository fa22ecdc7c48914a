#!/usr/bin/env bash
# Record the course's reference results on the GPU node this runs on, in two runs of at most nine minutes each:
#
#   benchmarks/record_reference.sh              # on a GPU node (an H100, an MI250X GCD on LUMI, ...): the benchmarks
#   benchmarks/record_reference.sh --notebooks  # then the notebooks that use the GPU
#   benchmarks/record_reference.sh --dry-run    # the same plan at the ci size on the CPU (CI runs it)
#
# It uses $PYTHON where it is set, else the checkout's .venv where there is one, else python3 (inside LUMI's container, the
# container's Python). What it does, and its options: benchmarks/record_reference.py --help.
#
# The recorder replaces this shell (exec), so that SIGTERM (a Slurm job's time limit, scancel), SIGHUP (the
# terminal closed) and Ctrl-C reach it directly, with no shell in between to defer them: it ends the running
# task, every process of it (each task runs in a session of its own, out of reach of a signal to this one's
# process group), and writes its summary.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
exec "$PYTHON" benchmarks/record_reference.py "$@"
