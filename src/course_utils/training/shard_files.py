"""The files of a sharded checkpoint read as data only, and checked whole before a run resumes from them
(notebook 09, and every FSDP run that resumes).

``torch.distributed.checkpoint``'s own reader unpickles ``.metadata`` with plain ``pickle``, and its
default load planner reads every item that is not a tensor (the optimizer's settings) with
``torch.load(weights_only=False)``: a ``.metadata`` or a ``__N_0.distcp`` written by someone else in a
shared run folder would run its code on every rank at ``--resume``. Here ``.metadata`` is unpickled
with a short list of the classes DCP's metadata is made of, every item with ``weights_only=True``, and
each file the metadata names must be a file of the checkpoint's own folder, long enough for its items.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

METADATA = ".metadata"  # in a sharded checkpoint's folder: the map of which piece of which tensor is where

# Everything DCP's metadata is pickled from (torch 2.10-2.14): its dataclasses, torch's sizes, dtypes and
# layouts, and the checkpoint's path.
_METADATA_CLASSES = {
    "torch.distributed.checkpoint.metadata": {"Metadata", "TensorStorageMetadata", "BytesStorageMetadata",
                                              "ChunkStorageMetadata", "TensorProperties", "MetadataIndex",
                                              "StorageMeta", "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
}


class NotData(Exception):
    """A sharded checkpoint's file holds something other than tensors and plain data; it was not loaded."""


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if name in _METADATA_CLASSES.get(module, ()) or (
                module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise NotData(f"{METADATA} refers to {module}.{name}, which is not part of a checkpoint's metadata; it was "
                      "not loaded, since loading it could run code")


def read_metadata(folder: Path) -> Metadata:
    """A sharded checkpoint's ``.metadata``, unpickled with DCP's metadata classes only (:class:`NotData` for
    anything else; ``pickle``'s errors for a damaged file)."""
    with open(Path(folder) / METADATA, "rb") as stream:
        metadata = _MetadataUnpickler(stream).load()
    if not isinstance(metadata, Metadata):
        raise NotData(f"{METADATA} holds a {type(metadata).__name__}, not a checkpoint's metadata")
    return metadata


def problems(folder: Path) -> list[str]:
    """What keeps the sharded checkpoint in ``folder`` from loading whole: its metadata, and every shard file
    it names (missing, outside the folder, or shorter than its items). An empty list: it is whole."""
    folder = Path(folder)
    try:
        metadata = read_metadata(folder)
    except NotData as error:
        return [str(error)]
    except FileNotFoundError:
        return [f"its {METADATA} is missing"]
    except Exception as error:  # noqa: BLE001 - any unpickling error means the same: a damaged file
        return [f"its {METADATA} is damaged ({type(error).__name__})"]
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        name = str(info.relative_path)
        needed[name] = max(needed.get(name, 0), info.offset + info.length)
    found = []
    for name, length in sorted(needed.items()):
        path = folder / name
        if Path(name).name != name or name.startswith("."):
            found.append(f"its {METADATA} names {name!r}, a file outside the checkpoint's folder")
        elif not path.is_file():
            found.append(f"its shard file {name} is missing")
        elif path.stat().st_size < length:
            found.append(f"its shard file {name} is truncated ({path.stat().st_size} of {length} bytes)")
    return found


class DataOnlyReader(FileSystemReader):
    """DCP's file reader with ``.metadata`` read by :func:`read_metadata` (DCP itself reads the tensors with
    ``weights_only=True``)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if kwargs.get("rank") is not None:
            raise NotData("per-rank metadata files are not read: this course writes one .metadata")
        metadata = read_metadata(Path(self.path))
        metadata.storage_meta = StorageMeta(load_id=self.load_id)  # as DCP's own reader marks it
        return metadata


class DataOnlyPlanner(DefaultLoadPlanner):
    """DCP's default load planner with every item that is not a tensor read with ``weights_only=True``."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        try:
            loaded = torch.load(value, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as error:
            raise NotData(f"its item {read_item.dest_index.fqn} holds objects other than tensors and plain data; "
                          "it was not loaded, since loading it could run code") from error
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded
