"""Is the interconnect used? Which transport NCCL (RCCL on AMD) chose for each connection, read from its own
report (notebook 08, and jobs/lumi/allreduce.sbatch).

With ``NCCL_DEBUG=INFO`` (``NCCL_DEBUG_SUBSYS=INIT,NET`` keeps it short) every rank prints a line per
channel and peer, as NCCL and RCCL do::

    nid005001:81234:81290 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read
    nid005001:81234:81291 [7] NCCL INFO Channel 03/0 : 7[7] -> 8[0] [send] via NET/AWS Libfabric/0/GDRDMA

RCCL adds the communicator (``... via P2P/IPC comm 0x9bbf3b0 nRanks 4096``), NCCL with shared buffers writes
``.../GDRDMA/Shared``: GPU-direct RDMA is ``GDRDMA`` anywhere in the path. The aws-ofi-nccl/-rccl plugin names
itself (``NET/OFI Using aws-ofi-rccl 1.4.0``, in later releases ``NET/OFI Initializing aws-ofi-nccl 1.19.0``) and its
provider (``Selected Provider is cxi (found 4 nics)``, from 2025 ``Selected provider is cxi, fabric is cxi (found 4
nics)``); it is credited only where NCCL's connections or its ``Using network`` line say NCCL used libfabric.

``P2P`` is a direct path between two GPUs of a node (NVLink, Infinity Fabric or PCIe), ``SHM`` a copy
through host memory, ``NET/...`` a network between nodes: ``IB`` (InfiniBand or RoCE), ``AWS
Libfabric`` or ``OFI`` (the libfabric plugin: Slingshot's cxi on LUMI, EFA on AWS), ``IBext_v8`` (HPC-X's
SHARP plugin: IB too), ``UCX`` (the rdma-sharp plugin's), ``Socket``
(plain TCP: far slower; on LUMI it means the plugin was not loaded). Without GPUs the ranks use
gloo, which speaks TCP and prints no such report.

    python -m course_utils.doctor.transport LOGFILE   # the verdict and the table
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from course_utils import bounded_reading

# Every pattern reads a line in linear time: none ends in a lazy group before ``\s*$`` (which tries the rest of the
# line again at each character); a line's trailing blanks are stripped before CHANNEL reads it.
CHANNEL = re.compile(r"NCCL INFO Channel (?P<channel>\d+)(?:/\d+)? : (?P<source>\d+)\[[0-9a-fx]+\] -> "
                     r"(?P<target>\d+)\[[0-9a-fx]+\](?: \[(?P<direction>send|receive)\])? via (?P<path>.+?)"
                     r"(?: comm 0x[0-9a-f]+ nRanks \d+)?$")  # RCCL names the communicator after the path
NETWORK = re.compile(r"NCCL INFO Using network (?P<name>.*\S)")
# aws-ofi-nccl/-rccl: "Selected Provider is cxi (found 4 nics)" up to 1.13, then
# "Selected provider is cxi, fabric is cxi (found 4 nics)"
PROVIDER = re.compile(r"NET/OFI Selected [Pp]rovider is (?P<name>[^,\s]+)(?:, fabric is (?P<fabric>[^\s(]+))?"
                      r"(?: \(found (?P<nics>\d+) nics\))?")
PLUGIN = re.compile(r"NET/OFI (?:Using|Initializing) (?P<name>aws-ofi-[a-z]+ *[0-9][0-9.]*\S*)")
WARNING = re.compile(r"NCCL WARN (?P<text>.*\S)")
LIBFABRIC = ("AWS Libfabric", "OFI", "Libfabric")

MEANINGS = {
    "P2P": "inside a node: GPU to GPU directly (NVLink, Infinity Fabric or PCIe)",
    "SHM": "inside a node: through host memory (no direct path between these GPUs)",
    "NET/IB": "between nodes: InfiniBand or RoCE, RDMA",
    "NET/libfabric": "between nodes: libfabric (Slingshot's cxi on LUMI, EFA on AWS), RDMA",
    "NET/UCX": "between nodes: UCX (the rdma-sharp plugin), RDMA",
    "NET/Socket": "between nodes: plain TCP sockets, far below the fabric's speed",
    "COLLNET": "in-network reduction (SHARP)",
    "NVLS": "NVLink SHARP inside an NVSwitch node",
}


def _network_kind(name: str) -> str:
    """A network's name as NCCL prints it -> its kind: ``IBext_v8`` (the HPC-X plugin's IB) and ``IBext`` are IB,
    ``AWS Libfabric`` and ``OFI`` are libfabric."""
    if name in LIBFABRIC:
        return "NET/libfabric"
    return "NET/IB" if name.startswith("IBext") else f"NET/{name}"


def kind(path: str) -> str:
    """``P2P/IPC/read`` -> ``P2P``; ``NET/AWS Libfabric/0/GDRDMA`` -> ``NET/libfabric``; ``NET/IBext_v8/2`` ->
    ``NET/IB``; and so on."""
    parts = path.split("/")
    if parts[0] != "NET" or len(parts) < 2:
        return parts[0]
    return _network_kind(parts[1])


def gpu_direct(path: str) -> bool:
    """Whether a connection uses GPU-direct RDMA: ``GDRDMA`` anywhere in its path (NCCL writes
    ``.../GDRDMA/Shared`` with shared buffers)."""
    return "GDRDMA" in path.split("/")


@dataclass(frozen=True)
class Transport:
    """What one run's NCCL/RCCL report says: its network, its plugin, and every connection."""

    connections: pd.DataFrame  # channel, source, target, direction, path, kind, gpu_direct
    network: str | None
    plugin: str | None
    provider: str | None
    warnings: list[str]  # the first of NCCL's warnings (bounded_reading.KEPT)
    fabric: str | None = None
    nics: int | None = None
    more_warnings: int = 0  # beyond those kept in ``warnings``

    def table(self) -> pd.DataFrame:
        """One row per kind of connection: how many, with GPU-direct RDMA how many, and what it means."""
        if self.connections.empty:
            return pd.DataFrame(columns=["kind", "connections", "gpu_direct", "meaning"])
        grouped = self.connections.groupby("kind").agg(connections=("path", "size"),
                                                       gpu_direct=("gpu_direct", "sum")).reset_index()
        grouped["meaning"] = grouped["kind"].map(lambda name: MEANINGS.get(name, "see NCCL's documentation"))
        return grouped

    def used_network(self) -> str | None:
        """The kind of network NCCL used between nodes: the connections' own (the most used), else the one its
        ``Using network`` line names; None where the report says neither."""
        between = self.connections.loc[self.connections["kind"].str.startswith("NET/"), "kind"]
        if not between.empty:
            return between.value_counts().index[0]
        return _network_kind(self.network) if self.network else None

    def _plugin_words(self) -> str:
        if not self.plugin and not self.provider:
            return "its plugin (which did not name itself here)"
        details = [f"provider {self.provider}" if self.provider else "",
                   f"fabric {self.fabric}" if self.fabric and self.fabric != self.provider else "",
                   f"{self.nics} NICs" if self.nics else ""]
        details_text = ", ".join(detail for detail in details if detail)
        return f"{self.plugin or 'the libfabric plugin'}" + (f" ({details_text})" if details_text else "")

    def _network_words(self, used: str) -> str:
        """The network NCCL used, credited to the plugin only when it is the plugin's libfabric."""
        if used == "NET/libfabric":
            return f"libfabric through {self._plugin_words()}"
        return {"NET/IB": "InfiniBand/RoCE (NCCL's IB verbs)", "NET/Socket": "TCP sockets"}.get(
            used, used.removeprefix("NET/"))

    def _unused_plugin(self, used: str | None) -> str:
        if (self.plugin or self.provider) and used != "NET/libfabric":
            return f"; {self._plugin_words()} was loaded, but NCCL did not use it"
        return ""

    def verdict(self) -> str:
        """One sentence: is the fast interconnect used?"""
        table = self.table().set_index("kind")
        count = table["connections"].to_dict()
        warning = f"; first warning: {self.warnings[0]}" if self.warnings else ""
        between = {name: n for name, n in count.items() if name.startswith("NET/")}
        used = self.used_network()
        inside = f"P2P on {count.get('P2P', 0)}, SHM on {count.get('SHM', 0)}"
        if used is None and not count and not (self.plugin or self.provider):
            return ("transport: no NCCL/RCCL report (NCCL_DEBUG=INFO unset, or the ranks did not use GPUs: gloo "
                    f"speaks TCP and reports nothing){warning}")
        if count.get("NET/Socket") or (used == "NET/Socket" and not count):
            sockets = count.get("NET/Socket", 0)
            on = f" on {sockets} connection(s)" if sockets else " (NCCL's choice of network)"
            return (f"transport: WARNING: TCP sockets between nodes{on}: the fabric carries TCP far below its "
                    "RDMA speed, since no RDMA network was used (on LUMI: use LUMI's PyTorch container with its "
                    f"bindings){self._unused_plugin(used)}{warning}")
        if between:
            direct = int(table.loc[list(between), "gpu_direct"].sum())
            return (f"transport: between nodes {self._network_words(used)} on {sum(between.values())} "
                    f"connection(s), {direct} with GPU-direct RDMA; inside nodes {inside}"
                    f"{self._unused_plugin(used)}{warning}")
        if count:
            other = f"; for other nodes NCCL had chosen {self._network_words(used)}" if used else ""
            return (f"transport: one node: P2P on {count.get('P2P', 0)} connection(s), SHM on {count.get('SHM', 0)}"
                    f"{other}{self._unused_plugin(used)}{warning}")
        if used:
            return (f"transport: NCCL chose {self._network_words(used)} between nodes, but the report shows no "
                    f"connection (a single rank, or NCCL_DEBUG_SUBSYS without INIT){self._unused_plugin(used)}"
                    f"{warning}")
        return (f"transport: {self._plugin_words()} started, but the report names neither the network NCCL used "
                f"nor any connection (NCCL_DEBUG_SUBSYS without INIT and NET?){warning}")


class Reader:
    """Reads a run's output one line at a time, keeping what :class:`Transport` needs: each connection once, the
    first network, plugin and provider named, the first of NCCL's warnings (and how many more there were)."""

    def __init__(self) -> None:
        self.rows: dict[tuple, None] = {}  # the connections, each once, in the order first seen
        self.network: str | None = None
        self.plugin: str | None = None
        self.provider: re.Match | None = None
        self.warnings: list[str] = []
        self.more_warnings = 0

    def add(self, line: str) -> None:
        line = line.rstrip()
        if match := CHANNEL.search(line):
            path = match["path"]
            self.rows[(int(match["channel"]), int(match["source"]), int(match["target"]), match["direction"], path,
                       kind(path), gpu_direct(path))] = None
        elif match := NETWORK.search(line):
            self.network = self.network or match["name"]
        elif match := PROVIDER.search(line):
            self.provider = self.provider or match
        elif match := PLUGIN.search(line):
            self.plugin = self.plugin or match["name"]
        elif match := WARNING.search(line):
            if len(self.warnings) < bounded_reading.KEPT:
                self.warnings.append(match["text"])
            else:
                self.more_warnings += 1

    def transport(self) -> Transport:
        provider = self.provider
        connections = pd.DataFrame(list(self.rows), columns=["channel", "source", "target", "direction", "path",
                                                             "kind", "gpu_direct"])
        return Transport(connections, self.network, self.plugin, provider and provider["name"], self.warnings,
                         fabric=provider and provider["fabric"],
                         nics=int(provider["nics"]) if provider and provider["nics"] else None,
                         more_warnings=self.more_warnings)


def read(lines: Iterable[str]) -> Transport:
    """The transport of a run from its ranks' output lines (all ranks' logs together, in any order)."""
    reader = Reader()
    for line in bounded_reading.cut(lines):
        reader.add(line)
    return reader.transport()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", type=Path, help="a run's output with NCCL_DEBUG=INFO")
    args = parser.parse_args(argv)
    transport = bounded_reading.read_for_a_command("transport", args.log,
                                                   lambda path: read(bounded_reading.Lines(path)))
    if transport is None:
        return 2
    print(transport.verdict())
    if not transport.connections.empty:
        print(transport.table().to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
