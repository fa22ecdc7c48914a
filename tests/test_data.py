import pytest
import torch
from PIL import Image

from course_utils.data.datasets import DataSpec, SyntheticImages, build_datasets, class_count
from course_utils.data.loaders import build_loader
from course_utils.data.transforms import train_transform


def test_cifar_batches_have_the_training_shapes(tiny_root):
    train, test = build_datasets(DataSpec(root=tiny_root, train_samples=100, test_samples=50))
    assert (len(train), len(test)) == (100, 50)
    images, labels = next(iter(build_loader(train, 16, shuffle=True, workers=1)))
    assert images.shape == (16, 3, 32, 32) and images.dtype == torch.float32
    assert labels.dtype == torch.int64 and abs(images.mean().item()) < 1.5


def test_224_pixels_for_the_lumi_setup(tiny_root):
    train, _ = build_datasets(DataSpec(root=tiny_root, image_size=224, train_samples=4, test_samples=4))
    assert train[0][0].shape == (3, 224, 224)


def test_augmentation_changes_images_and_can_be_turned_off():
    image = Image.fromarray((torch.rand(32, 32, 3) * 255).to(torch.uint8).numpy())
    torch.manual_seed(0)
    augmented = [train_transform(augment=True)(image) for _ in range(4)]
    plain = [train_transform(augment=False)(image) for _ in range(2)]
    assert any(not torch.equal(augmented[0], other) for other in augmented[1:])
    assert torch.equal(plain[0], plain[1])


def test_shuffling_repeats_with_the_seed(tiny_root):
    train, _ = build_datasets(DataSpec(root=tiny_root, augment=False, train_samples=64, test_samples=8))
    first = [labels for _, labels in build_loader(train, 16, shuffle=True, seed=3)]
    again = [labels for _, labels in build_loader(train, 16, shuffle=True, seed=3)]
    other = [labels for _, labels in build_loader(train, 16, shuffle=True, seed=4)]
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not all(torch.equal(a, b) for a, b in zip(first, other))


def test_synthetic_images_are_reproducible():
    data = SyntheticImages(10, image_size=32, seed=5)
    assert torch.equal(data[3][0], SyntheticImages(10, seed=5)[3][0])
    assert data[3][0].shape == (3, 32, 32) and 0 <= data[3][1] < 100
    with pytest.raises(IndexError):
        data[10]


def test_batch_larger_than_the_data_is_refused():
    with pytest.raises(ValueError, match="lower --batch-size"):
        build_loader(SyntheticImages(8), 16, shuffle=False)


def test_image_folder_source(tmp_path):
    for split in ("train", "val"):
        for name in ("cat", "dog"):
            folder = tmp_path / split / name
            folder.mkdir(parents=True)
            for i in range(3):
                Image.new("L", (40, 30), color=i * 60).save(folder / f"{i}.png")
    train, val = build_datasets(DataSpec(source="imagefolder", root=tmp_path))
    image, label = train[0]
    assert len(train) == len(val) == 6 and image.shape[0] == 3 and label in (0, 1)


def test_image_folder_without_split_says_what_is_needed(tmp_path):
    with pytest.raises(FileNotFoundError, match="train"):
        build_datasets(DataSpec(source="imagefolder", root=tmp_path))


def test_the_model_tells_apart_as_many_classes_as_the_data_has(tmp_path):
    for name in ("n01440764", "n01443537", "n01484850"):
        (tmp_path / "train" / name).mkdir(parents=True)
    assert class_count("imagefolder", tmp_path) == 3
    assert class_count("cifar100", None) == 100
    with pytest.raises(FileNotFoundError, match="needs .*/train/<class>/<image> files"):
        class_count("imagefolder", tmp_path / "elsewhere")
