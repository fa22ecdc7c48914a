#!/bin/bash
# DDP over plain VMs without Slurm: run this same command on every VM, with the first VM's address.
#
#   HEAD=10.0.0.4 NNODES=2 jobs/cloud/run_node.sh --model resnet50 --epochs 5
#
# torchrun's c10d rendezvous meets on HEAD:29400 (the first VM hosts it); then the workers' store and
# NCCL (or gloo) listen on ports the OS picks from net.ipv4.ip_local_port_range, which NCCL has no setting
# to fix. So narrow that range on both VMs (sudo sysctl -w net.ipv4.ip_local_port_range="50000 51000") and
# allow, between the two VMs' private addresses only, TCP PORT and that range; nothing to the internet
# but SSH (jobs/cloud/README.md). Arguments go to the training command.
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${HEAD:?set HEAD to the address of the first VM, the one every VM can reach}"
NNODES=${NNODES:-2}
PORT=${PORT:-29400}
# One process per GPU; a VM without GPUs runs one process on its CPUs (gloo). A driver that hangs makes
# nvidia-smi hang: it gets NVIDIA_SMI_TIMEOUT seconds, then the node stops and says so.
listed=0
if command -v nvidia-smi >/dev/null; then
  set +e
  listed=$(timeout "${NVIDIA_SMI_TIMEOUT:-30}" nvidia-smi --list-gpus 2>/dev/null)
  status=$?
  set -e
  if ((status == 124)); then
    echo "run_node.sh: nvidia-smi did not answer in ${NVIDIA_SMI_TIMEOUT:-30} s: the GPU driver hangs on this VM;" \
      "restart the VM (or reload the driver) and start this node again" >&2
    exit 1
  fi
fi
GPUS=$(grep -c '^GPU ' <<<"$listed" || true)
((GPUS > 0)) || GPUS=1
export COURSE_SIZE=${COURSE_SIZE:-workshop}
echo "run_node.sh: $GPUS process(es) here, waiting for all $NNODES nodes at $HEAD:$PORT (torchrun gives up" \
  "after 600 s; start the same command on every node)" >&2
# "--" ends torchrun's options: the flags after it are the module's (torchrun would take --monitor for
# an abbreviation of its own --monitor-interval).
exec "${COURSE_VENV:-.venv}/bin/torchrun" --nnodes="$NNODES" --nproc-per-node="${NPROC_PER_NODE:-$GPUS}" \
    --rdzv-backend=c10d --rdzv-endpoint="$HEAD:$PORT" --rdzv-id="${RUN_ID:-course}" \
    -m course_utils.train -- --distributed ddp --no-progress "$@"
