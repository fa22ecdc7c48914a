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
