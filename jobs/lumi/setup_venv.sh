#!/bin/bash
# The course's venv on LUMI, with a ROCm build of PyTorch and without NVIDIA DALI (CUDA only).
# Run it from the checkout, on a login node, once (README, "On LUMI"):
#
#   Container route: inside LUMI's PyTorch container, whose ROCm torch and torchvision the venv keeps
#     singularity run "$COURSE_CONTAINER" bash jobs/lumi/setup_venv.sh
#   Wheel route: PyTorch's ROCm wheels from the index given (python3 3.10 or newer on PATH)
#     bash jobs/lumi/setup_venv.sh https://download.pytorch.org/whl/rocm7.2
#
# Both run `make setup` with --no-deps, so that pip never replaces the ROCm torch with the CUDA build that
# PyPI serves for the pin torch==2.14.1, then install every other pin of pyproject.toml.
# COURSE_VENV chooses another venv than .venv; delete an old venv first (rm -rf .venv) to start afresh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
venv=${COURSE_VENV:-.venv}
index=${1:-}

pin() {  # the version pyproject.toml pins for package $1
  python3 -c 'import re, sys; print(re.search(r"\"" + sys.argv[1] + r"==([^\";]+)", open("pyproject.toml").read()).group(1))' "$1"
}

if [[ -n $index ]]; then
  echo "setup_venv: PyTorch $(pin torch) from $index"
  make setup PYTHON="${PYTHON:-python3}" VENV="$venv" PIP_ARGS=--no-deps
  "$venv/bin/python" -m pip install "torch==$(pin torch)" "torchvision==$(pin torchvision)" --index-url "$index"
else
  if ! python3 -c 'import torch' 2>/dev/null; then
    echo "setup_venv: no torch here; run this inside the container (singularity run \"\$COURSE_CONTAINER\" bash $0)," \
         "or give PyTorch's ROCm wheel index as the argument" >&2
    exit 1
  fi
  # The container's own Python environment, whose torch the venv must see.
  container_site=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
  echo "setup_venv: PyTorch from the container ($container_site)"
  make setup PYTHON=python3 VENV="$venv" VENV_ARGS=--system-site-packages PIP_ARGS=--no-deps
  # --system-site-packages reaches the site-packages of the interpreter the venv was made from. Where the
  # container keeps torch in a venv of its own (/opt/venv in LUMI AI Factory images) and does not put that on
  # PYTHONPATH, a .pth file adds it after the course's venv.
  if ! "$venv/bin/python" -c 'import torch' 2>/dev/null; then
    site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "$container_site" >"$site/container-site-packages.pth"
    echo "setup_venv: added $container_site to the venv ($site/container-site-packages.pth)"
  fi
fi

# Every other pin of pyproject.toml (with the test extra): not torch and torchvision (installed above or the
# container's), not NVIDIA DALI (a CUDA library, of no use on AMD GPUs).
requirements=$(mktemp)
trap 'rm -f "$requirements"' EXIT
"$venv/bin/python" jobs/course_requirements.py --without torch torchvision nvidia-dali >"$requirements"
"$venv/bin/python" -m pip install -r "$requirements"
echo "setup_venv: pip's notes that course-utils requires torch, torchvision or nvidia-dali-cuda130 are expected here"

# The check: a ROCm build of torch, and which one.
"$venv/bin/python" - "$(pin torch)" <<'EOF'
import sys

import torch
import torchvision

from course_utils import versions

print(f"setup_venv: torch {torch.__version__} (HIP {torch.version.hip}) from {torch.__file__}, "
      f"torchvision {torchvision.__version__}")
if torch.version.hip is None:
    sys.exit("setup_venv: this torch is not a ROCm build and cannot use LUMI's GPUs; see README, 'On LUMI'")
if torch.__version__.split("+")[0] != sys.argv[1]:
    print(f"setup_venv: note: the course pins torch {sys.argv[1]}; this environment has {torch.__version__}: "
          f"{versions.support_note(torch.__version__)}")
EOF
