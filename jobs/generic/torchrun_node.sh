#!/bin/bash
# Run by srun once per node of a job: starts one process per GPU of this node with torchrun, all
# nodes meeting at a c10d rendezvous on the job's first node. Arguments: `-m module args...`.
set -euo pipefail
# One process per GPU of the node; a node without GPUs runs one process (gloo on its CPUs).
gpus=${SLURM_GPUS_ON_NODE:-0}
((gpus > 0)) || gpus=1
head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
port=$((29500 + SLURM_JOB_ID % 1000))
# One thread per process for PyTorch's CPU work; the node's other cores feed DataLoader workers.
export OMP_NUM_THREADS=1
if ((SLURM_NODEID == 0)); then
  echo "job $SLURM_JOB_ID: $SLURM_NNODES nodes x $gpus processes, rendezvous at $head_node:$port"
fi
# torchrun starts its workers in their own sessions, out of reach of Slurm's signals: it passes
# SIGUSR1 (--signal=USR1@...: checkpoint and stop) on to them, as it does SIGTERM, and gives them
# --shutdown-timeout seconds to write their checkpoint (a flag PyTorch 2.10's torchrun does not know: there
# its own default holds).
shutdown=()
if torchrun --help 2>/dev/null | grep -q -- --shutdown-timeout; then
  shutdown=(--shutdown-timeout=90)
fi
exec torchrun --signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1 "${shutdown[@]}" \
    --nnodes="$SLURM_NNODES" --nproc-per-node="$gpus" \
    --rdzv-id="$SLURM_JOB_ID" --rdzv-backend=c10d --rdzv-endpoint="$head_node:$port" "$@"
