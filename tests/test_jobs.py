"""Job scripts must be valid bash and call the course's entry point with flags it knows; the cloud recipe's
failures are told (its run for real as two 'VMs' on this machine is test_imagenet_prep.py's)."""

import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from course_utils.config import checkout_root
from course_utils.doctor.allreduce import build_parser as allreduce_parser
from course_utils.doctor.interconnect_health import build_parser as health_parser
from course_utils.training.options import build_parser as train_parser

SCRIPTS = sorted(p for p in (checkout_root() / "jobs").rglob("*") if p.suffix in (".sbatch", ".sh"))
ENTRY_POINTS = {"course_utils.train": train_parser(), "course_utils.doctor.allreduce": allreduce_parser(),
                "course_utils.doctor.interconnect_health": health_parser()}


def _flags(script: Path, module: str) -> list[str]:
    """The --flags given to `-m module`, following line continuations."""
    text = script.read_text().replace("\\\n", " ")
    commands = [line.split(module, 1)[1] for line in text.splitlines() if f"-m {module}" in line]
    return [flag for command in commands for flag in re.findall(r"(?<!\S)(--[a-z][a-z-]*)", command)]


def test_there_are_job_scripts():
    assert any(script.suffix == ".sbatch" for script in SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(checkout_root())))
def test_job_script(script):
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    called = [module for module in ENTRY_POINTS if f"-m {module}" in script.read_text()]
    if script.suffix == ".sbatch" or script.name == "run_node.sh":
        assert called, "a job must call the course's entry points, never a copy of the loop"
    for module in called:
        known = {flag for action in ENTRY_POINTS[module]._actions for flag in action.option_strings}
        flags = _flags(script, module)
        assert set(flags) <= known, f"unknown flags for {module}: {set(flags) - known}"


# ROCm's profilers that reach end of support by the end of 2026 Q2 (ROCProfiler's documentation): rocprofv3 replaces
# them. A script may name them in its comments, never run them.
PAST_SUPPORT = {"rocprof", "rocprofv2", "rocsys", "roctracer"}


def _commands_run(script: Path) -> set[str]:
    """The words of a script's code (comments left out) that name a program: a bare name or a path in a bin/."""
    code = re.sub(r"(?m)(^|\s)#.*$", "", script.read_text())
    words = re.split(r"[\s'\"`;|&(){}]+", code)
    return {Path(word).name for word in words if "/" not in word or Path(word).parent.name == "bin"}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(checkout_root())))
def test_no_job_falls_back_to_a_profiler_past_its_end_of_support(script):
    assert not _commands_run(script) & PAST_SUPPORT


def _rocprof_job(tmp_path: Path, *programs: str) -> subprocess.CompletedProcess:
    """jobs/profiling/rocprof_lumi.sbatch run by bash as Slurm runs it, in a copy of jobs/ with a venv, on a PATH
    where ``programs`` are stand-ins and srun prints the command it was given."""
    shutil.copytree(checkout_root() / "jobs", tmp_path / "jobs")
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in [("srun", 'printf "%s\\n" "$@"\n'), *((program, "exit 0\n") for program in programs)]:
        (bin_dir / name).write_text(f"#!/bin/bash\n{text}")
        (bin_dir / name).chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path), "USER": "learner", "TMPDIR": str(tmp_path),
           "SLURM_SUBMIT_DIR": str(tmp_path), "SLURM_JOB_ID": "4242"}
    return subprocess.run(["bash", "jobs/profiling/rocprof_lumi.sbatch", "--batch-size", "64"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)


def test_the_rocm_profiling_job_runs_rocprofv3_around_the_training_command(tmp_path):
    job = _rocprof_job(tmp_path, "rocprofv3")
    assert job.returncode == 0, job.stderr
    found, *srun, said = job.stdout.splitlines()
    assert found == f"profiler: {tmp_path / 'bin' / 'rocprofv3'}" and said == "trace: runs/rocprof/4242"
    assert srun[:3] == ["jobs/lumi/course_python.sh", "--exec", str(tmp_path / "bin" / "rocprofv3")]
    assert srun[srun.index("--output-format") + 1:srun.index("-d")] == ["pftrace", "csv"]
    assert srun[srun.index("--") + 1:srun.index("--") + 4] == ["python", "-m", "course_utils.train"]
    assert srun[-2:] == ["--batch-size", "64"]


@pytest.mark.skipif(Path("/opt/rocm/bin/rocprofv3").exists(), reason="this machine has ROCm's rocprofv3")
def test_the_rocm_profiling_job_stops_where_only_the_old_profilers_are(tmp_path):
    job = _rocprof_job(tmp_path, "rocprof", "rocprofv2")
    assert job.returncode == 1 and "no rocprofv3 in the course's environment" in job.stderr, job.stderr
    assert "course_python.sh" not in job.stdout  # srun never ran




def test_cloud_recipe_without_head_names_it():
    env = {k: v for k, v in os.environ.items() if k != "HEAD"}
    result = subprocess.run(["jobs/cloud/run_node.sh"], cwd=checkout_root(), env=env, capture_output=True, text=True)
    assert result.returncode != 0 and "set HEAD to the address of the first VM" in result.stderr


def test_cloud_recipe_stops_and_says_so_when_nvidia_smi_hangs(tmp_path):
    """A hanging GPU driver makes nvidia-smi hang; the node's start must not hang with it, silently."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/bash\nexec sleep 600\n")  # as a driver that never answers
    (bin_dir / "nvidia-smi").chmod(0o755)
    environment = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "HEAD": "127.0.0.1",
                   "NVIDIA_SMI_TIMEOUT": "2"}
    result = subprocess.run(["jobs/cloud/run_node.sh"], cwd=checkout_root(), env=environment, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 1 and "nvidia-smi did not answer in 2 s" in result.stderr, result.stderr


def _container_command(tmp_path, runtime, **env):
    """The command line jobs/cloud/ngc.sh gives ``runtime``, read by a stand-in that prints its arguments
    (neither Docker nor Apptainer runs on the CI machine)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / runtime).write_text('#!/bin/bash\nprintf "%s\\n" "$@"\n')
    (bin_dir / runtime).chmod(0o755)
    environment = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "COURSE_CONTAINER_RUNTIME": runtime, **env}
    result = subprocess.run(["jobs/cloud/ngc.sh", "jobs/cloud/run_node.sh", "--epochs", "1"], cwd=checkout_root(),
                            env=environment, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_ngc_container_gets_the_gpus_the_host_network_and_the_recipe_variables(tmp_path):
    args = _container_command(tmp_path, "docker", HEAD="10.0.0.4", NNODES="2", NCCL_SOCKET_IFNAME="ens5")
    assert args[:7] == ["run", "--rm", "--gpus", "all", "--ipc=host", "--network", "host"]
    assert {"HEAD", "NNODES", "NCCL_SOCKET_IFNAME", "COURSE_VENV"} <= {args[i + 1] for i, a in enumerate(args)
                                                                       if a == "-e"}
    assert f"{checkout_root()}:{checkout_root()}" in args and "-p" not in args  # nothing published to the internet
    assert args[-4:] == ["nvcr.io/nvidia/pytorch:25.12-py3", "jobs/cloud/run_node.sh", "--epochs", "1"]


def test_ngc_container_through_apptainer(tmp_path):
    args = _container_command(tmp_path, "apptainer", COURSE_NGC_IMAGE="ngc.sif")
    assert args[:3] == ["exec", "--nv", "--bind"] and args[-4] == "ngc.sif"


def test_course_requirements_leave_the_containers_packages_and_constrained_pins_to_it(tmp_path):
    constraints = tmp_path / "constraint.txt"
    constraints.write_text("# the container's\nnumpy==2.1.0\nJupyterLab==4.2.5\ntorch==2.10.0a0\n")
    result = subprocess.run([sys.executable, "jobs/course_requirements.py", "--without", "torch", "torchvision",
                             "nvidia-dali", "--constraints", str(constraints)], cwd=checkout_root(),
                            capture_output=True, text=True, check=True)
    lines = result.stdout.split()
    assert "numpy" in lines and "jupyterlab" in lines and "pandas==3.1.1" in lines
    assert not any(line.startswith(("torch", "nvidia-dali")) for line in lines)
    assert "numpy==2.4.6" in result.stderr


# What LUMI's container maintainers list as a cause of hangs (lumi-ai-factory/laifs-container-recipes #28, #30).
HANGS_ON_LUMI = ("NCCL_NET_GDR_LEVEL",)


def _lumi_job(tmp_path: Path, body: str, **extra: str) -> subprocess.CompletedProcess:
    """A LUMI job script's shell, its home in ``tmp_path``: jobs/lumi/lumi_env.sh sourced by bash as a job does (no
    module command here), then ``body``; it ends as a job does, through its EXIT trap."""
    script = checkout_root() / "jobs" / "lumi" / "lumi_env.sh"
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "USER": "learner", "SLURM_SUBMIT_DIR": str(tmp_path),
           "SLURM_JOB_ID": f"{os.getpid()}", "TMPDIR": str(tmp_path), **extra}
    return subprocess.run(["bash", "-c", f"set -euo pipefail; source {script}; {body}"], env=env,
                          capture_output=True, text=True)


def _lumi_environment(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The variables jobs/lumi/lumi_env.sh leaves set."""
    job = _lumi_job(tmp_path, "env -0", **extra)
    assert job.returncode == 0, job.stderr
    return dict(entry.split("=", 1) for entry in job.stdout.split("\0") if "=" in entry)


def test_the_lumi_environment_sets_nothing_known_to_hang_and_records_what_it_sets(tmp_path):
    env = _lumi_environment(tmp_path)
    assert not set(HANGS_ON_LUMI) & set(env), "RCCL finds the GPU-direct level itself (jobs/lumi/SETTINGS.md)"
    assert env["NCCL_SOCKET_IFNAME"] == "hsn0,hsn1,hsn2,hsn3"
    settings = (checkout_root() / "jobs" / "lumi" / "SETTINGS.md").read_text()
    exported = re.findall(r"\b([A-Z][A-Z0-9_]+)=", (checkout_root() / "jobs" / "lumi" / "lumi_env.sh").read_text())
    unrecorded = {name for name in exported if name in env and not name.startswith("COURSE_")
                  and f"`{name}" not in settings}
    assert not unrecorded, f"set by lumi_env.sh but not in jobs/lumi/SETTINGS.md: {unrecorded}"


def _private(folder: Path) -> bool:
    """A folder, not a link, of this user, that only they may enter."""
    status = folder.lstat()
    return stat.S_ISDIR(status.st_mode) and status.st_uid == os.getuid() and stat.S_IMODE(status.st_mode) == 0o700


def test_lumi_s_miopen_folder_is_private_and_its_name_cannot_be_guessed(tmp_path):
    """Two jobs with the same user and job id (all another user could guess) get two private folders."""
    environments = [_lumi_environment(tmp_path) for _ in range(2)]
    folders = [Path(env["MIOPEN_USER_DB_PATH"]) for env in environments]
    assert folders[0] != folders[1] and all(folder.parent == tmp_path and _private(folder) for folder in folders)
    assert all(env["MIOPEN_CUSTOM_CACHE_DIR"] == env["MIOPEN_USER_DB_PATH"] for env in environments)
    kept = tmp_path / "scratch" / "miopen"  # COURSE_MIOPEN_CACHE: the kernels of earlier jobs, copied in
    kept.mkdir(parents=True, mode=0o755)
    (kept / "gfx90a.ukdb").write_text("kernels")
    folder = Path(_lumi_environment(tmp_path, COURSE_MIOPEN_CACHE=str(kept))["MIOPEN_USER_DB_PATH"])
    assert _private(folder) and (folder / "gfx90a.ukdb").read_text() == "kernels"


# What MIOpen writes in its folder: its user find database, its user performance database, its kernel cache.
MIOPEN_WRITES = {"gfx90a_110.HIP.3_5_1_5b3c0c3.ufdb.txt": "found", "gfx90a_110_3.udb": "tuned",
                 "gfx90a_110.ukdb": "kernels"}


def test_what_miopen_found_is_kept_for_the_next_job_and_nothing_else(tmp_path):
    """Kept in the user's home; not a file of another program, a link, or a database left in the middle of a
    write (its -journal beside it); and the job's exit status stays its own."""
    writes = "; ".join(f'echo {text} > "$MIOPEN_USER_DB_PATH/{name}"' for name, text in MIOPEN_WRITES.items())
    job = _lumi_job(tmp_path, f'{writes}; cd "$MIOPEN_USER_DB_PATH"; echo half > half.ukdb; : > half.ukdb-journal; '
                              "echo notes > notes.txt; ln -s /etc/passwd planted.ukdb; exit 3")
    assert job.returncode == 3, job.stderr
    assert "MIOpen: 3 files of its find database and kernels kept in" in job.stderr
    kept = tmp_path / ".cache" / "course-miopen"
    assert _private(kept) and {path.name: path.read_text().strip() for path in kept.iterdir()} == MIOPEN_WRITES
    following = Path(_lumi_environment(tmp_path)["MIOPEN_USER_DB_PATH"])
    assert {path.name for path in following.iterdir()} == set(MIOPEN_WRITES)


def test_a_kept_folder_that_cannot_be_used_is_named_and_the_job_goes_on(tmp_path, shared_tmp):
    """A link, a folder where a copy cannot land, a folder another user made."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "gfx90a_110.ukdb").write_text("not the job's")
    (tmp_path / "linked").symlink_to(elsewhere)
    job = _lumi_job(tmp_path, 'ls "$MIOPEN_USER_DB_PATH"; echo k > "$MIOPEN_USER_DB_PATH/gfx90a_110.ukdb"',
                    COURSE_MIOPEN_CACHE=str(tmp_path / "linked"))
    assert job.returncode == 0 and job.stdout == "", job.stderr  # nothing read from it
    assert "linked is not a folder (a link, or a file): not used" in job.stderr
    assert [path.read_text() for path in elsewhere.iterdir()] == ["not the job's"]  # nothing written through it
    blocked = tmp_path / "blocked"
    (blocked / "gfx90a_110.ukdb").mkdir(parents=True)  # where the copy goes, something it cannot replace
    job = _lumi_job(tmp_path, 'echo k > "$MIOPEN_USER_DB_PATH/gfx90a_110.ukdb"', COURSE_MIOPEN_CACHE=str(blocked))
    assert job.returncode == 0 and f"could not copy what this job found into {blocked}" in job.stderr
    foreign = shared_tmp / "course-miopen"  # made first by another user
    _as_nobody("mkdir", "-m", "777", str(foreign))
    job = _lumi_job(tmp_path, "true", COURSE_MIOPEN_CACHE=str(foreign))
    assert job.returncode == 0 and f"{foreign} belongs to user {pwd.getpwnam('nobody').pw_uid}" in job.stderr


def test_miopen_s_find_mode_is_explicit_and_one_set_before_is_kept(tmp_path):
    assert _lumi_environment(tmp_path)["MIOPEN_FIND_MODE"] == "DYNAMIC_HYBRID"
    assert _lumi_environment(tmp_path, MIOPEN_FIND_MODE="FAST")["MIOPEN_FIND_MODE"] == "FAST"


def test_the_jupyter_session_keeps_what_miopen_found_and_the_app_s_own_exit_trap(tmp_path):
    """jobs/lumi/jupyter_init.sh, sourced into the app's shell, which may have an EXIT trap of its own."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "activate").write_text("")  # the venv (COURSE_VENV)
    init = checkout_root() / "jobs" / "lumi" / "jupyter_init.sh"
    session = subprocess.run(["bash", "-c", f"trap 'echo the app ends' EXIT; source {init} >/dev/null; "
                              'echo k > "$MIOPEN_USER_DB_PATH/gfx90a_110.ukdb"; echo "$MIOPEN_FIND_MODE"'],
                             env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), "COURSE_VENV": str(tmp_path),
                                  "TMPDIR": str(tmp_path)}, capture_output=True, text=True)
    assert session.returncode == 0 and session.stdout.splitlines() == ["DYNAMIC_HYBRID", "the app ends"]
    assert (tmp_path / ".cache" / "course-miopen" / "gfx90a_110.ukdb").read_text() == "k\n"


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A folder like a node's /tmp: every user may make folders in it."""
    folder = Path(tempfile.mkdtemp(prefix="course-node-tmp-"))
    folder.chmod(0o1777)
    yield folder
    shutil.rmtree(folder)


def _as_nobody(*command: str) -> None:
    """Run ``command`` as a second user, ``nobody``."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to act as a second user")
    other = pwd.getpwnam("nobody")
    subprocess.run(["setpriv", f"--reuid={other.pw_uid}", f"--regid={other.pw_gid}", "--clear-groups", "--",
                    *command], check=True)


def _course_python(tmp_path: Path, miopen: Path) -> subprocess.CompletedProcess:
    """jobs/lumi/course_python.sh as a task of a job starts it, with MIOpen's folder at ``miopen``."""
    (tmp_path / "venv").mkdir(exist_ok=True)
    return subprocess.run([str(checkout_root() / "jobs" / "lumi" / "course_python.sh"), "--exec", "true"],
                          env={"PATH": os.environ["PATH"], "COURSE_VENV": str(tmp_path / "venv"),
                               "MIOPEN_USER_DB_PATH": str(miopen)}, capture_output=True, text=True)


def test_a_task_on_another_node_makes_miopen_s_folder_private_or_refuses_one_it_did_not_make(tmp_path, shared_tmp):
    miopen = shared_tmp / "course-miopen.Qx7Zp0aLm2"  # the name lumi_env.sh made on the job's first node
    assert _course_python(tmp_path, miopen).returncode == 0 and _private(miopen)
    assert _course_python(tmp_path, miopen).returncode == 0  # the node's next task uses it
    miopen.chmod(0o755)
    refused = _course_python(tmp_path, miopen)
    assert refused.returncode == 1 and "with mode 755, not to you" in refused.stderr
    foreign = shared_tmp / "course-miopen.guessed"
    _as_nobody("mkdir", "-m", "777", str(foreign))  # made first by another user of the node
    refused = _course_python(tmp_path, foreign)
    assert refused.returncode == 1 and f"{foreign} belongs to user {pwd.getpwnam('nobody').pw_uid}" in refused.stderr


def test_the_container_gets_the_ai_guides_registration_cache_monitor_and_keeps_one_chosen_before(tmp_path):
    """LUMI's AI guide sets FI_MR_CACHE_MONITOR=userfaultfd against hangs in LUMI AI Factory's containers; the
    job scripts and the Jupyter app's `python` enter the container through course_python.sh."""
    bin_folder = tmp_path / "bin"
    bin_folder.mkdir()
    (bin_folder / "singularity").write_text('#!/bin/sh\nshift 2  # run IMAGE: the command runs as in the image\n'
                                            'exec "$@"\n')
    (bin_folder / "singularity").chmod(0o755)
    (tmp_path / "venv").mkdir()

    def environment(**extra: str) -> dict[str, str]:
        script = checkout_root() / "jobs" / "lumi" / "course_python.sh"
        printed = subprocess.run([str(script), "--exec", "env", "-0"],
                                 env={"PATH": f"{bin_folder}:{os.environ['PATH']}",
                                      "COURSE_VENV": str(tmp_path / "venv"), **extra},
                                 capture_output=True, text=True, check=True).stdout
        return dict(entry.split("=", 1) for entry in printed.split("\0") if "=" in entry)

    in_container = environment(COURSE_CONTAINER="image.sif")
    assert in_container["FI_MR_CACHE_MONITOR"] == "userfaultfd"
    assert "CUDA_LAUNCH_BLOCKING" not in in_container  # the workaround of laifs #20 slows every kernel: not a default
    assert environment(COURSE_CONTAINER="image.sif", FI_MR_CACHE_MONITOR="kdreg2")["FI_MR_CACHE_MONITOR"] == "kdreg2"
    assert "FI_MR_CACHE_MONITOR" not in environment()  # PyTorch's ROCm wheels: no LUMI AI Factory container
    assert "`FI_MR_CACHE_MONITOR=userfaultfd`" in (checkout_root() / "jobs" / "lumi" / "SETTINGS.md").read_text()


def test_the_jupyter_app_s_python_comes_from_a_folder_no_other_user_can_write(tmp_path):
    """Another user of the node makes the folder the Jupyter app's init used to put first on PATH (its name was
    the user's and the job's), with a `python` of theirs in it."""
    job = f"{os.getpid()}{time.monotonic_ns()}"
    guessed = Path("/tmp") / f"learner-course-bin-{job}"
    try:
        _as_nobody("mkdir", "-m", "777", str(guessed))
        _as_nobody("sh", "-c", f"printf '#!/bin/sh\\necho not the course\\n' > {guessed}/python; chmod 755 "
                   f"{guessed}/python")
        (tmp_path / "bin").mkdir()
        init = checkout_root() / "jobs" / "lumi" / "jupyter_init.sh"
        said = subprocess.run(["bash", "-c", f"source {init} >/dev/null; echo $PATH; command -v python"],
                              env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), "USER": "learner",
                                   "SLURM_JOB_ID": job, "COURSE_VENV": str(tmp_path), "COURSE_CONTAINER": "x.sif",
                                   "TMPDIR": str(tmp_path)},
                              capture_output=True, text=True, check=True).stdout.split()
        first = Path(said[0].split(":")[0])
        assert first.parent == tmp_path and _private(first), said
        assert Path(said[1]) == first / "python" and (first / "python").resolve() == init.with_name("course_python.sh")
    finally:
        shutil.rmtree(guessed, ignore_errors=True)


def test_the_readmes_container_is_the_image_the_settings_were_checked_against():
    texts = "".join((checkout_root() / name).read_text() for name in ("README.md", "docs/lumi_day_card.md"))
    images = set(re.findall(r"COURSE_CONTAINER=\S*/(lumi-multitorch-full-[\w-]+\.sif)", texts))
    assert images == {"lumi-multitorch-full-u24r70f21m50t210-20260415_130625.sif"}
    assert images.pop() in (checkout_root() / "jobs" / "lumi" / "SETTINGS.md").read_text()
