#!/bin/bash
# The course's venv inside NVIDIA's NGC PyTorch container, keeping the container's torch, torchvision and DALI.
# Run it once per checkout and container tag, through the container (jobs/cloud/README.md):
#
#   jobs/cloud/ngc.sh bash jobs/cloud/setup_ngc_venv.sh
#
# Like jobs/lumi/setup_venv.sh for LUMI's container: a --system-site-packages venv (COURSE_VENV, default
# .venv-ngc) sees the container's packages, `make setup` installs the course with --no-deps so that pip never
# puts PyPI's torch over NVIDIA's build, then the course's other pins follow; a package the container's pip
# constraints (PIP_CONSTRAINT, /etc/pip/constraint.txt) pin keeps the container's version.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
venv=${COURSE_VENV:-.venv-ngc}
if ! python3 -c 'import sys, torch; sys.exit(torch.version.cuda is None)' 2>/dev/null; then
  echo "setup_ngc_venv: no CUDA build of torch here; run it inside the container: jobs/cloud/ngc.sh bash $0" >&2
  exit 1
fi
make setup PYTHON=python3 VENV="$venv" VENV_ARGS=--system-site-packages PIP_ARGS=--no-deps
requirements=$(mktemp)
trap 'rm -f "$requirements"' EXIT
read -ra constraints <<<"${PIP_CONSTRAINT:-}"
"$venv/bin/python" jobs/course_requirements.py --without torch torchvision nvidia-dali \
  --constraints "${constraints[@]}" >"$requirements"
"$venv/bin/python" -m pip install -r "$requirements"
echo "setup_ngc_venv: pip's notes that course-utils requires torch, torchvision or nvidia-dali-cuda130 are expected"

# The check: the container's CUDA torch, and what it differs in from the course's pins.
"$venv/bin/python" - <<'PY'
import torch
import torchvision

print(f"setup_ngc_venv: torch {torch.__version__} (CUDA {torch.version.cuda}, NCCL "
      f"{'.'.join(map(str, torch.cuda.nccl.version()))}) from {torch.__file__}; torchvision {torchvision.__version__}")
try:
    import nvidia.dali  # noqa: F401
except ImportError:
    print("setup_ngc_venv: this container has no NVIDIA DALI: --loader dali is unavailable, the others work")
PY
