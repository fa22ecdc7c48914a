"""The three loaders: same data, same semantics, each one trains."""

import itertools

import numpy as np
import pytest
import torch
from torchvision.transforms.v2 import functional as TF

from course_utils.data import dali
from course_utils.data.datasets import DataSpec, build_datasets
from course_utils.data.gpu_augment import BatchAugment
from course_utils.data.loaders import make_loaders
from course_utils.data.transforms import CIFAR100_MEAN, CIFAR100_STD
from course_utils.observe.metrics import load_run
from course_utils.train import train

CPU = torch.device("cpu")


def _spec(root, augment=False):
    return DataSpec(root=root, augment=augment, train_samples=96, test_samples=40)


def test_dali_and_torch_give_the_same_batches_without_augmentation(tiny_root):
    torch_loaders = make_loaders("torch", _spec(tiny_root), 16, CPU)
    dali_loaders = make_loaders("dali", _spec(tiny_root), 16, CPU)
    torch_test, dali_test = list(torch_loaders.test), list(dali_loaders.test)
    assert len(dali_loaders.test) == len(torch_test) == 3  # 40 images: two full batches and a partial one
    for (t_images, t_labels), (d_images, d_labels) in zip(torch_test, dali_test):
        assert d_images.shape == t_images.shape and d_images.dtype == torch.float32
        assert d_labels.dtype == torch.int64 and torch.equal(d_labels, t_labels)
        assert torch.allclose(d_images, t_images, atol=1e-4)


def test_dali_training_batches_are_augmented_and_shuffled(tiny_root):
    loaders = make_loaders("dali", _spec(tiny_root, augment=True), 16, CPU)
    first, second = [labels for _, labels in loaders.train], [labels for _, labels in loaders.train]
    assert len(first) == len(loaders.train) == 6 and all(len(labels) == 16 for labels in first)
    assert not all(torch.equal(a, b) for a, b in zip(first, second))  # a new order every epoch
    assert sorted(torch.cat(first).tolist()) == sorted(torch.cat(second).tolist())


@pytest.mark.parametrize("count,shards", [(100, 4), (10, 3), (7, 2)])
def test_shards_cover_the_data_exactly_once(count, shards):
    parts = [dali.shard_order(count, epoch=0, seed=1, shuffle=True, shard_id=s, num_shards=shards)
             for s in range(shards)]
    assert len({len(part) for part in parts}) == 1  # every rank runs the same number of steps
    covered = np.concatenate(parts)
    assert set(covered) == set(range(count)) and len(covered) - count < shards
    if count % shards == 0:
        assert len(covered) == count


@pytest.mark.parametrize("kind", ["dali", "torch", "resident"])
def test_training_shards_split_the_labels(tiny_root, kind):
    shards = [make_loaders(kind, _spec(tiny_root), 8, CPU, shard_id=s, num_shards=2) for s in (0, 1)]
    labels = [torch.cat([batch_labels for _, batch_labels in loaders.train]) for loaders in shards]
    assert len(labels[0]) == len(labels[1]) == 48
    assert sorted(torch.cat(labels).tolist()) == sorted(build_datasets(_spec(tiny_root))[0].dataset.targets[:96])


def test_dali_unavailable_on_rocm_points_to_gpu_aug(monkeypatch):
    monkeypatch.setattr(torch.version, "hip", "6.2.41133")
    with pytest.raises(dali.DaliUnavailable, match="gpu-aug"):
        dali.check_available()


def test_gpu_augment_without_augmentation_equals_the_cpu_transform(tiny_root):
    loaders = make_loaders("gpu-aug", _spec(tiny_root), 16, CPU)
    reference = make_loaders("torch", _spec(tiny_root), 16, CPU)
    (raw, labels), (expected, expected_labels) = next(iter(loaders.test)), next(iter(reference.test))
    assert raw.dtype == torch.uint8 and torch.equal(labels, expected_labels)
    assert torch.allclose(loaders.test_on_device(raw), expected, atol=1e-6)


def test_gpu_augment_crops_and_flips_like_the_cpu_transforms():
    images = torch.randint(0, 256, (6, 3, 32, 32), dtype=torch.uint8)
    augmented = BatchAugment(32, augment=True, generator=torch.Generator().manual_seed(3))(images)
    pad = 4
    for image, result in zip(images, augmented):
        padded = TF.pad(TF.to_dtype(image, torch.float32, scale=True), [pad])
        offsets = itertools.product(range(2 * pad + 1), repeat=2)
        candidates = [TF.crop(padded, top, left, 32, 32) for top, left in offsets]
        candidates += [TF.horizontal_flip(c) for c in candidates]
        normalized = [TF.normalize(c, list(CIFAR100_MEAN), list(CIFAR100_STD)) for c in candidates]
        assert any(torch.allclose(result, c, atol=1e-6) for c in normalized)
    assert not torch.allclose(augmented, BatchAugment(32, augment=False)(images))


def test_the_resident_loader_reads_what_gpu_aug_reads_with_the_data_already_on_the_device(tiny_root):
    """The same order (the sampler's seed and epoch) and the same crops and flips as gpu-aug, so a run's batches
    do not depend on where its data lives; the test set too, shard by shard."""
    resident, streamed = (make_loaders(kind, _spec(tiny_root, augment=True), 16, CPU)
                          for kind in ("resident", "gpu-aug"))
    assert len(resident.train) == len(streamed.train) == 6 and resident.order_generator is None
    for epoch in (0, 1):
        resident.set_epoch(epoch)
        streamed.set_epoch(epoch)
        for (mine, my_labels), (theirs, their_labels) in zip(resident.train, streamed.train):
            assert mine.dtype == torch.uint8 and torch.equal(my_labels, their_labels)
            assert torch.equal(resident.train_on_device(mine), streamed.train_on_device(theirs))
    sharded = [make_loaders("resident", _spec(tiny_root), 16, CPU, shard_id=s, num_shards=2) for s in (0, 1)]
    assert sum(len(labels) for loaders in sharded for _, labels in loaders.test) == 40


@pytest.mark.slow
@pytest.mark.parametrize("loader", ["dali", "gpu-aug", "resident"])
def test_each_loader_trains(quick, tmp_path, loader):
    summary = train(**{**quick, "out": str(tmp_path), "loader": loader, "epochs": 3})
    losses = load_run(tmp_path).steps["loss"]
    assert losses.iloc[-2:].mean() < losses.iloc[:2].mean() - 0.05
    assert summary["config"]["loader"] == loader


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_worker_processes_forked_after_dali_do_not_hang(quick, tmp_path):
    # A DALI pipeline left to the garbage collector used to be inherited by DataLoader workers forked
    # later, whose collector then waited forever for DALI's threads. Alternate the two a few times.
    for round_ in range(3):
        train(**{**quick, "out": str(tmp_path / f"dali{round_}"), "loader": "dali", "epochs": 1})
        train(**{**quick, "out": str(tmp_path / f"torch{round_}"), "loader": "torch", "workers": 2, "epochs": 1})


def test_dali_and_pytorch_built_for_two_cuda_majors_are_not_put_in_one_gpu_process():
    said = dali.runtime_mismatch(12, "13.0", gpu=True)
    assert "CUDA 12" in said and "CUDA 13.0" in said and "pip install nvidia-dali-cuda130" in said
    assert dali.runtime_mismatch(13, "13.0", gpu=True) is None
    assert dali.runtime_mismatch(12, "13.0", gpu=False) is None  # DALI's CPU operators load no CUDA runtime
    assert dali.runtime_mismatch(13, None, gpu=True) is None  # PyTorch without CUDA: nothing to mismatch
    if torch.version.cuda:  # the course's pins agree: DALI for the CUDA of the pinned PyTorch
        assert dali.installed_dali_cuda() == dali.cuda_major(torch.version.cuda)


@pytest.mark.slow
def test_workers_kept_alive_draw_the_augmentation_of_workers_started_every_epoch(tiny_root):
    """PyTorch seeds a worker once, when it starts: kept alive (persistent_workers, the course's default), its
    random crops would run on from the epochs before, which a resumed run never saw. Seeded per epoch by the
    loader, both draw the same."""
    drawn = {}
    for persistent in (False, True):
        loaders = make_loaders("torch", _spec(tiny_root, augment=True), 16, CPU, workers=2,
                               persistent_workers=persistent)
        drawn[persistent] = []
        for epoch in (0, 1):
            loaders.set_epoch(epoch)
            drawn[persistent].append(torch.cat([images for images, _ in loaders.train]))
    assert all(torch.equal(a, b) for a, b in zip(drawn[False], drawn[True]))
    assert drawn[True][0].shape == drawn[True][1].shape and not torch.equal(drawn[True][0], drawn[True][1])
