#!/bin/bash
# What MIOpen found, kept from one job to the next (run by course_keep_miopen_db in jobs/lumi/private_tmp.sh):
#
#   jobs/lumi/miopen_db.sh seed LIVE KEPT    at the job's start: what earlier jobs found, from KEPT into LIVE
#   jobs/lumi/miopen_db.sh save LIVE KEPT    at the job's end: what MIOpen wrote in LIVE, back into KEPT
#
# LIVE is the job's private folder in the node's /tmp, where MIOpen reads and writes (its file locks fail on
# Lustre); KEPT is a private folder of the user that only this script copies to and from. Only MIOpen's own files
# move: its user find database (*.ufdb.txt), its user performance database (*.udb, *.udb.txt) and its kernel
# cache (*.ukdb); regular files only, never a link, and never a database a process left in the middle of a write
# (its -journal or -wal beside it). Each lands whole, under a temporary name first. A copy that fails says so and
# leaves the job alone: it exits 0, and the next job searches again.
set -uo pipefail
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/private_tmp.sh"

# miopen_files FOLDER: MIOpen's own files in FOLDER, NUL-separated.
miopen_files() {
  local file
  [[ -d $1 && ! -L $1 ]] || return 0
  while IFS= read -r -d '' file; do
    [[ -e $file-journal || -e $file-wal ]] || printf '%s\0' "$file"
  done < <(find "$1" -maxdepth 1 -type f \( -name '*.ufdb.txt' -o -name '*.udb' -o -name '*.udb.txt' \
                                            -o -name '*.ukdb' \) -print0)
}

# copy_files FROM TO: each of MIOpen's files in FROM into TO, whole; prints how many.
copy_files() {
  local file temporary count=0
  while IFS= read -r -d '' file; do
    temporary=$(mktemp "$2/.incoming.XXXXXXXXXX") || return 1
    if ! cp -- "$file" "$temporary" || ! mv -fT -- "$temporary" "$2/${file##*/}"; then
      rm -f -- "$temporary"
      return 1
    fi
    count=$((count + 1))
  done < <(miopen_files "$1")
  echo "$count"
}

# kept_folder KEPT: KEPT made, or accepted, as the user's private folder (a folder of theirs is made mode 700).
kept_folder() {
  mkdir -p -- "$(dirname -- "$1")" 2>/dev/null
  if [[ -d $1 && ! -L $1 && $(stat -c %u -- "$1") == "$(id -u)" ]]; then
    chmod 700 -- "$1"
  fi
  course_private_folder "$1"
}

if [[ $# != 3 || ! $1 =~ ^(seed|save)$ ]]; then
  echo "usage: $0 seed|save LIVE KEPT" >&2
  exit 2
fi
action=$1 live=$2 kept=$3
if ! kept_folder "$kept"; then
  echo "MIOpen: nothing kept between jobs in $kept this time (above: why); COURSE_MIOPEN_CACHE names another" \
    "folder, empty keeps none" >&2
  exit 0
fi
if [[ $action == seed ]]; then
  if count=$(copy_files "$kept" "$live"); then
    ((count == 0)) || echo "MIOpen: $count files of earlier jobs' searches from $kept" >&2
  else
    echo "MIOpen: could not copy $kept into $live: this job searches again" >&2
  fi
elif count=$(copy_files "$live" "$kept"); then
  ((count == 0)) || echo "MIOpen: $count files of its find database and kernels kept in $kept for the next job" >&2
else
  echo "MIOpen: could not copy what this job found into $kept (full, or not writable?): the next job searches" \
    "again" >&2
fi
exit 0
