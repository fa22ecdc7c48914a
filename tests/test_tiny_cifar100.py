import importlib.util
import json
import pickle
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch
from torchvision.datasets import CIFAR100

from course_utils.data import generated_cifar100
from course_utils.data.cifar import (
    DatasetCorruptError,
    DatasetMissingError,
    VerifiedCIFAR100,
    describe,
    expected_md5,
    file_md5,
    kind,
    mismatched_files,
)
from course_utils.data.cifar100_labels import COARSE_LABEL_NAMES, FINE_LABEL_NAMES
from course_utils.data.generated_cifar100 import generate


def _load(path):
    with open(path, "rb") as stream:
        return pickle.load(stream, encoding="latin1")


def test_files_have_the_official_keys_dtypes_and_shapes(tiny_root):
    folder = tiny_root / "cifar-100-python"
    train, test, meta = _load(folder / "train"), _load(folder / "test"), _load(folder / "meta")
    for split, count, label in ((train, 600, "training batch 1 of 1"), (test, 200, "testing batch 1 of 1")):
        assert set(split) == {"filenames", "batch_label", "fine_labels", "coarse_labels", "data"}
        assert split["data"].dtype == np.uint8 and split["data"].shape == (count, 3072)
        assert len(split["fine_labels"]) == len(split["coarse_labels"]) == len(split["filenames"]) == count
        assert split["batch_label"] == label
    assert meta["fine_label_names"] == FINE_LABEL_NAMES and len(FINE_LABEL_NAMES) == 100
    assert meta["coarse_label_names"] == COARSE_LABEL_NAMES and len(COARSE_LABEL_NAMES) == 20


def test_fine_classes_sit_under_their_real_superclasses(tiny_root):
    train = _load(tiny_root / "cifar-100-python" / "train")
    pairs = {(FINE_LABEL_NAMES[f], COARSE_LABEL_NAMES[c]) for f, c in zip(train["fine_labels"], train["coarse_labels"])}
    for fine, coarse in [("beaver", "aquatic_mammals"), ("aquarium_fish", "fish"), ("maple_tree", "trees"),
                         ("lawn_mower", "vehicles_2"), ("pickup_truck", "vehicles_1"), ("baby", "people")]:
        assert (fine, coarse) in pairs
    per_coarse = {}
    for fine, coarse in pairs:
        per_coarse.setdefault(coarse, set()).add(fine)
    assert len(per_coarse) == 20 and all(len(fines) == 5 for fines in per_coarse.values())


def test_torchvision_reader_reads_it(tiny_root):
    dataset = VerifiedCIFAR100(tiny_root, train=True)
    image, label = dataset[0]
    assert len(dataset) == 600 and image.shape == (3, 32, 32) and image.dtype == torch.uint8 and 0 <= label < 100
    assert torch.equal(image.permute(1, 2, 0), torch.from_numpy(dataset.data[0]))  # the pixels, unchanged
    assert dataset.classes == FINE_LABEL_NAMES
    assert sorted(set(dataset.targets)) == list(range(100))
    assert describe(tiny_root).startswith("generated stand-in for CIFAR-100") and str(tiny_root) in describe(tiny_root)
    assert "600 train" in kind(tiny_root) and str(tiny_root) not in kind(tiny_root)


def test_plain_torchvision_refuses_it_on_the_official_checksums(tiny_root):
    with pytest.raises(RuntimeError, match="not found or corrupted"):
        CIFAR100(str(tiny_root), train=True)


def test_generation_is_deterministic(tmp_path):
    a, b, c = (generate(tmp_path / name, train=100, test=100, seed=seed)
               for name, seed in (("a", 1), ("b", 1), ("c", 2)))
    assert file_md5(a / "train") == file_md5(b / "train")
    assert file_md5(a / "train") != file_md5(c / "train")


def test_a_changed_file_is_refused_with_the_fix(tmp_path):
    generate(tmp_path, train=100, test=100)
    path = tmp_path / "cifar-100-python" / "test"
    data = bytearray(path.read_bytes())
    data[-100] ^= 0xFF
    path.write_bytes(bytes(data))
    assert mismatched_files(tmp_path) == ["test"]
    with pytest.raises(DatasetCorruptError, match="python -m data_prep.tiny_cifar100"):
        VerifiedCIFAR100(tmp_path, prepare_hint=f"python -m data_prep.tiny_cifar100 --root {tmp_path}")


def test_missing_data_names_the_command(tmp_path):
    hint = f"python -m data_prep.tiny_cifar100 --root {tmp_path}"
    with pytest.raises(DatasetMissingError) as error:
        VerifiedCIFAR100(tmp_path, prepare_hint=hint)
    assert hint in str(error.value)


def test_generation_replaces_a_previous_tree_without_leftovers(tmp_path):
    generate(tmp_path, train=100, test=100, seed=0)
    generate(tmp_path, train=200, test=100, seed=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cifar-100-python"]
    assert len(VerifiedCIFAR100(tmp_path)) == 200


_WRITES_A_FILE = '''\
import os


class WritesAFile:
    def __reduce__(self):
        return (os.system, ("touch {marker}",))
'''


def test_a_forged_manifest_and_pickle_in_a_shared_folder_are_refused_before_unpickling(tmp_path):
    """Someone who can write the data folder replaces a pickle and the manifest beside it with one that
    lists the forged file's MD5: the checksum comes from the code, so nothing is unpickled."""
    generate(tmp_path, train=100, test=100)
    folder, marker = tmp_path / "cifar-100-python", tmp_path / "code-ran"
    namespace: dict = {}
    exec(_WRITES_A_FILE.format(marker=marker), namespace)
    (folder / "meta").write_bytes(pickle.dumps(namespace["WritesAFile"](), protocol=2))
    manifest_path = folder / "course-manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["md5"] = {name: file_md5(folder / name) for name in ("train", "test", "meta")}  # the old format's sums
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(DatasetCorruptError, match="meta fails its checksum"):
        VerifiedCIFAR100(tmp_path, train=False)
    assert not marker.exists()
    assert mismatched_files(tmp_path) == ["meta"]


@pytest.mark.parametrize("manifest", ['{"train": 100, "test": 100}', '{"train": 10000000, "test": 100, "seed": 0}',
                                      'not json'])
def test_a_manifest_this_course_did_not_write_is_refused_with_the_fix(tmp_path, manifest):
    generate(tmp_path, train=100, test=100)
    (tmp_path / "cifar-100-python" / "course-manifest.json").write_text(manifest)
    with pytest.raises(DatasetCorruptError, match=r"not a manifest this course writes.*\n    python -m data_prep"):
        VerifiedCIFAR100(tmp_path, prepare_hint="python -m data_prep --size ci")


def test_the_sums_are_those_of_the_files_the_parameters_make(tmp_path):
    generate(tmp_path, train=120, test=100, seed=3)
    manifest = json.loads((tmp_path / "cifar-100-python" / "course-manifest.json").read_text())
    assert "md5" not in manifest  # only what makes the files
    assert expected_md5(tmp_path) == {name: file_md5(tmp_path / "cifar-100-python" / name)
                                      for name in ("train", "test", "meta")}


def test_the_sums_are_computed_once_and_kept_in_the_users_cache_not_the_data_folder(tmp_path, monkeypatch):
    """A new process (the cache of this one cleared) reads the sums the generator kept instead of making the files
    again, the 12 s of the full-size stand-in; a damaged cache file is made again, not trusted."""
    monkeypatch.setenv(generated_cifar100.CACHE_VARIABLE, str(tmp_path / "cache"))
    generate(tmp_path / "data", train=110, test=100, seed=5)
    sums = {name: file_md5(tmp_path / "data" / "cifar-100-python" / name) for name in ("train", "test", "meta")}
    assert not list((tmp_path / "data").rglob("*md5*")) and generated_cifar100.sums_cache().is_file()
    generated_cifar100.expected_md5.cache_clear()

    def not_again(*args):
        raise AssertionError("the files were made again")

    monkeypatch.setattr(generated_cifar100, "file_bytes", not_again)
    assert expected_md5(tmp_path / "data") == sums
    assert VerifiedCIFAR100(tmp_path / "data").data.shape == (110, 32, 32, 3)
    monkeypatch.undo()
    monkeypatch.setenv(generated_cifar100.CACHE_VARIABLE, str(tmp_path / "cache"))
    generated_cifar100.sums_cache().write_text("{not json")
    generated_cifar100.expected_md5.cache_clear()
    assert expected_md5(tmp_path / "data") == sums  # made again from the parameters, and kept anew
    assert json.loads(generated_cifar100.sums_cache().read_text())


def _generator_from(source: str, path: Path) -> ModuleType:
    """The generator as an update of the course would ship it: ``source`` in a file, loaded as a module."""
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("updated_generated_cifar100", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sums_kept_from_an_earlier_generator_are_not_taken_for_the_files_an_updated_one_makes(tmp_path, monkeypatch):
    """The kept sums were keyed by the generator's parameters alone: after an update that changes the files, the
    same data was accepted or called damaged depending on what the cache held. The key holds the code too."""
    monkeypatch.setenv(generated_cifar100.CACHE_VARIABLE, str(tmp_path / "cache"))
    generated_cifar100.expected_md5.cache_clear()
    kept = generated_cifar100.expected_md5(110, 100, 7)
    source = Path(generated_cifar100.__file__).read_text()
    changed = source.replace("rng.normal(0, 0.2,", "rng.normal(0, 0.25,")  # more noise in every image
    assert changed != source
    updated = _generator_from(changed, tmp_path / "updated.py")
    made = updated.md5_of(updated.file_bytes(110, 100, 7))
    assert made["train"] != kept["train"] and updated.expected_md5(110, 100, 7) == made
    assert updated._cache_key(110, 100, 7) != generated_cifar100._cache_key(110, 100, 7)
    assert len(json.loads(generated_cifar100.sums_cache().read_text())) == 2  # each generator's sums, each its key


def test_the_sample_grid_says_the_ci_images_are_generated_patterns(tiny_root):
    from course_utils.lessons import environment

    figure = environment.sample_grid(VerifiedCIFAR100(tiny_root, train=True))
    assert "generated CIFAR-100" in figure._suptitle.get_text() and "not photographs" in figure._suptitle.get_text()
