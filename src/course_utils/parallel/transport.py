"""Is the interconnect used? Which transport NCCL (RCCL on AMD) chose for each connection, read from its own
report (notebook 08, and jobs/lumi/allreduce.sbatch).

With ``NCCL_DEBUG=INFO`` (``NCCL_DEBUG_SUBSYS=INIT,NET`` keeps it short) every rank prints a line per
channel and peer, as NCCL and RCCL do::

    nid005001:81234:81290 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read
    nid005001:81234:81291 [7] NCCL INFO Channel 03/0 : 7[7] -> 8[0] [send] via NET/AWS Libfabric/0/GDRDMA

``P2P`` is a direct path between two GPUs of a node (NVLink, Infinity Fabric or PCIe), ``SHM`` a copy
through host memory, ``NET/...`` a network between nodes: ``IB`` (InfiniBand or RoCE), ``AWS
Libfabric`` or ``OFI`` (the libfabric plugin: Slingshot's cxi on LUMI, EFA on AWS), ``Socket``
(plain TCP: far slower; on LUMI it means the plugin was not loaded). Without GPUs the ranks use
gloo, which speaks TCP and prints no such report.

    python -m course_utils.parallel.transport LOGFILE   # the verdict and the table
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

CHANNEL = re.compile(r"NCCL INFO Channel (?P<channel>\d+)(?:/\d+)? : (?P<source>\d+)\[[0-9a-fx]+\] -> "
                     r"(?P<target>\d+)\[[0-9a-fx]+\](?: \[(?P<direction>send|receive)\])? via (?P<path>.+?)\s*$")
NETWORK = re.compile(r"NCCL INFO Using network (?P<name>.+?)\s*$")
PROVIDER = re.compile(r"NET/OFI Selected Provider is (?P<name>\S+)")
PLUGIN = re.compile(r"NET/OFI Using (?P<name>aws-ofi-[a-z]+\S* *[0-9][0-9.]*\S*)")
WARNING = re.compile(r"NCCL WARN (?P<text>.+?)\s*$")
LIBFABRIC = ("AWS Libfabric", "OFI", "Libfabric")

MEANINGS = {
    "P2P": "inside a node: GPU to GPU directly (NVLink, Infinity Fabric or PCIe)",
    "SHM": "inside a node: through host memory (no direct path between these GPUs)",
    "NET/IB": "between nodes: InfiniBand or RoCE, RDMA",
    "NET/libfabric": "between nodes: libfabric (Slingshot's cxi on LUMI, EFA on AWS), RDMA",
    "NET/Socket": "between nodes: plain TCP sockets, far below the fabric's speed",
    "COLLNET": "in-network reduction (SHARP)",
    "NVLS": "NVLink SHARP inside an NVSwitch node",
}


def kind(path: str) -> str:
    """``P2P/IPC/read`` -> ``P2P``; ``NET/AWS Libfabric/0/GDRDMA`` -> ``NET/libfabric``; and so on."""
    parts = path.split("/")
    if parts[0] != "NET" or len(parts) < 2:
        return parts[0]
    return "NET/libfabric" if parts[1] in LIBFABRIC else f"NET/{parts[1]}"


@dataclass(frozen=True)
class Transport:
    """What one run's NCCL/RCCL report says: its network, its plugin, and every connection."""

    connections: pd.DataFrame  # channel, source, target, direction, path, kind, gpu_direct
    network: str | None
    plugin: str | None
    provider: str | None
    warnings: list[str]

    def table(self) -> pd.DataFrame:
        """One row per kind of connection: how many, with GPU-direct RDMA how many, and what it means."""
        if self.connections.empty:
            return pd.DataFrame(columns=["kind", "connections", "gpu_direct", "meaning"])
        grouped = self.connections.groupby("kind").agg(connections=("path", "size"),
                                                       gpu_direct=("gpu_direct", "sum")).reset_index()
        grouped["meaning"] = grouped["kind"].map(lambda name: MEANINGS.get(name, "see NCCL's documentation"))
        return grouped

    def verdict(self) -> str:
        """One line: is the fast interconnect used?"""
        table = self.table().set_index("kind")
        count = table["connections"].to_dict()
        warning = f"; first warning: {self.warnings[0]}" if self.warnings else ""
        network = sum(n for name, n in count.items() if name.startswith("NET/"))
        if self.network is None and not count:
            return ("transport: no NCCL/RCCL report (NCCL_DEBUG=INFO unset, or the ranks did not use GPUs: gloo "
                    f"speaks TCP and reports nothing){warning}")
        if count.get("NET/Socket"):
            return (f"transport: WARNING: TCP sockets between nodes on {count['NET/Socket']} connection(s): the "
                    "network plugin was not used, so the fabric carries TCP far below its RDMA speed (on LUMI: "
                    f"use LUMI's PyTorch container with its bindings){warning}")
        if network:
            direct = int(table.loc[[name for name in count if name.startswith("NET/")], "gpu_direct"].sum())
            plugin = f" ({self.plugin}, provider {self.provider})" if self.plugin else ""
            return (f"transport: between nodes {self.network}{plugin} on {network} connection(s), {direct} with "
                    f"GPU-direct RDMA; inside nodes P2P on {count.get('P2P', 0)}, SHM on {count.get('SHM', 0)}"
                    f"{warning}")
        if count:
            return (f"transport: one node: P2P on {count.get('P2P', 0)} connection(s), SHM on {count.get('SHM', 0)}"
                    f"; for other nodes NCCL had loaded {self.network}{warning}")
        return f"transport: NCCL chose {self.network}, but the report shows no connection (a single rank?){warning}"


def read(lines: Iterable[str]) -> Transport:
    """The transport of a run from its ranks' output lines (all ranks' logs together, in any order)."""
    rows, network, plugin, provider, warnings = [], None, None, None, []
    for line in lines:
        if match := CHANNEL.search(line):
            path = match["path"]
            rows.append({"channel": int(match["channel"]), "source": int(match["source"]),
                         "target": int(match["target"]), "direction": match["direction"], "path": path,
                         "kind": kind(path), "gpu_direct": path.endswith("GDRDMA")})
        elif match := NETWORK.search(line):
            network = network or match["name"]
        elif match := PROVIDER.search(line):
            provider = provider or match["name"]
        elif match := PLUGIN.search(line):
            plugin = plugin or match["name"]
        elif match := WARNING.search(line):
            warnings.append(match["text"])
    connections = pd.DataFrame(rows, columns=["channel", "source", "target", "direction", "path", "kind",
                                              "gpu_direct"]).drop_duplicates()
    return Transport(connections, network, plugin, provider, warnings)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", type=Path, help="a run's output with NCCL_DEBUG=INFO")
    args = parser.parse_args(argv)
    try:
        transport = read(args.log.read_text(errors="replace").splitlines())
    except OSError as error:
        print(f"transport: cannot read {args.log} ({error.strerror})", file=sys.stderr)
        return 2
    print(transport.verdict())
    if not transport.connections.empty:
        print(transport.table().to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
