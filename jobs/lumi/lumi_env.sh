# Sourced by the LUMI-G job scripts: the course's environment on a LUMI-G node.
#
# A LUMI-G node has 4 MI250X modules, each two GCDs that the system shows as 8 GPUs, and a 64-core
# EPYC whose 8 CCDs each sit next to one GCD. One core per CCD is kept for the system, so a
# process gets 7 cores: --cpus-per-task=7 and the binding masks below, in GCD order.
#
# The course's Python is the venv inside LUMI's PyTorch container when COURSE_CONTAINER names its .sif
# image, else the venv made with PyTorch's ROCm wheels (README, "On LUMI"; jobs/lumi/course_python.sh).
# Sources: LUMI user guide (docs.lumi-supercomputer.eu: runjobs/scheduled-jobs/distribution-binding,
# software/packages/pytorch, laif/software/ai-environment, storage) and the LUMI AI guide.
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/private_tmp.sh"
cd "${SLURM_SUBMIT_DIR:-.}"
export COURSE_SIZE=${COURSE_SIZE:-workshop}

# CPU binding: task i (GCD i) on cores 1-7 of the CCD attached to GCD i (from LUMI's documentation);
# CPU_BIND=none in the environment turns it off (a node that is not LUMI-G).
export CPU_BIND=${CPU_BIND:-"mask_cpu:fe000000000000,fe00000000000000,fe0000,fe000000,fe,fe00,fe00000000,fe0000000000"}

# The container's bindings: LUMI AI Factory's module binds the file systems (/scratch, /project, /flash,
# /appl...) and what Slurm needs into the container. Loaded here when the job did not bring it along.
if [[ -n "${COURSE_CONTAINER:-}" && -z "${SINGULARITY_BIND:-}" ]] && type module >/dev/null 2>&1; then
  case $- in *u*) _course_u=1 ;; *) _course_u= ;; esac
  set +u  # Lmod's shell function reads unset variables
  module use /appl/local/laifs/modules && module load lumi-aif-singularity-bindings ||
    echo "lumi_env: lumi-aif-singularity-bindings did not load; course_python.sh binds the file systems itself" >&2
  [[ -n $_course_u ]] && set -u
  unset _course_u
fi

# MIOpen's kernel cache and its user databases (what its searches found) in /tmp, one private folder per job
# (jobs/lumi/private_tmp.sh: made by mktemp -d): MIOpen's file locking does not work on Lustre (/scratch,
# /project, /home), and a folder per job never meets a stale or foreign one. The job's tasks on other nodes make
# the same folder there (course_python.sh). /tmp on a LUMI compute node is memory counted in the job's
# allocation and emptied when the job ends, so what MIOpen found is kept in COURSE_MIOPEN_CACHE, a private folder
# of the user (default ~/.cache/course-miopen: MIOpen's own default is ~/.cache and ~/.config, and what it finds
# depends on the user's GCDs and image, not on a checkout or a project; home outlives a project's scratch):
# copied in when the job starts and back when the job script ends, the first node's (jobs/lumi/miopen_db.sh).
# The next job, or the next torchrun rank of a lesson, then takes MIOpen's answers from its find database
# instead of searching again. COURSE_MIOPEN_CACHE names another folder (on scratch, for a tight home quota);
# empty, it keeps nothing.
MIOPEN_USER_DB_PATH=$(course_new_private_folder course-miopen)
export MIOPEN_USER_DB_PATH MIOPEN_CUSTOM_CACHE_DIR=$MIOPEN_USER_DB_PATH
COURSE_MIOPEN_CACHE=${COURSE_MIOPEN_CACHE-${XDG_CACHE_HOME:-${HOME:-}/.cache}/course-miopen}
if [[ -n $COURSE_MIOPEN_CACHE ]]; then
  course_keep_miopen_db "$MIOPEN_USER_DB_PATH" "$COURSE_MIOPEN_CACHE"
fi
# MIOpen's find mode, explicit: DYNAMIC_HYBRID, MIOpen's default (5). A shape its find database knows is taken
# from it; a new one is searched over MIOpen's dynamic kernels only, and recorded. Not FAST (2), which answers a
# new shape from heuristics without timing it: a quicker start, slower kernels (MIOpen's find-and-immediate
# page), and the lessons measure throughput. With cudnn.benchmark on, PyTorch sets NORMAL itself for each
# convolution (the course leaves it off on ROCm: course_utils.devices.conv_autotune). A value set before is kept.
export MIOPEN_FIND_MODE=${MIOPEN_FIND_MODE:-DYNAMIC_HYBRID}

# RCCL between nodes over Slingshot: its four high-speed interfaces for RCCL's own sockets (bootstrap; it
# must not try the management network). The aws-ofi plugin (libfabric, CXI provider) carries the traffic;
# LUMI AI Factory's images have it, and NCCL_DEBUG=INFO shows whether it was used (jobs/lumi/allreduce.sbatch).
# NCCL_NET_GDR_LEVEL is left to RCCL, which finds GPU-direct RDMA from the PCI topology: set to PHB or SYS
# it makes multi-node jobs hang in the ROCm 7.0 image (LUMI AI Factory's container recipes, open issue #30,
# seen as an init stuck after "Connected all rings", #28), and LUMI's AI guide dropped it with no loss of
# speed. Which image each setting here was checked against: jobs/lumi/SETTINGS.md.
export NCCL_SOCKET_IFNAME=hsn0,hsn1,hsn2,hsn3
# libfabric's CXI provider with processes that fork (DataLoader workers), as LUMI's PyTorch page sets them.
export CXI_FORK_SAFE=1 CXI_FORK_SAFE_HP=1 FI_CXI_DISABLE_CQ_HUGETLB=1
# One thread per process for PyTorch's CPU work; the 7 cores feed the DataLoader workers.
export OMP_NUM_THREADS=1
