"""Notebook 12: is the interconnect healthy? The benchmarks' own output, judged against a site's minimums.

    python -m course_utils.doctor.interconnect_health runs/slurm/interconnect-<job id>/

reads what ``jobs/lumi/interconnect_health.sbatch`` wrote: OSU's ``osu_bw`` between pairs of GCDs
(``osu_bw_node_A_B.txt`` inside a node, ``osu_bw_nodes_A_B.txt`` between two nodes) and the all-reduce
table of rccl-tests (``all_reduce_perf.txt``; nccl-tests print the same table on NVIDIA nodes).

The minimums are LUMI AI Factory's container tests (lumi-ai-factory/laifs-container-tests,
``jobs/mpi-single-node-gpu-to-gpu-pt2pt-osu_bw.yaml`` and ``...-dual-node-...``): ``osu_bw`` with device
buffers between GCD 0 or 1 and every GCD of the node, at 1 MiB and 64 MiB, and between two nodes at least
23,750 MB/s (Slingshot's 25 GB/s less 5 %). They are minimums for ``osu_bw``; an all-reduce's bus bandwidth is
another measure, judged only against a minimum the reader is given, and by what needs no minimum: wrong
results, and a bandwidth that falls away at large messages.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from course_utils import bounded_reading

MIB = 2**20
MB = 1e6  # osu_bw's MB/s are 10**6 bytes per second

# laifs-container-tests' expected_minimums, MB/s, keyed (GCD of rank 0, GCD of rank 1, message bytes).
# GCDs 0 and 1 are the two dies of one MI250X module; a pair on the same GCD copies within its own memory.
LUMI_INTRA_NODE_MINIMUM_MB_S = {
    (0, 0, 64 * MIB): 450000, (0, 1, 64 * MIB): 50000, (0, 2, 64 * MIB): 37000, (0, 3, 64 * MIB): 37000,
    (0, 4, 64 * MIB): 37000, (0, 5, 64 * MIB): 37000, (0, 6, 64 * MIB): 45000, (0, 7, 64 * MIB): 37000,
    (1, 0, 64 * MIB): 50000, (1, 1, 64 * MIB): 450000, (1, 2, 64 * MIB): 37000, (1, 3, 64 * MIB): 37000,
    (1, 4, 64 * MIB): 37000, (1, 5, 64 * MIB): 37000, (1, 6, 64 * MIB): 45000, (1, 7, 64 * MIB): 30000,
    (0, 0, MIB): 45000, (0, 1, MIB): 36000, (0, 2, MIB): 25000, (0, 3, MIB): 25000,
    (0, 4, MIB): 25000, (0, 5, MIB): 25000, (0, 6, MIB): 25000, (0, 7, MIB): 25000,
    (1, 0, MIB): 36000, (1, 1, MIB): 50000, (1, 2, MIB): 25000, (1, 3, MIB): 25000,
    (1, 4, MIB): 25000, (1, 5, MIB): 25000, (1, 6, MIB): 25000, (1, 7, MIB): 25000,
}
LUMI_INTER_NODE_MINIMUM_MB_S = 23750  # 200 Gbit/s per Slingshot NIC = 25,000 MB/s, less 5 %
LUMI_MESSAGE_SIZES = (MIB, 64 * MIB)
COLLAPSE_FRACTION = 0.5  # the largest message below half the peak: the link gave way under load

_RANK_TAG = re.compile(r"\[\d+(?:,\d+)*\](?:<std(?:out|err)>:)?")  # mpirun's --tag-output, "[0]" or "[1,0]<stdout>:"
_OSU_TITLE = re.compile(r"#\s*OSU MPI(?:-(?P<device>\w+))? (?P<test>.+?) Test v(?P<version>\S+)")
# In linear time on any line: neighbouring quantifiers never match the same characters (a bus id holds no blank),
# and the device's name runs to the line's last non-blank instead of a lazy group before ``\s*$``.
_RANK_LINE = re.compile(r"#\s+Rank\s+(?P<rank>\d+)\s.*?\bon\s+(?P<host>\S+)\s+device\s+(?P<device>\d+)\s+"
                        r"\[[^\]\s]*\]\s+(?P<name>\S(?:.*\S)?)")
_AVERAGE = re.compile(r"#\s*Avg bus bandwidth\s*:\s*(?P<value>[0-9.]+)")
_VERSION = re.compile(r"^(?P<library>[rn]ccl)-tests: Version (?P<version>\S+)")


@dataclass
class JudgedMeasurement:
    """One judged measurement: ``status`` is "healthy", "below", "broken" or "not judged"."""
    what: str
    status: str
    measured_gb_s: float | None
    minimum_gb_s: float | None
    text: str

    @property
    def healthy(self) -> bool | None:
        return {"healthy": True, "below": False, "broken": False}.get(self.status)


@dataclass
class OsuBandwidth:
    """``osu_bw``'s table: bandwidth (MB/s, 10**6 bytes) per message size."""
    table: pd.DataFrame  # columns bytes, mb_per_s
    device: str | None = None  # "ROCM", "CUDA", or None for host buffers
    version: str | None = None

    def gb_per_s_at(self, nbytes: int) -> float | None:
        row = self.table[self.table["bytes"] == nbytes]
        return None if row.empty else float(row["mb_per_s"].iloc[-1]) * MB / 1e9


@dataclass
class CollectiveTable:
    """An rccl-tests / nccl-tests table (``all_reduce_perf`` and the others): one row per message size."""
    table: pd.DataFrame  # bytes, time_us, algbw, busbw, wrong, then in_place_time_us, in_place_algbw, ...
    average_busbw: float | None = None
    library: str | None = None  # "rccl" when rccl-tests named itself
    devices: list[str] = field(default_factory=list)  # one per rank: its device's name
    hosts: list[str] = field(default_factory=list)  # one per rank

    @property
    def ranks(self) -> int:
        return len(self.devices)

    @property
    def nodes(self) -> int:
        return len(set(self.hosts))


def _without_rank_tags(line: str) -> str:
    return _RANK_TAG.sub(" ", line)


def _lines(text: str | Iterable[str]) -> Iterator[str]:
    """A result's lines, from its text or as :class:`bounded_reading.Lines` reads a file, each cut to a bound."""
    return bounded_reading.cut(text.splitlines() if isinstance(text, str) else text)


def parse_osu_bw(text: str | Iterable[str]) -> OsuBandwidth:
    """``osu_bw``'s output (OSU micro-benchmarks 5 to 7, MPI, host or device buffers): its text or its lines."""
    rows, device, version = [], None, None
    for raw in _lines(text):
        line = _without_rank_tags(raw).strip()
        title = _OSU_TITLE.match(line)
        if title:
            device, version = title["device"], title["version"]
        fields = line.split()
        if len(fields) >= 2 and fields[0].isdigit():
            try:
                rows.append((int(fields[0]), float(fields[1])))
            except ValueError:
                continue
    if not rows:
        raise ValueError("no osu_bw table here: expected lines of '<bytes> <MB/s>' after '# Size  Bandwidth (MB/s)' "
                         "(run osu_bw itself, e.g. osu_bw -m 1048576:67108864 D D)")
    return OsuBandwidth(pd.DataFrame(rows, columns=["bytes", "mb_per_s"]), device, version)


_COLUMN_NAMES = {"size": "bytes", "time": "time_us", "#wrong": "wrong"}


def _columns(header: str) -> list[str]:
    """The table's column names from its header line; the second half (in-place) prefixed."""
    names, seen = [], set()
    for word in header.lstrip("#").split():
        name = _COLUMN_NAMES.get(word, word)
        names.append(f"in_place_{name}" if name in seen else name)
        seen.add(name)
    return names


def parse_collective_table(text: str | Iterable[str]) -> CollectiveTable:
    """The table of rccl-tests or nccl-tests (any release: with or without the ``root`` column, ``#wrong`` or the
    older ``error``), and what it says of its ranks, from its text or its lines; mpirun's rank tags (``[0]``) are
    skipped."""
    columns, rows, devices, hosts, average, library = None, [], [], [], None, None
    for raw in _lines(text):
        line = _without_rank_tags(raw).rstrip()
        stripped = line.strip()
        if re.match(r"#\s+size\s+count\s", stripped):
            columns = _columns(stripped)
        elif (rank := _RANK_LINE.match(stripped)) is not None:
            devices.append(rank["name"])
            hosts.append(rank["host"])
        elif (found := _AVERAGE.match(stripped)) is not None:
            average = float(found["value"])
        elif (named := _VERSION.match(stripped)) is not None:
            library = named["library"]
        elif stripped and stripped[0].isdigit():
            rows.append(stripped.split())
    if not rows:
        raise ValueError("no rccl-tests/nccl-tests table here: expected the lines after '#  size  count  type ...' "
                         "(the whole output of all_reduce_perf, not only its summary)")
    if columns is None:  # a table cut below its header: as many columns as the rows, in the releases' orders
        columns = _columns("# size count type redop root time algbw busbw #wrong time algbw busbw #wrong"
                           if len(rows[0]) == 13 else
                           "# size count type redop time algbw busbw error time algbw busbw error")
    table = pd.DataFrame([row[: len(columns)] for row in rows if len(row) >= len(columns)], columns=columns)
    for name in table.columns:
        if name not in ("type", "redop"):
            table[name] = pd.to_numeric(table[name], errors="coerce")
    return CollectiveTable(table, average, library, devices, hosts)


def from_allreduce_sweep(sweep: pd.DataFrame, device: str, host: str) -> CollectiveTable:
    """The course's own all-reduce sweep (``course_utils.doctor.allreduce``, its ``--out`` JSON) as a table
    of the same columns, so that the same checks read it."""
    table = pd.DataFrame({"bytes": sweep["bytes"], "time_us": sweep["seconds"] * 1e6,
                          "algbw": sweep["algorithm_gb_per_s"], "busbw": sweep["bus_gb_per_s"],
                          "wrong": sweep["wrong"]})
    ranks = int(sweep["world_size"].iloc[0])
    return CollectiveTable(table, devices=[device] * ranks, hosts=[host] * ranks)


def _gb(mb_per_s: float) -> float:
    return mb_per_s * MB / 1e9


def lumi_minimum_gb_s(first_gcd: int, second_gcd: int, nbytes: int, between_nodes: bool = False) -> float | None:
    """LUMI's container tests' minimum for ``osu_bw`` from ``first_gcd`` to ``second_gcd`` (None where they set
    none: other pairs or sizes than theirs)."""
    if between_nodes:
        return _gb(LUMI_INTER_NODE_MINIMUM_MB_S) if nbytes in LUMI_MESSAGE_SIZES else None
    minimum = LUMI_INTRA_NODE_MINIMUM_MB_S.get((first_gcd, second_gcd, nbytes))
    return None if minimum is None else _gb(minimum)


def judge(what: str, measured_gb_s: float | None, minimum_gb_s: float | None) -> JudgedMeasurement:
    """A measured bandwidth against its minimum; "not judged" when either is missing."""
    if measured_gb_s is None:
        return JudgedMeasurement(what, "not judged", None, minimum_gb_s, f"{what}: not measured")
    if minimum_gb_s is None:
        return JudgedMeasurement(what, "not judged", measured_gb_s, None,
                       f"{what}: {measured_gb_s:.1f} GB/s (no minimum to judge it by)")
    status = "healthy" if measured_gb_s >= minimum_gb_s else "below"
    words = "at least" if status == "healthy" else "BELOW"
    return JudgedMeasurement(what, status, measured_gb_s, minimum_gb_s,
                   f"{what}: {measured_gb_s:.1f} GB/s, {words} the minimum of {minimum_gb_s:.2f} GB/s")


def judge_osu_pair(result: OsuBandwidth, first_gcd: int, second_gcd: int,
                   between_nodes: bool = False) -> list[JudgedMeasurement]:
    """One pair's ``osu_bw`` at each message size of LUMI's test, against its minimum."""
    where = "node to node" if between_nodes else "in the node"
    verdicts = []
    for nbytes in LUMI_MESSAGE_SIZES:
        what = f"osu_bw GCD {first_gcd} -> GCD {second_gcd} ({where}), {nbytes // MIB} MiB"
        verdicts.append(judge(what, result.gb_per_s_at(nbytes),
                              lumi_minimum_gb_s(first_gcd, second_gcd, nbytes, between_nodes)))
    return verdicts


def judge_collective(result: CollectiveTable, name: str = "all_reduce_perf",
                     minimum_busbw_gb_s: float | None = None) -> list[JudgedMeasurement]:
    """A collective's table: wrong results and a bandwidth that collapses at large messages are broken whatever
    the machine; the peak bus bandwidth is judged only against a minimum given for this machine."""
    table = result.table
    where = f"{name} on {result.ranks} ranks, {result.nodes} node(s)" if result.ranks else name
    verdicts = []
    wrong = int(table.filter(like="wrong").fillna(0).to_numpy().sum())  # "#wrong"; older releases print "error"
    if wrong:
        verdicts.append(JudgedMeasurement(f"{where}: results", "broken", None, None,
                                f"{where}: {wrong} wrong elements: the collective corrupts data"))
    peak_row = table.loc[table["busbw"].idxmax()]
    peak, last = float(peak_row["busbw"]), float(table["busbw"].iloc[-1])
    if peak > 0 and last < COLLAPSE_FRACTION * peak:
        verdicts.append(JudgedMeasurement(f"{where}: large messages", "broken", last, peak,
                                f"{where}: bus bandwidth falls from {peak:.1f} GB/s at {int(peak_row['bytes']):,} B "
                                f"to {last:.1f} GB/s at {int(table['bytes'].iloc[-1]):,} B: the link gives way "
                                "under load (a transport fallback, a congested or failing link)"))
    verdicts.append(judge(f"{where}: peak bus bandwidth", peak, minimum_busbw_gb_s))
    return verdicts


RESULT_NAMES = ("osu_bw_node_A_B.txt (osu_bw between GCDs A and B of one node), osu_bw_nodes_A_B.txt (between "
                "two nodes) and NAME_perf.txt (rccl-tests or nccl-tests, such as all_reduce_perf.txt)")
_OSU_NAME = re.compile(r"osu_bw_(?P<where>nodes?)_(?P<first>\d+)_(?P<second>\d+)\.txt")
_COLLECTIVE_NAME = re.compile(r".+_perf\.txt")
_RESULT_FIX = "give the folder of the text files the benchmarks printed (jobs/lumi/interconnect_health.sbatch)"


class _LastLine:
    """A result's lines as they are read, remembering the last one that is not blank."""

    def __init__(self, lines: Iterable[str]) -> None:
        self.lines, self.last = lines, ""

    def __iter__(self) -> Iterator[str]:
        for line in self.lines:
            self.last = line.strip() or self.last
            yield line


def _judged(path: Path, judge_file: Callable[[Iterable[str]], list[JudgedMeasurement]]) -> list[JudgedMeasurement]:
    """A result file's verdicts, read in a stream from a regular text file; one that is something else, or holds
    no result (the benchmark failed or printed nothing), is broken."""
    try:
        lines = _LastLine(bounded_reading.Lines(path, what="result file", fix=_RESULT_FIX))
    except bounded_reading.NotReadable as error:
        return [JudgedMeasurement(path.stem, "broken", None, None, str(error))]
    try:
        return judge_file(lines)
    except ValueError:
        return [JudgedMeasurement(path.stem, "broken", None, None,
                        f"{path.name}: no result; its last line: {lines.last[:200] or 'nothing'}")]


def _judge(path: Path, minimum_busbw_gb_s: float | None) -> list[JudgedMeasurement]:
    """The verdicts of one result, which its name says how to read; a name the check does not know is said."""
    if osu := _OSU_NAME.fullmatch(path.name):
        pair = int(osu["first"]), int(osu["second"])
        return _judged(path, lambda lines: judge_osu_pair(parse_osu_bw(lines), *pair,
                                                          between_nodes=osu["where"] == "nodes"))
    if _COLLECTIVE_NAME.fullmatch(path.name):
        return _judged(path, lambda lines: judge_collective(parse_collective_table(lines), path.stem,
                                                            minimum_busbw_gb_s))
    return [JudgedMeasurement(path.stem, "not judged", None, None,
                    f"{path.name}: not read, a name the health check does not know: it reads {RESULT_NAMES}; "
                    "rename the file to the one it holds")]


def _order(path: Path) -> tuple[int, str]:
    """Pairs inside a node, then between nodes, then the collectives, then the rest."""
    osu = _OSU_NAME.fullmatch(path.name)
    group = (0 if osu["where"] == "node" else 1) if osu else 2 if _COLLECTIVE_NAME.fullmatch(path.name) else 3
    return group, path.name


def read_folder(folder: str | Path, minimum_busbw_gb_s: float | None = None) -> pd.DataFrame:
    """Every result the job wrote in ``folder``, judged: one row per verdict."""
    folder = Path(folder)
    paths = sorted((path for path in folder.glob("*") if not path.name.startswith(".")), key=_order)
    if not any(_order(path)[0] < 3 for path in paths):
        found = f" (it holds {', '.join(path.name for path in paths[:5])})" if paths else ""
        raise FileNotFoundError(f"no result file in {folder}{found}: the health check reads {RESULT_NAMES}; is it "
                                "the folder jobs/lumi/interconnect_health.sbatch wrote (runs/slurm/interconnect-<job "
                                "id>)?")
    verdicts = [verdict for path in paths if _order(path)[0] < 3 or not path.is_dir()
                for verdict in _judge(path, minimum_busbw_gb_s)]
    return pd.DataFrame([vars(verdict) for verdict in verdicts])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", help="the folder of osu_bw_*.txt and *_perf.txt files a health-check job wrote")
    parser.add_argument("--minimum-busbw", type=float, default=None,
                        help="GB/s the collective's peak bus bandwidth must reach on this machine (default: none)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        verdicts = read_folder(args.folder, args.minimum_busbw)
    except FileNotFoundError as error:
        print(f"interconnect_health: {error}", file=sys.stderr)
        return 2
    for text in verdicts["text"]:
        print(text)
    unhealthy = verdicts[verdicts["status"].isin(["below", "broken"])]
    print(f"{len(unhealthy)} of {len(verdicts)} checks failed" if len(unhealthy) else
          f"all {int((verdicts['status'] == 'healthy').sum())} judged checks passed "
          f"({int((verdicts['status'] == 'not judged').sum())} not judged)")
    return 1 if len(unhealthy) else 0


if __name__ == "__main__":
    sys.exit(main())
