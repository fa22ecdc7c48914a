#!/bin/bash
# The course's Python on LUMI: the venv inside LUMI's PyTorch container when COURSE_CONTAINER names its
# .sif image (README, "On LUMI"), else the venv made with PyTorch's ROCm wheels. COURSE_VENV chooses
# another venv than .venv.
#
#   jobs/lumi/course_python.sh -m course_utils.train ...     python with these arguments
#   jobs/lumi/course_python.sh --exec rocprofv3 ... -- python -m ...
#                                                            any command, with the venv first on PATH
#
# In the container it runs through `singularity run` (LUMI AI Factory images prepare their environment
# there, then run the command given), with the file systems bound by the lumi-aif-singularity-bindings
# module (jobs/lumi/lumi_env.sh loads it) or, without it, by the bindings LUMI documents.
set -euo pipefail
# (Through the link the Jupyter app puts on PATH as `python`: the folder of the script itself.)
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/private_tmp.sh"
# MIOpen's private folder of this job (jobs/lumi/lumi_env.sh made it on the first node): made on this node, or
# checked to be this user's before MIOpen writes there.
if [[ -n "${MIOPEN_USER_DB_PATH:-}" ]]; then
  course_private_folder "$MIOPEN_USER_DB_PATH"
fi
venv=${COURSE_VENV:-.venv}
if [[ ! -d $venv ]]; then
  echo "course_python: no venv at $venv (make it with jobs/lumi/setup_venv.sh; README, 'On LUMI')" >&2
  exit 1
fi
venv=$(cd "$venv" && pwd)
if [[ "${1:-}" == --exec ]]; then
  shift
else
  set -- "$venv/bin/python" "$@"
fi
if [[ -n "${COURSE_CONTAINER:-}" ]]; then
  export SINGULARITY_BIND=${SINGULARITY_BIND:-/pfs,/scratch,/projappl,/project,/flash,/appl}
  # libfabric's memory-registration cache watched by userfaultfd, as LUMI's AI guide sets it against hangs in LUMI AI
  # Factory's containers (jobs/lumi/SETTINGS.md); a monitor chosen before (kdreg2) is kept.
  export FI_MR_CACHE_MONITOR=${FI_MR_CACHE_MONITOR:-userfaultfd}
  exec singularity run "$COURSE_CONTAINER" \
    bash -c 'export VIRTUAL_ENV="$0" PATH="$0/bin:$PATH" && exec "$@"' "$venv" "$@"
fi
export VIRTUAL_ENV=$venv PATH="$venv/bin:$PATH"
exec "$@"
