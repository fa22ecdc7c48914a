# Sourced by jobs/lumi/lumi_env.sh, course_python.sh, jupyter_init.sh and miopen_db.sh: the course's folders in
# /tmp (MIOpen's caches, the `python` of the Jupyter app) are private. /tmp on a node is shared by every user with
# a job there: a folder of a name one can guess (user name and job id) can be made first by another user, and
# `mkdir -p` accepts it; they could then change what the course runs or reads from it. As LUMI's AI guide did for
# MIOpen (Lumi-supercomputer/LUMI-AI-Guide, 01-quickstart/run.sh: `MIOPEN_DIR=$(mktemp -d)`, before its PR #108
# named the folders after the user), a folder is made by `mktemp -d`: a name nobody can guess, mode 700. A task on
# another node makes the same name there, and uses a folder found under it only when it is this user's, mode 700
# and not a link.
# Sourced into other scripts: functions only, no `exit`, no `set -e`.

# course_new_private_folder LABEL: make a new private folder in ${TMPDIR:-/tmp} and print its path (in TMPDIR when
# it is set, as mktemp and the guide do: keep it on the node, since MIOpen's locks fail on Lustre).
course_new_private_folder() {
  mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXXXXXX"
}

# course_private_folder DIR: make DIR with mode 700, or, when something is there already, accept it only as a
# folder (not a link) of this user with mode 700; else say why and return 1.
course_private_folder() {
  local dir=$1 owner mode
  if mkdir -m 700 -- "$dir" 2>/dev/null; then
    return 0
  fi
  if [[ -L $dir || ! -d $dir ]]; then
    echo "course: $dir is not a folder (a link, or a file): not used; remove it if it is yours, else tell the" \
      "system's administrators" >&2
    return 1
  fi
  owner=$(stat -c %u -- "$dir") mode=$(stat -c %a -- "$dir")
  if [[ $owner != "$(id -u)" || $mode != 700 ]]; then
    echo "course: $dir belongs to user $owner with mode $mode, not to you ($(id -u)) with mode 700: another user" \
      "may have made it, so it is not used; remove it if it is yours, else tell the system's administrators" >&2
    return 1
  fi
}

# course_keep_miopen_db LIVE KEPT: fill MIOpen's private folder LIVE with what earlier jobs found (kept in KEPT),
# and copy back what MIOpen wrote when this shell ends: an EXIT trap, run before one set earlier, which is kept.
# jobs/lumi/miopen_db.sh, beside this file, copies; it never fails the job. (This file is sourced by its absolute
# path, so that BASH_SOURCE still finds miopen_db.sh after a `cd`.)
course_keep_miopen_db() {
  local db earlier
  db=$(dirname "${BASH_SOURCE[0]}")/miopen_db.sh
  bash "$db" seed "$1" "$2"
  earlier=$(trap -p EXIT)  # trap -- 'COMMAND' EXIT
  earlier=${earlier#"trap -- "}
  eval "earlier=${earlier%" EXIT"}"
  trap -- "$(printf '%q ' bash "$db" save "$1" "$2")|| true${earlier:+; $earlier}" EXIT
}
