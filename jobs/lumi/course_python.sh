#!/bin/bash
# The course's Python on a LUMI-G node: the venv inside LUMI's PyTorch container when
# COURSE_CONTAINER names its .sif image (see the README), else the venv made with PyTorch's ROCm wheels.
set -euo pipefail
mkdir -p "${MIOPEN_USER_DB_PATH:-/tmp/$(id -un)-miopen}"
if [[ -n "${COURSE_CONTAINER:-}" ]]; then
  exec singularity exec -B /scratch -B /project -B /flash "$COURSE_CONTAINER" \
    bash -c 'source "${COURSE_VENV:-.venv}/bin/activate" && exec python "$@"' course_python "$@"
fi
exec "${COURSE_VENV:-.venv}/bin/python" "$@"
