import os
import subprocess
import sys

import pytest
import torch

from course_utils import devices


def test_a_machine_without_gpus_trains_on_the_cpu_with_gloo(monkeypatch):
    """What a laptop or a CPU-only CI runner gets, on any machine: torch is told it sees no GPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    acc = devices.detect()
    assert acc.kind == "cpu" and acc.backend == "gloo" and not acc.has_gpu
    assert devices.distributed_backend() == "gloo" and devices.default_device() == torch.device("cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a visible GPU")
def test_a_gpu_machine_uses_nccl_over_every_visible_gpu():
    acc = devices.detect()
    assert acc.kind in ("cuda", "rocm") and acc.backend == "nccl"
    assert acc.device_count == torch.cuda.device_count() and devices.default_device().type == "cuda"


def test_report_names_torch_and_backend():
    text = devices.report()
    assert torch.__version__ in text and "backend" in text


def test_dnn_versions_decode():
    assert devices.decode_dnn_version(90100, is_rocm=False) == "cuDNN 9.1.0"
    assert devices.decode_dnn_version(91002, is_rocm=False) == "cuDNN 9.10.2"
    assert devices.decode_dnn_version(8902, is_rocm=False) == "cuDNN 8.9.2"
    assert devices.decode_dnn_version(3004000, is_rocm=True) == "MIOpen 3.4.0"


def test_report_of_a_rocm_machine_explains_gcds():
    acc = devices.Accelerator(kind="rocm", gpus=(devices.GPU(0, "AMD Instinct MI250X", 64.0),),
                              runtime="HIP 6.2", dnn_library="MIOpen 3.2.0", collective_library="RCCL 2.20.5",
                              backend="nccl")
    text = devices.report(acc)
    assert "AMD ROCm" in text and "RCCL 2.20.5" in text and "GCD" in text


def test_convolutions_are_autotuned_on_cuda_and_left_to_miopen_s_find_database_on_rocm():
    """The facts of each build passed in (``torch.version.hip`` is the ROCm build's HIP version)."""
    rocm = devices.conv_autotune("cuda", hip="7.0.51831", detection=False)
    assert not rocm.on and str(rocm).startswith("off (ROCm: ") and "ROCm/rocm-libraries#3553" in str(rocm)
    cuda = devices.conv_autotune("cuda", hip=None, detection=False)
    assert cuda.on and str(cuda).startswith("on (CUDA: ")
    assert str(devices.conv_autotune("cuda", hip=None, detection=True)).startswith("off (detection: ")
    assert not devices.conv_autotune("cpu", hip="7.0.51831", detection=False).on


@pytest.mark.parametrize(("vendors", "hip", "cuda", "says"), [
    (("AMD",), None, "12.8", "AMD GPUs (/dev/kfd), but this PyTorch (" + torch.__version__ + ") is a CUDA build"),
    (("AMD",), None, None, "is a CPU-only build that cannot use them. Use PyTorch's ROCm build"),
    (("NVIDIA",), "6.4", None, "is a ROCm build that cannot use them. Install the CUDA build"),
])
def test_gpus_this_pytorch_cannot_use_are_named_with_the_fix(vendors, hip, cuda, says):
    assert says in devices.gpu_mismatch(vendors, hip, cuda, available=False)


def test_the_right_build_without_a_gpu_for_this_job_names_the_visible_devices():
    text = devices.gpu_mismatch(("AMD",), "6.4", None, available=False, env={"ROCR_VISIBLE_DEVICES": ""})
    assert "no GPU is given to this job (visible-device variables: ROCR_VISIBLE_DEVICES=''; " in text
    assert "Check with rocm-smi (or amd-smi, its successor)." in text


@pytest.mark.parametrize(("vendors", "available"), [((), False), (("NVIDIA",), True), (("AMD",), True)])
def test_nothing_is_said_where_there_is_no_mismatch(vendors, available):
    assert devices.gpu_mismatch(vendors, "6.4" if "AMD" in vendors else None, "12.8", available) is None


def test_a_run_on_a_node_whose_gpus_it_cannot_use_refuses_instead_of_falling_back(monkeypatch, tmp_path, capsys):
    """The driver's device file is the one thing this machine lacks: a real file stands in for /dev/kfd."""
    from course_utils.train import main

    driver = tmp_path / "kfd"
    driver.touch()
    monkeypatch.setattr(devices, "DRIVER_FILES", {"AMD": driver, "NVIDIA": tmp_path / "absent"})
    assert main(["--size", "ci", "--max-steps", "1", "--out", str(tmp_path / "run")]) == 1
    error = capsys.readouterr().err
    assert "this node has AMD GPUs" in error and "To train on the CPU on purpose, pass --device cpu." in error
    assert "WARNING: this node has AMD GPUs" in devices.report()


def test_workers_follow_the_cores_this_process_may_use():
    """A Slurm step or a LUMI GCD slot gives a process fewer cores than the node has (its CPU affinity)."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("needs two cores to give a process one")
    code = ("import os; os.sched_setaffinity(0, {0}); from course_utils import config; "
            "print(config.usable_cores(), os.cpu_count())")
    usable, total = map(int, subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                            check=True).stdout.split())
    assert usable == 1 < total
