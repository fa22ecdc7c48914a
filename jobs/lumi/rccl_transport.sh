#!/bin/bash
# Which transport RCCL chose, in one line, from the log of a run with NCCL_DEBUG=INFO and
# NCCL_DEBUG_SUBSYS=INIT,NET (jobs/lumi/allreduce.sbatch runs the course's self-check that way):
#
#   jobs/lumi/rccl_transport.sh runs/slurm/transport-<job id>.log
#
# The lines it reads, as RCCL and the aws-ofi-rccl plugin print them:
#   "NET/OFI Using aws-ofi-rccl <version>"     the plugin for libfabric, hence Slingshot, was loaded
#   "NET/OFI Selected Provider is cxi"          libfabric's provider for Slingshot (cxi)
#   "Using network <name>"                      RCCL's network: "AWS Libfabric" (the plugin) or "Socket" (TCP)
#   "Channel ... via NET/<name>/<dev>[/GDRDMA]" a connection between nodes, GPU-direct RDMA or not
#   "Channel ... via P2P/IPC" (or SHM)          a connection inside the node, over Infinity Fabric (or host memory)
set -uo pipefail
log=${1:?usage: rccl_transport.sh LOGFILE}
[[ -r $log ]] || { echo "transport: cannot read $log" >&2; exit 2; }

count() { grep -c -- "$1" "$log"; }
network=$(grep -o 'Using network [A-Za-z][A-Za-z ]*' "$log" | head -n 1 | sed 's/^Using network //; s/ *$//')
provider=$(grep -o 'NET/OFI Selected Provider is [A-Za-z0-9_;]*' "$log" | head -n 1 | awk '{print $NF}')
plugin=$(grep -o 'NET/OFI Using aws-ofi-rccl[^ ]* *[0-9][0-9.]*' "$log" | head -n 1 | sed 's/^NET\/OFI Using //')
between=$(count 'via NET/')
gdr=$(count 'via NET/.*GDRDMA')
sockets=$(count 'via NET/Socket')
inside=$(count 'via P2P/')
shm=$(count 'via SHM')
warning=$(grep -m 1 -o 'NCCL WARN .*' "$log" || true)

if [[ -z $network ]]; then
  echo "transport: no RCCL initialisation in $log (NCCL_DEBUG=INFO unset, or the ranks did not use GPUs)${warning:+; first warning: $warning}"
elif ((sockets > 0)); then
  echo "transport: WARNING: TCP sockets between nodes (via NET/Socket on $sockets connection(s)): the aws-ofi-rccl plugin was not used, so RCCL speaks TCP over Slingshot, far below its RDMA speed; use LUMI's PyTorch container with its bindings (README, 'On LUMI')${warning:+; first warning: $warning}"
elif ((between > 0)); then
  echo "transport: between nodes RCCL used ${network} (${plugin:-plugin version not shown}, libfabric provider ${provider:-not shown}) on $between connection(s), $gdr of them with GPU-direct RDMA; inside nodes P2P/IPC on $inside, SHM on $shm"
elif ((inside + shm > 0)); then
  echo "transport: one node: the GCDs exchanged data directly, P2P/IPC on $inside connection(s) (Infinity Fabric), SHM on $shm; for other nodes RCCL had loaded ${network}${provider:+ (libfabric provider $provider)}"
else
  echo "transport: RCCL chose ${network}, but the log shows no connection (a single rank?)${warning:+; first warning: $warning}"
fi
