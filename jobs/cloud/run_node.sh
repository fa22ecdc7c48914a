#!/bin/bash
# DDP over plain VMs without Slurm: run this same command on every VM, with the first VM's address.
#
#   HEAD=10.0.0.4 NNODES=2 jobs/cloud/run_node.sh --model resnet50 --epochs 5
#
# torchrun's c10d rendezvous meets on HEAD:29400 (the first VM hosts it); the VMs then find each
# other and open further TCP connections for NCCL (or gloo) on ports they choose. So the VMs must
# reach each other on every TCP port: put them in one security group / VPC subnet that allows all
# traffic between its members, and open nothing to the internet. Arguments go to the training command.
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${HEAD:?set HEAD to the address of the first VM, the one every VM can reach}"
NNODES=${NNODES:-2}
PORT=${PORT:-29400}
# One process per GPU; a VM without GPUs runs one process on its CPUs (gloo).
GPUS=$(nvidia-smi --list-gpus 2>/dev/null | wc -l || true)
((GPUS > 0)) || GPUS=1
export COURSE_SIZE=${COURSE_SIZE:-workshop}
exec "${COURSE_VENV:-.venv}/bin/torchrun" --nnodes="$NNODES" --nproc-per-node="${NPROC_PER_NODE:-$GPUS}" \
    --rdzv-backend=c10d --rdzv-endpoint="$HEAD:$PORT" --rdzv-id="${RUN_ID:-course}" \
    -m course_utils.train --distributed ddp --no-progress "$@"
