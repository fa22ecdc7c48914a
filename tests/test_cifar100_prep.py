"""The download path of the official archive, run on an archive built here in the same layout."""

import tarfile

import pytest

from course_utils.data.cifar import FOLDER, VerifiedCIFAR100, file_md5
from course_utils.data.generated_cifar100 import generate
from data_prep import cifar100


@pytest.fixture
def archive(tmp_path):
    """A cifar-100-python.tar.gz with the official layout (cifar-100-python/{train,test,meta})."""
    source = tmp_path / "source"
    generate(source, train=100, test=100)
    path = tmp_path / "served" / cifar100.ARCHIVE_NAME
    path.parent.mkdir()
    with tarfile.open(path, "w:gz") as tar:
        tar.add(source / FOLDER, arcname=FOLDER)
    return path


def _leftovers(root):
    return sorted(p.name for p in root.iterdir() if p.name.startswith("."))


def test_download_check_and_extract(archive, tmp_path):
    root = tmp_path / "data"
    folder = cifar100.prepare(root, url=archive.as_uri(), md5=file_md5(archive))
    assert folder == root / FOLDER and len(VerifiedCIFAR100(root, train=False)) == 100
    assert cifar100.verify(root) == [] and _leftovers(root) == []
    assert cifar100.main(["--root", str(root), "--verify"]) == 0


def test_wrong_md5_is_refused_before_extraction(archive, tmp_path):
    root = tmp_path / "data"
    with pytest.raises(cifar100.ArchiveError, match="expected eb9058c3a382ffc7106e4002c42a8d85"):
        cifar100.prepare(root, url=archive.as_uri())  # the official MD5, which this archive lacks
    assert not (root / FOLDER).exists() and _leftovers(root) == []


def test_truncated_archive_is_refused(archive, tmp_path):
    md5 = file_md5(archive)
    archive.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    root = tmp_path / "data"
    with pytest.raises(cifar100.ArchiveError, match="truncated, corrupted"):
        cifar100.prepare(root, url=archive.as_uri(), md5=md5)
    assert not (root / FOLDER).exists()


def test_corrupt_archive_with_matching_md5_leaves_nothing_half_extracted(archive, tmp_path):
    archive.write_bytes(archive.read_bytes()[:-4000])  # a gzip stream cut short
    root = tmp_path / "data"
    with pytest.raises(cifar100.ArchiveError, match="nothing was extracted"):
        cifar100.prepare(root, url=archive.as_uri(), md5=file_md5(archive))
    assert not (root / FOLDER).exists() and _leftovers(root) == []


def test_verify_reports_a_damaged_tree(archive, tmp_path, capsys):
    root = tmp_path / "data"
    cifar100.prepare(root, url=archive.as_uri(), md5=file_md5(archive))
    (root / FOLDER / "meta").write_bytes(b"damaged")
    assert cifar100.main(["--root", str(root), "--verify"]) == 1
    assert "meta" in capsys.readouterr().err


def test_failed_download_says_how_to_bring_the_archive(tmp_path):
    root = tmp_path / "data"
    with pytest.raises(cifar100.ArchiveError, match="copy it to"):
        cifar100.prepare(root, url=(tmp_path / "absent.tar.gz").as_uri())
    assert list(root.iterdir()) == []
