"""Why did the communication library fail? Notebook 12 (and the doctor beside a stuck job) names a known NCCL/RCCL
failure and its fix from the ranks' own log, or says honestly that it does not know it, with what it read.

Each known failure is a row of :data:`KNOWN_FAILURES`: the log lines that identify it (regular expressions), what
it means, the fix (environment variables, module loads, container flags) and the public thread it comes from. A
log often shows several: a missing network plugin, then sockets, then a hang. The cause is the finding that shows
first in the log, unless another finding explains it (PyTorch's bundled RCCL is why the image's plugin was not
found); the rest are reported as consequences. What the library chose (its network, plugin and connections) is
read by :mod:`course_utils.doctor.transport`, not again here. A hang that leaves no error line can only be
consistent with a known report: its row names what the log cannot show (the image it was reported on), and the
sentence says so rather than claiming it.

    python -m course_utils.doctor.comm_failures LOGFILE   # one sentence: the failure and its fix
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from course_utils import bounded_reading
from course_utils.doctor import transport

# Every pattern reads a line in linear time: no lazy group before ``\s*$``, no ``.*`` between two words (tried again
# from each place the first word stands), no two blanks' quantifiers side by side.
RINGS = re.compile(r"NCCL INFO Connected all rings")
TREES = re.compile(r"NCCL INFO Connected all trees")
WATCHDOG_TIMEOUT = re.compile(r"Watchdog caught collective operation timeout: WorkNCCL\(")
BOGUS_OOM = re.compile(r"out of memory\. Tried to allocate more than 1EB memory")
OUT_OF_MEMORY = re.compile(r"(?:CUDA|HIP) out of memory\. Tried to allocate \d")
KILLED = (re.compile(r"exitcode\s*:\s*-9\b"), re.compile(r"Signal 9 \(SIGKILL\) received by PID"))
CXI = re.compile(r"NET/OFI Selected [Pp]rovider is cxi\b")  # libfabric on Slingshot: LUMI's network
# RCCL's banner (``RCCL version : 2.21.5-HEAD:...`` or ``RCCL version 2.16.5+hip5.6``), NCCL's
# (``NCCL version 2.10.3+cuda11.3``) and PyTorch's (``NCCL version: 2.20.5``)
VERSION = re.compile(r"(?P<library>[NR]CCL) version(?:\s*:)?\s*(?P<version>\d+\.\d+\.\d+\S*)")
RCCL = re.compile(r"RCCL version|Librccl path|aws-ofi-rccl| comm 0x[0-9a-f]+ nRanks \d+")
INTERFACES = re.compile(r"NCCL INFO (?:Bootstrap|NET/Socket) : Using (?P<list>.*\S)")
INTERFACE = re.compile(r"(?:\[\d+\])?(?<![\w.-])(?P<name>[A-Za-z][\w.-]*):")  # from the start of a word only
IFNAME = re.compile(r"NCCL_SOCKET_IFNAME set by environment to (?P<value>\S+)")
ERROR = re.compile(r"(?P<text>\b\w*(?:Error|Exception)\b:.*\S|Watchdog caught collective operation timeout.*\S|"
                   r"Last NCCL warning.*\S)")
ERROR_WORDS = ("Error", "Exception", "Watchdog caught", "Last NCCL warning")  # one of them is in every ERROR line


def _rocm_other_than(version: str) -> re.Pattern:
    """RCCL's banner naming a ROCm release other than ``version`` (``ROCm version : 6.3.3.0-74-cbc70b5``): a log
    that shows one cannot be a report made on an image of ``version``."""
    return re.compile(rf"ROCm version\s*:\s*(?!{re.escape(version)}\.)\d")


# How far a communicator's set-up got, in the order NCCL and RCCL print it: after their prefix, or opening a line
# quoted without it; not inside a line that merely quotes the words
LIBRARY_PREFIX = re.compile(r"NCCL (?:INFO|WARN) ")
STAGES = (("Init START", "init started"), ("Connected all rings", "rings connected"),
          ("Connected all trees", "trees connected"), ("Init COMPLETE", "init complete"),
          ("Abort COMPLETE", "aborted"))


@dataclass(frozen=True)
class KnownFailure:
    """One failure seen in the field: the lines that identify it and what to do about it."""

    name: str
    title: str
    signs: tuple[re.Pattern, ...]  # a line matching any of these marks it; the first such line is where it shows
    meaning: str
    fix: str
    source: str
    needs: tuple[re.Pattern, ...] = ()  # each must match some line of the log too
    needs_any: tuple[re.Pattern, ...] = ()  # at least one must match some line (none given: no condition)
    unless: tuple[re.Pattern, ...] = ()  # a line matching one of these rules it out
    network: str | None = None  # the network the library must have used (transport's kind), where it matters
    explains: tuple[str, ...] = ()  # other failures that follow from this one
    # where the log cannot tell it from another failure: what must also hold for it to be this report (the sentence
    # then says the log is consistent with it, not that it is it)
    condition: str = ""
    # shown by a communicator's set-up begun after another's completed and never completed itself (signs unused)
    after_an_init: bool = False


KNOWN_FAILURES = (
    KnownFailure(
        "bundled_rccl", "PyTorch loaded its own bundled RCCL, not the image's",
        (re.compile(r"Librccl path : \S*/torch/lib/librccl\.so"),),
        "the RCCL inside the PyTorch wheel (torch/lib/librccl.so) does not use the libfabric and aws-ofi-rccl "
        "plugin the image was built with, so multi-node DDP and DeepSpeed scale badly",
        'export LD_PRELOAD="/usr/lib/libfabric.so.1 /opt/rocm/lib/librccl.so.1" into the container '
        "(SINGULARITYENV_LD_PRELOAD, or --env with singularity exec), or bind the image's RCCL over PyTorch's "
        "(-B /opt/rocm/lib/librccl.so:<site-packages>/torch/lib/librccl.so)",
        "lumi-ai-factory/laifs-container-recipes#18",
        explains=("plugin_missing_sockets",)),
    KnownFailure(
        "plugin_missing_sockets", "the network plugin is missing: TCP sockets between nodes",
        (re.compile(r"NET/Plugin ?: (?:No plugin found|Could not find|Plugin load (?:\(\S*\) )?returned)"),),
        "NCCL/RCCL found no network plugin (librccl-net.so / libnccl-net.so, the aws-ofi plugin for Slingshot "
        "or EFA) and no InfiniBand, so it sends between nodes over TCP sockets: far slower, and fragile at scale "
        "(one node alone does not need it: its GPUs talk over P2P or SHM)",
        "load the plugin: on LUMI run LUMI's PyTorch container with `module use /appl/local/laifs/modules; "
        "module load lumi-aif-singularity-bindings` (or put aws-ofi-rccl's lib folder on LD_LIBRARY_PATH), "
        "then check that the log says `NET/OFI Selected provider is cxi` and `Using network Libfabric`",
        "ROCm/rccl#1026 (solved with aws-ofi-rccl)",
        network="NET/Socket"),
    KnownFailure(
        "plugin_failed_sockets", "the network plugin started, failed, and NCCL fell back to TCP sockets",
        (re.compile(r"NCCL WARN NET/OFI (?:\S+ ){0,8}?initiali[sz]ation failed"),),
        "the aws-ofi plugin loaded but found no usable libfabric provider or NIC (the provider filter, a "
        "libfabric too old for it, or devices the container cannot see), so NCCL sends between nodes over TCP",
        "rerun with FI_LOG_LEVEL=warn to read libfabric's reason; let the container see the NICs and the "
        "host's libfabric (on LUMI the lumi-aif-singularity-bindings module, FI_PROVIDER=cxi; on AWS the EFA "
        "devices, FI_PROVIDER=efa)",
        "aws/aws-ofi-nccl#715",
        network="NET/Socket", explains=("plugin_missing_sockets",)),
    KnownFailure(
        "socket_ifname", "NCCL_SOCKET_IFNAME names no usable interface",
        (re.compile(r"no (?:NCCL_SOCKET_IFNAME )?socket interface found"),
         re.compile(r"ncclSocketInit: connecting to address\s+with family \d+ is neither AF_INET")),
        "NCCL_SOCKET_IFNAME matched no interface of this node (a name another node has, a typo, or a pattern "
        "that leaves no routable interface), so the bootstrap between ranks cannot open a socket",
        "list the node's interfaces on a compute node (`ip -br addr`) and set NCCL_SOCKET_IFNAME to one that "
        "exists on every node and carries its address (a prefix such as `eth` matches eth0, `^lo,docker` "
        "excludes; on LUMI `hsn0,hsn1,hsn2,hsn3`), or unset it; set GLOO_SOCKET_IFNAME the same way",
        "NVIDIA/nccl#1837, marin-community/marin#7018"),
    KnownFailure(
        "rings_never_trees", "the init connected its rings and never its trees",
        (RINGS,),
        "every rank got as far as 'Connected all rings' and none to 'Connected all trees': the set-up stopped "
        "while connecting the trees (LUMI's ROCm 7 image with NCCL_NET_GDR_LEVEL set hangs here for good)",
        "on LUMI's ROCm 7 image unset NCCL_NET_GDR_LEVEL (laifs-container-recipes #30) or go back to the "
        "ROCm 6.4 image; elsewhere read the first NCCL WARN after the rings",
        "lumi-ai-factory/laifs-container-recipes#28",
        needs_any=(re.compile(r"NCCL_NET_GDR_LEVEL set by environment"), RCCL),
        unless=(TREES, re.compile(r"Init COMPLETE"))),
    KnownFailure(
        "timeout_reported_as_oom", "a collective timed out, and the job then reported a bogus out-of-memory",
        (WATCHDOG_TIMEOUT, BOGUS_OOM),
        "no GPU has an exabyte: 'more than 1EB' is a size read from a broken exchange between ranks (an object "
        "collective after a timeout or a desync), not a real lack of memory; the timeout is the failure",
        "ignore the out-of-memory error and find why the collective timed out: where each rank stands "
        "(py-spy dump, Flight Recorder with TORCH_NCCL_TRACE_BUFFER_SIZE), mismatched collectives "
        "(TORCH_DISTRIBUTED_DEBUG=DETAIL), and NCCL_DEBUG=WARN for the library's own message",
        "NVIDIA/nccl#1284",
        needs=(BOGUS_OOM,)),
    KnownFailure(
        "out_of_memory", "a rank ran out of GPU memory; the others then timed out waiting for it",
        (OUT_OF_MEMORY,),
        "one rank could not allocate its tensors and died; the collectives of the other ranks wait for it "
        "until the process group's timeout, so their timeouts are a consequence",
        "fit the step in memory: a smaller batch per rank, activation checkpointing or sharding (notebook 09's "
        "ladder); PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True where reserved but unallocated memory is large",
        "modelscope/FunASR#2006"),
    KnownFailure(
        "rank_killed", "a rank was killed from outside (SIGKILL); the other ranks' errors follow from it",
        KILLED,
        "nothing inside the rank failed: something killed it, most often the kernel's out-of-memory killer (host "
        "memory: many DataLoader workers, a data set copied into every rank), else the scheduler (a memory or time "
        "limit) or a person; torchrun then ended the other ranks, and their errors ('Connection closed by peer', "
        "SIGTERM) are consequences",
        "read why: the node's kernel log (`dmesg -T | grep -i -E 'killed process|out of memory'`) or Slurm's account "
        "(`sacct -j JOBID --format=JobID,State,MaxRSS,ReqMem`: OUT_OF_MEMORY); use less host memory (fewer "
        "--workers, no per-rank copy of the data) or ask for more (--mem); with torchrun's --max-restarts and "
        "--resume auto the job goes on from its last checkpoint (notebook 12, section 5)",
        "lzhxmu/CPPO#6, hpcaitech/ColossalAI#3514"),
    KnownFailure(
        "new_group_setup_hangs", "a later communicator's set-up never completed, with no error",
        (),
        "the ranks completed one communicator's set-up, then began another's (a new process group's first "
        "collective: tensor, pipeline or expert parallelism) and the log ends before it completed, with no error "
        "and no timeout: so ends the report's hang, a new group's first all_reduce that blocked on every rank in 13 "
        "of 17 tries on 4 nodes (32 ranks) while a job with one group passed every time",
        "export FI_MR_CACHE_MONITOR=userfaultfd (LUMI's AI guide sets it against hangs in LUMI AI Factory's "
        "containers; the course's LUMI scripts set it with the container, jobs/lumi/course_python.sh) and rerun; "
        "if it still hangs, add the log to the report",
        "lumi-ai-factory/laifs-container-recipes#44, Lumi-supercomputer/LUMI-AI-Guide#118",
        needs=(CXI,), needs_any=(RCCL,), unless=(ERROR, _rocm_other_than("7.0")),
        condition="the job ran LUMI AI Factory's image of 2026-08-07 (lumi-multitorch-*-u24r70f21m50t210-"
                  "20260807_115122, ROCm 7.0), where it was reported, without FI_MR_CACHE_MONITOR set",
        after_an_init=True),
    KnownFailure(
        "rccl_ddp_hang_rocm64", "an RCCL collective never finished, as in a DDP hang of LUMI's ROCm 6.4 images",
        (WATCHDOG_TIMEOUT,),
        "a collective over RCCL waited past the process group's timeout with no error of its own; in the report, "
        "RCCL communications sometimes hang in PyTorch DDP runs: one rank falls behind, and the others wait to "
        "receive what it has not yet sent",
        "try export CUDA_LAUNCH_BLOCKING=1, the image maintainers' workaround (it often avoids the hang, but every "
        "kernel launch then waits for the kernel: too slow for a job that launches many small kernels), or a "
        "ROCm 7 image, where they expected the fix; if it still hangs, find where each rank stands (py-spy dump, "
        "Flight Recorder with TORCH_NCCL_TRACE_BUFFER_SIZE)",
        "lumi-ai-factory/laifs-container-recipes#20",
        needs_any=(RCCL,), unless=(BOGUS_OOM, OUT_OF_MEMORY, *KILLED, _rocm_other_than("6.4")),
        condition="the job ran one of LUMI AI Factory's ROCm 6.4 images of 2026-01-24 to 2026-03-19 "
                  "(lumi-multitorch-*-u24r64f21m43t29-*) with the workaround of #18"),
    KnownFailure(
        "collective_timeout", "a collective did not finish within the process group's timeout",
        (WATCHDOG_TIMEOUT,),
        "a collective waited longer than the process group's timeout: a rank never reached it, the ranks called "
        "different collectives, or the network stalled",
        "find where each rank stands (py-spy dump of every rank, Flight Recorder with "
        "TORCH_NCCL_TRACE_BUFFER_SIZE) and catch mismatches with TORCH_DISTRIBUTED_DEBUG=DETAIL; the first rank "
        "that failed on its own is the one to read",
        "vllm-project/vllm#6042"),
)


@dataclass(frozen=True)
class Finding:
    """A known failure found in a log, and the line that showed it first."""

    failure: KnownFailure
    line_number: int  # 1-based
    line: str


@dataclass(frozen=True)
class Diagnosis:
    """A log's known failures (the cause first) and what was read from it."""

    findings: list[Finding]  # the cause first, then what follows from it
    versions: list[str]
    transport: transport.Transport
    interfaces: list[str]
    socket_ifname: str | None
    stage: str | None
    errors: list[str] = field(default_factory=list)  # the first of them (bounded_reading.KEPT of each kind)
    more_errors: int = 0  # error lines beyond those kept
    unread: str = ""  # what was left unread when the time to read the log ran out

    @property
    def cause(self) -> KnownFailure | None:
        return self.findings[0].failure if self.findings else None

    def what_was_read(self) -> str:
        """What the log told: versions, network and plugin, interfaces, how far the set-up got, the errors."""
        used = self.transport.used_network()
        plugin = self.transport.plugin or (f"provider {self.transport.provider}" if self.transport.provider else None)
        parts = [
            f"library {', '.join(self.versions)}" if self.versions else "no NCCL/RCCL version line",
            f"network {used.removeprefix('NET/')}" if used else "no network named",
            f"plugin {plugin}" if plugin else "",
            f"NCCL_SOCKET_IFNAME={self.socket_ifname}" if self.socket_ifname else "",
            f"interfaces {', '.join(self.interfaces)}" if self.interfaces else "",
            f"set-up reached: {self.stage}" if self.stage else "no set-up stage",
            (f"{len(self.errors) + self.more_errors} error line(s), the first: {self.errors[0][:160]}"
             if self.errors else "no error line"),
        ]
        return "; ".join(part for part in parts if part)

    def _unread_words(self) -> str:
        return (f" Only part of the log was read ({self.unread}): for the rest, give its end "
                "(`tail -c 100M LOG > end.log`)." if self.unread else "")

    def sentence(self) -> str:
        """The known failure and its fix (or the known report the log is consistent with, and what would make it
        that report), or 'not recognised' with what was read."""
        if not self.findings:
            return (f"communication log: not recognised (none of the known failures); read: {self.what_was_read()}"
                    f"{self._unread_words()}")
        first = self.findings[0]
        failure = first.failure
        also = [finding.failure.title for finding in self.findings[1:]]
        then = f" Also seen after it: {'; '.join(also)}." if also else ""
        known = f"{failure.title} (line {first.line_number}; known from {failure.source}). It means {failure.meaning}."
        if failure.condition:
            known = (f"consistent with a known report, not certain: {known} The log alone cannot tell it from another "
                     f"hang: it is this report if {failure.condition}.")
        return f"communication log: {known} Fix: {failure.fix}.{then}{self._unread_words()}"


def _one_node(found: transport.Transport) -> bool:
    """Whether the log's connections are all inside a node (then the network between nodes does not matter)."""
    kinds = found.connections["kind"]
    return not kinds.empty and not kinds.str.startswith("NET/").any()


def _ordered(findings: list[Finding]) -> list[Finding]:
    """The cause first: the earliest finding that no other present finding explains; then the rest in order."""
    present = {finding.failure.name for finding in findings}
    explained = {name for finding in findings for name in finding.failure.explains if name in present}
    findings = sorted(findings, key=lambda finding: finding.line_number)
    causes = [finding for finding in findings if finding.failure.name not in explained]
    return causes[:1] + [finding for finding in findings if finding not in causes[:1]]


def _stages(line: str) -> set[int]:
    """The set-up stages a line shows, from the library's own lines only (a line that quotes its words says
    nothing): the marker opens the line, or follows NCCL's prefix."""
    line = line.strip()
    prefix = LIBRARY_PREFIX.search(line)
    after = line[prefix.end():] if prefix else ""
    return {index for index, (marker, _) in enumerate(STAGES) if line.startswith(marker) or marker in after}


CONDITIONS = tuple(dict.fromkeys(pattern for failure in KNOWN_FAILURES
                                 for pattern in (*failure.needs, *failure.needs_any, *failure.unless)))


class _Reading:
    """One pass over a log, keeping what the diagnosis needs: each failure's first sign, which conditions some line
    met, the versions, interfaces and errors (the first of each), and the stages reached."""

    def __init__(self) -> None:
        self.number = 0
        self.transport = transport.Reader()
        self.first_signs: dict[str, tuple[int, str]] = {}  # failure -> (line number, line)
        self.met: set[re.Pattern] = set()
        self.versions: dict[str, None] = {}
        self.interfaces: dict[str, None] = {}
        self.ifname: str | None = None
        self.errors: list[str] = []
        self.more_errors = 0
        self.stages: set[int] = set()
        self.init_completed = False  # some communicator's set-up completed
        self.unfinished: tuple[int, str] | None = None  # the first set-up line since the last set-up ended

    def add(self, line: str) -> None:
        self.number += 1
        self.transport.add(line)
        for failure in KNOWN_FAILURES:
            if failure.name not in self.first_signs and any(sign.search(line) for sign in failure.signs):
                self.first_signs[failure.name] = (self.number, line)
        self.met.update(pattern for pattern in CONDITIONS if pattern not in self.met and pattern.search(line))
        if (match := VERSION.search(line)) and len(self.versions) < bounded_reading.KEPT:
            self.versions[f"{match['library']} {match['version']}"] = None
        if match := INTERFACES.search(line):
            for interface in INTERFACE.finditer(match["list"]):
                if len(self.interfaces) < bounded_reading.KEPT:
                    self.interfaces[interface["name"]] = None
        if self.ifname is None and (match := IFNAME.search(line)):
            self.ifname = match["value"]
        if any(word in line for word in ERROR_WORDS) and (match := ERROR.search(line)) and "NCCL WARN" not in line:
            if len(self.errors) < bounded_reading.KEPT:
                self.errors.append(match["text"])
            else:
                self.more_errors += 1
        stages = _stages(line)
        self.stages |= stages
        self._follow_setup(stages, line)

    def _follow_setup(self, stages: set[int], line: str) -> None:
        """Keep the first set-up line after the last set-up that ended: one that never ends is a set-up left
        hanging (a log of ranks together interleaves their lines, but any rank's end comes after its start)."""
        ended = {STAGES[index][0] for index in stages} & {"Init COMPLETE", "Abort COMPLETE"}
        if ended:
            self.init_completed |= "Init COMPLETE" in ended
            self.unfinished = None
        elif stages and self.unfinished is None:
            self.unfinished = (self.number, line)

    def _first_sign(self, failure: KnownFailure) -> tuple[int, str] | None:
        """Where the failure first shows: its first sign, or the set-up left hanging after an init completed."""
        if failure.after_an_init:
            return self.unfinished if self.init_completed else None
        return self.first_signs.get(failure.name)

    def _holds(self, failure: KnownFailure, found: transport.Transport) -> bool:
        """Whether the failure's conditions hold over the whole log."""
        if any(pattern in self.met for pattern in failure.unless):
            return False
        if not all(pattern in self.met for pattern in failure.needs):
            return False
        if failure.needs_any and not any(pattern in self.met for pattern in failure.needs_any):
            return False
        return not (failure.network and (found.used_network() != failure.network or _one_node(found)))

    def diagnosis(self) -> Diagnosis:
        found = self.transport.transport()
        findings = [Finding(failure, *sign) for failure in KNOWN_FAILURES
                    if (sign := self._first_sign(failure)) and self._holds(failure, found)]
        # the same line can mark two rows (a watchdog timeout): the more specific row, earlier in the table, keeps it
        kept, seen_lines = [], set()
        for finding in findings:
            if finding.line_number not in seen_lines:
                kept.append(finding)
                seen_lines.add(finding.line_number)
        errors = [f"NCCL WARN {warning}" for warning in found.warnings] + self.errors
        return Diagnosis(_ordered(kept), list(self.versions), found, list(self.interfaces), self.ifname,
                         STAGES[max(self.stages)][1] if self.stages else None, errors,
                         more_errors=found.more_warnings + self.more_errors)


def diagnose(log: str | Iterable[str]) -> Diagnosis:
    """Name the known failure in a run's log (all ranks' output together, ``NCCL_DEBUG=INFO`` or ``WARN``), read
    in one pass: each line cut to :data:`bounded_reading.MAX_LINE_CHARS`, only what the diagnosis needs kept."""
    reading = _Reading()
    for line in bounded_reading.cut(log.splitlines() if isinstance(log, str) else log):
        reading.add(line.rstrip("\n"))
    return reading.diagnosis()


def read_log(path: str | Path, seconds: float | None = None) -> Diagnosis:
    """The diagnosis of a log file, read in a stream from a regular file only (else
    :class:`bounded_reading.NotReadable` says what it is); given ``seconds``, of what was read within them."""
    lines = bounded_reading.Lines(path, seconds=seconds)
    diagnosis = diagnose(lines)
    if not lines.cut_short:
        return diagnosis
    return replace(diagnosis, unread=f"{lines.what_was_read()} within {seconds:g} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", type=Path, help="a run's output (NCCL_DEBUG=INFO or WARN), all ranks together")
    args = parser.parse_args(argv)
    diagnosis = bounded_reading.read_for_a_command("comm_failures", args.log, read_log)
    if diagnosis is None:
        return 2
    print(diagnosis.sentence())
    return 0


if __name__ == "__main__":
    sys.exit(main())
