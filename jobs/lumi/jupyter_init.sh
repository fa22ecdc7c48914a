# Sourced by the Jupyter app of LUMI's web interface before it starts JupyterLab (form: "Settings:
# Advanced", "Custom init: Text"; README, "On LUMI"). The app runs `python -m jupyter lab` afterwards, so
# this leaves on PATH a `python` that has JupyterLab: the course's venv, inside LUMI's PyTorch container
# when COURSE_CONTAINER names its .sif image. COURSE_VENV chooses another venv than the checkout's .venv.
# Sourced into the app's shell: no `exit`, no `set -e` here.
course_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
export COURSE_VENV=${COURSE_VENV:-$course_root/.venv}

source "$course_root/jobs/lumi/private_tmp.sh"
# MIOpen's caches in a private folder in /tmp (memory of this session, emptied when it ends), filled from and
# saved back to COURSE_MIOPEN_CACHE (default ~/.cache/course-miopen) when the app's shell ends, and MIOpen's find
# mode made explicit, as in jobs/lumi/lumi_env.sh (which says why).
if MIOPEN_USER_DB_PATH=$(course_new_private_folder course-miopen); then
  export MIOPEN_USER_DB_PATH MIOPEN_CUSTOM_CACHE_DIR=$MIOPEN_USER_DB_PATH
  COURSE_MIOPEN_CACHE=${COURSE_MIOPEN_CACHE-${XDG_CACHE_HOME:-${HOME:-}/.cache}/course-miopen}
  if [[ -n $COURSE_MIOPEN_CACHE ]]; then
    course_keep_miopen_db "$MIOPEN_USER_DB_PATH" "$COURSE_MIOPEN_CACHE"
  fi
fi
export MIOPEN_FIND_MODE=${MIOPEN_FIND_MODE:-DYNAMIC_HYBRID}
# The inline %tensorboard cannot reach the compute node through the web interface's proxy:
# course_utils.observe.tensorboard.show() names the TensorBoard app instead.
export COURSE_TENSORBOARD_APP="the web interface's Apps > TensorBoard"
# sbatch from a notebook (08's 2-node job, 10's) bills the project this Jupyter session runs under, which
# Slurm names in SLURM_JOB_ACCOUNT; an SBATCH_ACCOUNT set before keeps its value.
if [[ -z "${SBATCH_ACCOUNT:-}" && -n "${SLURM_JOB_ACCOUNT:-}" ]]; then
  export SBATCH_ACCOUNT=$SLURM_JOB_ACCOUNT
fi
# The course's server configuration, as `make lab` uses it: notebooks are saved without outputs, so that
# running them leaves the checkout clean for the next `git pull`.
export JUPYTER_CONFIG_PATH="$course_root/jupyter${JUPYTER_CONFIG_PATH:+:$JUPYTER_CONFIG_PATH}"

if [[ -n "${COURSE_CONTAINER:-}" ]]; then
  if [[ -z "${SINGULARITY_BIND:-}" ]] && type module >/dev/null 2>&1; then
    module use /appl/local/laifs/modules && module load lumi-aif-singularity-bindings
  fi
  # `python` is jobs/lumi/course_python.sh: JupyterLab and its kernels run inside the container. Its folder
  # comes first on PATH, so it is private: nobody else can put another `python` there.
  if course_bin=$(course_new_private_folder course-bin) &&
      ln -s "$course_root/jobs/lumi/course_python.sh" "$course_bin/python"; then
    export PATH="$course_bin:$PATH"
  else
    echo "course environment: no private folder in ${TMPDIR:-/tmp} for the container's python" >&2
  fi
  unset course_bin
else
  source "$COURSE_VENV/bin/activate"
fi
unset course_root
unset -f course_new_private_folder course_private_folder course_keep_miopen_db
echo "course environment: $(command -v python) (COURSE_CONTAINER=${COURSE_CONTAINER:-none}, venv $COURSE_VENV)"
