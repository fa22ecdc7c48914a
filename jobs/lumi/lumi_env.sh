# Sourced by the LUMI-G job scripts: the course's environment on a LUMI-G node.
#
# A LUMI-G node has 4 MI250X modules, each two GCDs that the system shows as 8 GPUs, and a 64-core
# EPYC whose 8 CCDs each sit next to one GCD. One core per CCD is kept for the system, so a
# process gets 7 cores: --cpus-per-task=7 and the binding masks below, in GCD order.
cd "${SLURM_SUBMIT_DIR:-.}"
export COURSE_SIZE=${COURSE_SIZE:-workshop}

# CPU binding: task i (GCD i) on cores 1-7 of the CCD attached to GCD i (from LUMI's documentation);
# CPU_BIND=none in the environment turns it off (a node that is not LUMI-G).
export CPU_BIND=${CPU_BIND:-"mask_cpu:fe000000000000,fe00000000000000,fe0000,fe000000,fe,fe00,fe00000000,fe0000000000"}

# MIOpen's kernel databases on node-local storage: the shared file system is slow and locks.
export MIOPEN_USER_DB_PATH="/tmp/${USER:-$(id -un)}-miopen-${SLURM_JOB_ID}"
export MIOPEN_CUSTOM_CACHE_DIR="${MIOPEN_USER_DB_PATH}"

# RCCL between nodes over Slingshot's high-speed interfaces, with GPU-direct RDMA.
export NCCL_SOCKET_IFNAME=hsn0,hsn1,hsn2,hsn3
export NCCL_NET_GDR_LEVEL=PHB
# One thread per process for PyTorch's CPU work; the 7 cores feed the DataLoader workers.
export OMP_NUM_THREADS=1
