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
# One process per GPU; a VM without GPUs runs one process on its CPUs (gloo).
GPUS=$(nvidia-smi --list-gpus 2>/dev/null | wc -l || true)
((GPUS > 0)) || GPUS=1
export COURSE_SIZE=${COURSE_SIZE:-workshop}
# "--" ends torchrun's options: the flags after it are the module's (torchrun would take --monitor for
# an abbreviation of its own --monitor-interval).
exec "${COURSE_VENV:-.venv}/bin/torchrun" --nnodes="$NNODES" --nproc-per-node="${NPROC_PER_NODE:-$GPUS}" \
    --rdzv-backend=c10d --rdzv-endpoint="$HEAD:$PORT" --rdzv-id="${RUN_ID:-course}" \
    -m course_utils.train -- --distributed ddp --no-progress "$@"
