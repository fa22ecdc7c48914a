#!/bin/bash
# Run a command of the course inside NVIDIA's NGC PyTorch container, with Docker or Apptainer, on a GPU VM
# (jobs/cloud/README.md walks through it). The checkout is mounted at its own path and is the working folder.
#
#   jobs/cloud/ngc.sh bash jobs/cloud/setup_ngc_venv.sh      # once: the course's venv over the container's torch
#   jobs/cloud/ngc.sh make lab VENV=.venv-ngc PIP_ARGS=--no-deps BROWSER=0
#                                                            # JupyterLab on 127.0.0.1:8888 with its token
#   HEAD=10.0.0.4 NNODES=2 jobs/cloud/ngc.sh jobs/cloud/run_node.sh --data imagefolder --data-dir /data/imagenet
#
# COURSE_NGC_IMAGE: the image (default below; a .sif file for Apptainer works too). COURSE_CONTAINER_RUNTIME:
# docker or apptainer (default: docker where it is installed). COURSE_DATA: a data folder to mount as well.
# --network host keeps JupyterLab on the VM's own 127.0.0.1 (reached through `ssh -L`, never published to the
# internet) and lets torchrun and NCCL use the VM's address; --ipc=host gives DataLoader workers shared memory.
set -euo pipefail
cd "$(dirname "$0")/../.."
checkout=$(pwd)
# Each NGC release notes "PyTorch container image version YY.MM is based on <torch version>": pick the release
# whose torch is closest to the course's pin (pyproject.toml). 25.12 (2.10.0a0, CUDA 13.1) is the newest whose
# notes were checked when this was written; newer releases follow the same pattern.
image=${COURSE_NGC_IMAGE:-nvcr.io/nvidia/pytorch:25.12-py3}
runtime=${COURSE_CONTAINER_RUNTIME:-$(command -v docker >/dev/null && echo docker || echo apptainer)}
export COURSE_VENV=${COURSE_VENV:-.venv-ngc}
(($#)) || set -- bash
mounts=("$checkout")
[[ -n ${COURSE_DATA:-} ]] && mounts+=("$(cd "$COURSE_DATA" && pwd)")

case $runtime in
  docker)
    args=(--rm --gpus all --ipc=host --network host --ulimit memlock=-1 --ulimit stack=67108864
          --user "$(id -u):$(id -g)" -e HOME=/tmp -w "$checkout")
    [[ -t 0 ]] && args+=(-it)
    for mount in "${mounts[@]}"; do args+=(-v "$mount:$mount"); done
    # The variables of the recipe and of NCCL pass into the container (Docker passes none by itself).
    for name in $(compgen -e | grep -E '^(HEAD|NNODES|PORT|RUN_ID|NPROC_PER_NODE|COURSE_.*|NCCL_.*|TORCH_.*)$'); do
      args+=(-e "$name")
    done
    exec docker run "${args[@]}" "$image" "$@" ;;
  apptainer)
    [[ $image == *.sif ]] || image=docker://$image  # `apptainer pull ngc.sif docker://...` once saves converting
    binds=$(IFS=,; echo "${mounts[*]}")
    exec apptainer exec --nv --bind "$binds" --pwd "$checkout" "$image" "$@" ;;
  *)
    echo "ngc.sh: COURSE_CONTAINER_RUNTIME must be docker or apptainer, not '$runtime'" >&2
    exit 1 ;;
esac
