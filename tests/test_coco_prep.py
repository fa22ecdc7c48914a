"""The download path of COCO 2017, run on zips built here in the official layout: served from a folder
(file://) and from an HTTP server on this machine that honours range requests, as COCO's does."""

import dataclasses
import http.server
import threading
import zipfile

import pytest

from course_utils.data.cifar import file_md5
from course_utils.data.coco import CocoBoxes
from data_prep import coco
from data_prep.__main__ import main
from data_prep.archives import ArchiveError


@pytest.fixture
def served(tiny_coco, tmp_path):
    """``zips/{train,val}2017.zip`` and ``annotations/annotations_trainval2017.zip`` as COCO serves them, and
    the archive list with these zips' MD5 sums."""
    base = tmp_path / "served"
    archives = []
    for archive in coco.ARCHIVES:
        path = base / archive.url_folder / archive.name
        path.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(path, "w") as bundle:
            for file in sorted((tiny_coco / archive.folder).iterdir()):
                bundle.write(file, f"{archive.folder}/{file.name}")
        archives.append(dataclasses.replace(archive, md5=file_md5(path)))
    return base, tuple(archives)


class _RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Serves files, and the rest of one from ``Range: bytes=N-`` with 206 Partial Content; with ``cut_after``
    set, sends that many bytes of a file and closes the connection, as a dropped download does."""

    served_ranges: list[str] = []
    cut_after: int | None = None

    def send_head(self):
        requested = self.headers.get("Range")
        if not requested and self.cut_after is None:
            return super().send_head()
        data = open(self.translate_path(self.path), "rb").read()
        if requested:
            self.served_ranges.append(requested)
            start = int(requested.removeprefix("bytes=").removesuffix("-"))
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            start = 0
            self.send_response(200)
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        self.wfile.write(data[start:] if requested else data[: self.cut_after])
        self.close_connection = True

    def log_message(self, *args):
        pass


@pytest.fixture
def http_base(served):
    base, _ = served
    _RangeHandler.served_ranges, _RangeHandler.cut_after = [], None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: _RangeHandler(*a, directory=str(base)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _leftovers(root):
    return sorted(p.name for p in root.iterdir() if p.name.startswith(".") or p.suffix in (".zip", ".part"))


def test_download_check_and_extract(served, tmp_path):
    base, archives = served
    root = coco.prepare(tmp_path / "data", base_url=base.as_uri(), archives=archives)
    assert sorted(p.name for p in root.iterdir()) == ["annotations", "train2017", "val2017"]
    assert len(CocoBoxes(root, "val2017")) == 32 and _leftovers(root) == []  # the zips are deleted once extracted
    assert coco.main(["--root", str(root), "--verify"]) == 0


def test_the_official_md5_refuses_another_archive_before_extraction(served, tmp_path):
    base, _ = served
    root = tmp_path / "data"
    with pytest.raises(ArchiveError, match="expected f4bbac642086de4f52a3fdda2de5fa2c.*Nothing was extracted"):
        coco.prepare(root, base_url=base.as_uri())  # the official sums, which these zips lack
    assert sorted(p.name for p in root.iterdir()) == ["annotations_trainval2017.zip"]


def test_a_damaged_zip_with_a_matching_md5_leaves_nothing_half_extracted(served, tmp_path):
    base, archives = served
    path = base / "zips" / "val2017.zip"
    path.write_bytes(path.read_bytes()[:-2000])  # the central directory cut off
    archives = tuple(dataclasses.replace(a, md5=file_md5(path)) if a.name == path.name else a for a in archives)
    root = tmp_path / "data"
    with pytest.raises(ArchiveError, match="nothing was extracted"):
        coco.prepare(root, base_url=base.as_uri(), archives=archives)
    assert sorted(p.name for p in root.iterdir()) == ["annotations", "val2017.zip"]


def test_an_interrupted_download_continues_where_it_stopped(served, http_base, tmp_path):
    base, archives = served
    root = tmp_path / "data"
    whole = (base / "annotations" / "annotations_trainval2017.zip").read_bytes()
    half = len(whole) // 2
    _RangeHandler.cut_after = half
    with pytest.raises(ArchiveError, match=f"The {half} bytes in .*annotations_trainval2017.zip.part are kept"):
        coco.prepare(root, base_url=http_base, archives=archives)
    assert (root / "annotations_trainval2017.zip.part").stat().st_size == half and not (root / "annotations").exists()
    _RangeHandler.cut_after = None
    coco.prepare(root, base_url=http_base, archives=archives, keep_archives=True)
    assert _RangeHandler.served_ranges == [f"bytes={half}-"]  # only the missing half was asked for
    assert (root / "annotations_trainval2017.zip").read_bytes() == whole and not coco.verify(root)


def test_folders_in_place_are_not_downloaded_again(served, tmp_path):
    base, archives = served
    root = coco.prepare(tmp_path / "data", base_url=base.as_uri(), archives=archives)
    assert coco.prepare(root, base_url=(tmp_path / "nowhere").as_uri(), archives=archives) == root


def test_verify_names_a_damaged_tree_and_the_fix(served, tmp_path, capsys):
    base, archives = served
    root = coco.prepare(tmp_path / "data", base_url=base.as_uri(), archives=archives)
    (root / "val2017" / "000000000130.jpg").write_bytes(b"")
    assert coco.main(["--root", str(root), "--verify"]) == 1
    error = capsys.readouterr().err
    assert "val2017: 1 of 32 images missing or empty (000000000130.jpg)" in error
    assert f"python -m data_prep.coco --root {root}" in error


def test_a_failed_download_says_how_to_bring_the_archive(tmp_path, capsys):
    root = tmp_path / "data"
    assert coco.main(["--root", str(root), "--base-url", (tmp_path / "nowhere").as_uri()]) == 1
    error = capsys.readouterr().err
    assert "annotations_trainval2017.zip elsewhere, copy it to" in error
    assert list(root.iterdir()) == []


def test_data_prep_makes_the_tiny_coco_set_beside_the_tiny_cifar100_at_the_ci_size(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("COURSE_DATA_DIR", str(tmp_path))
    assert main(["--size", "ci"]) == 0
    assert capsys.readouterr().out.splitlines()[1].startswith(
        "Generated stand-in for COCO in its format, shapes instead of photos (seed 0), 32 validation")
    assert main(["--size", "ci"]) == 0
    assert capsys.readouterr().out.count("verified, nothing to do") == 2


def test_a_disk_that_fills_during_the_download_says_disk_full_not_how_to_download(served, small_disk, capsys):
    base, _ = served
    disk = small_disk((base / "annotations" / "annotations_trainval2017.zip").stat().st_size // 2)
    assert coco.main(["--root", str(disk / "coco"), "--base-url", base.as_uri()]) == 1
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith(f"error: disk full writing {disk / 'coco' / 'annotations_trainval2017.zip.part'}")
    assert "elsewhere" not in error
