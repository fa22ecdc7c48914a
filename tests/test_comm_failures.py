"""The known NCCL/RCCL failures named from real logs of the field, with their fixes; an unknown log is not guessed."""

from pathlib import Path

import pytest

from course_utils.doctor import comm_failures, examination

NCCL = Path(__file__).parent / "fixtures" / "nccl"  # failures/ and field/: sources in fixtures/README.md


def _lines(name: str) -> list[str]:
    """A real log without its first line, the ``# cut: ...`` note that says where it comes from."""
    path = NCCL / "failures" / name
    lines = (path if path.exists() else NCCL / "field" / name).read_text().splitlines()
    assert lines[0].startswith("# cut: ")
    return lines[1:]


def _names(diagnosis: comm_failures.Diagnosis) -> list[str]:
    return [finding.failure.name for finding in diagnosis.findings]


@pytest.mark.parametrize(("name", "failure", "fix"), [
    ("rccl_slingshot_no_plugin_socket.log", "plugin_missing_sockets", "lumi-aif-singularity-bindings"),
    ("aws_ofi_loaded_socket_used.log", "plugin_failed_sockets", "FI_LOG_LEVEL=warn"),
    ("nccl_socket_ifname_not_found.log", "socket_ifname", "ip -br addr"),
    ("xla_bootstrap_no_socket_interface.log", "socket_ifname", "NCCL_SOCKET_IFNAME"),
    ("torch_watchdog_timeout.log", "collective_timeout", "TORCH_DISTRIBUTED_DEBUG=DETAIL"),
    ("torch_oom_1eb.log", "timeout_reported_as_oom", "ignore the out-of-memory error"),
    ("torch_oom_then_timeouts.log", "out_of_memory", "expandable_segments"),
    ("torchrun_root_cause_sigkill.log", "rank_killed", "dmesg -T"),
    ("torchrun_agent_sigkill_sigterm_others.log", "rank_killed", "OUT_OF_MEMORY"),
])
def test_each_failure_from_the_field_is_named_with_its_fix(name, failure, fix):
    diagnosis = comm_failures.diagnose(_lines(name))
    assert diagnosis.cause is not None and diagnosis.cause.name == failure
    sentence = diagnosis.sentence()
    assert sentence.startswith(f"communication log: {diagnosis.cause.title} (line ")
    assert f"Fix: {diagnosis.cause.fix}" in sentence and fix in sentence
    assert diagnosis.cause.source in sentence


def test_a_log_with_two_findings_reports_the_first_cause():
    # RCCL without its plugin on Slingshot: sockets between nodes, then rings connected and never the trees
    slingshot = comm_failures.diagnose(_lines("rccl_slingshot_no_plugin_socket.log"))
    assert _names(slingshot) == ["plugin_missing_sockets", "rings_never_trees"]
    assert "Also seen after it: the init connected its rings and never its trees." in slingshot.sentence()
    # a real out-of-memory on one rank, then the others' all-reduce timed out waiting for it
    oom = comm_failures.diagnose(_lines("torch_oom_then_timeouts.log"))
    assert _names(oom) == ["out_of_memory", "collective_timeout"]
    assert oom.findings[0].line_number == 1 and oom.findings[1].line_number == 6


def test_a_timeout_followed_by_an_exabyte_out_of_memory_is_the_timeout():
    # NVIDIA/nccl#1284: PyTorch timed out on a broadcast, then the job reported the bogus out-of-memory; the thread
    # shows its log only as a picture, so its quoted error follows a real watchdog report here, in that order
    log = _lines("torch_watchdog_timeout.log") + _lines("torch_oom_1eb.log")
    diagnosis = comm_failures.diagnose(log)
    assert _names(diagnosis) == ["timeout_reported_as_oom"]  # one failure, not a timeout and a second one
    assert diagnosis.findings[0].line_number == 1
    assert "no GPU has an exabyte" in diagnosis.sentence()


def test_lumis_rocm7_image_hanging_after_the_rings_is_named_with_its_workaround():
    # laifs-container-recipes#28 quotes the image's network lines, not the hung log: its lines are read with the
    # rings of a real RCCL init that never reached its trees (ROCm/rccl#1026), without that log's socket lines
    rings = [line for line in _lines("rccl_slingshot_no_plugin_socket.log") if "Connected all rings" in line]
    diagnosis = comm_failures.diagnose(_lines("laifs28_rocm7_image_ofi.log") + rings)
    assert _names(diagnosis) == ["rings_never_trees"]
    assert "unset NCCL_NET_GDR_LEVEL" in diagnosis.sentence()
    assert "lumi-ai-factory/laifs-container-recipes#28" in diagnosis.sentence()
    assert diagnosis.transport.provider == "cxi" and diagnosis.stage == "rings connected"


def test_a_later_set_up_left_hanging_on_lumi_is_only_consistent_with_the_new_group_hang():
    # laifs-container-recipes#44 quotes its reproducer, not its output: its hang is read from real lines in the order
    # the report describes, LUMI's network lines (#28), a set-up that completed (mx-llama.cpp#7), then the rings of
    # a set-up that never completed (ROCm/rccl#1026)
    network, completed = _lines("laifs28_rocm7_image_ofi.log"), _lines("rccl_init_complete_p2p.log")
    rings = [line for line in _lines("rccl_slingshot_no_plugin_socket.log") if "Connected all rings" in line]
    diagnosis = comm_failures.diagnose(network + completed + rings)
    assert _names(diagnosis) == ["new_group_setup_hangs"]
    assert diagnosis.findings[0].line_number == len(network) + len(completed) + 1
    sentence = diagnosis.sentence()
    assert sentence.startswith("communication log: consistent with a known report, not certain: ")
    assert "it is this report if the job ran LUMI AI Factory's image of 2026-08-07" in sentence
    assert "Fix: export FI_MR_CACHE_MONITOR=userfaultfd" in sentence
    assert "is consistent with a known report (not certain)" in " ".join(examination.advise([], [], diagnosis))
    # no set-up left hanging, or not LUMI's network, or an error, or RCCL of another ROCm than the image's: not it
    banner = [line for line in _lines("rccl_no_plugin_socket_one_node.log") if "ROCm version" in line]
    watchdog = _lines("torch_watchdog_timeout.log")
    for log in (network + completed, completed + rings, network + banner + completed + rings,
                network + completed + rings + watchdog):
        assert "new_group_setup_hangs" not in _names(comm_failures.diagnose(log))


def test_an_rccl_collective_timeout_is_only_consistent_with_the_rocm64_ddp_hang():
    # laifs-container-recipes#20 quotes no output: a real watchdog timeout (vllm#6042) read with real RCCL lines
    # (Frontier's channels)
    rccl, watchdog = _lines("rccl_frontier_ofi.log"), _lines("torch_watchdog_timeout.log")
    diagnosis = comm_failures.diagnose(rccl + watchdog)
    assert _names(diagnosis) == ["rccl_ddp_hang_rocm64"]
    sentence = diagnosis.sentence()
    assert sentence.startswith("communication log: consistent with a known report, not certain: ")
    assert "lumi-multitorch-*-u24r64f21m43t29-*" in sentence and "Fix: try export CUDA_LAUNCH_BLOCKING=1" in sentence
    # RCCL that names another ROCm than 6.4, or a rank that ran out of memory first: the general timeout
    banner = [line for line in _lines("rccl_no_plugin_socket_one_node.log") if "ROCm version" in line]
    assert _names(comm_failures.diagnose(banner + rccl + watchdog)) == ["collective_timeout"]
    oom = comm_failures.diagnose(rccl + _lines("torch_oom_then_timeouts.log"))
    assert _names(oom) == ["out_of_memory", "collective_timeout"]


def test_a_cut_nvidia_log_that_ends_after_its_rings_is_not_called_a_hang():
    # Perlmutter's NCCL (no RCCL, no NCCL_NET_GDR_LEVEL): a note that quoted the init up to its rings
    diagnosis = comm_failures.diagnose(_lines("aws_ofi_cxi_new.log"))
    assert diagnosis.findings == [] and diagnosis.stage == "rings connected"


def test_pytorchs_bundled_rccl_is_the_cause_of_the_missing_plugin():
    # laifs-container-recipes#18 shows no log: RCCL's real banner is read with the path where PyTorch's wheel
    # keeps its own RCCL, the one that library prints when PyTorch loaded it
    lines = _lines("rccl_no_plugin_socket_one_node.log")
    assert comm_failures.diagnose(lines).cause.name == "plugin_missing_sockets"
    bundled = [line.replace("/opt/rocm-6.3.3/lib/librccl.so.1",
                            "/opt/venv/lib/python3.12/site-packages/torch/lib/librccl.so")
               for line in lines]
    diagnosis = comm_failures.diagnose(bundled)
    assert _names(diagnosis) == ["bundled_rccl", "plugin_missing_sockets"]  # the plugin's line came first
    assert 'LD_PRELOAD="/usr/lib/libfabric.so.1 /opt/rocm/lib/librccl.so.1"' in diagnosis.sentence()


def test_no_plugin_on_one_node_is_not_a_failure():
    # the same RCCL without a plugin, its connections all inside a node (P2P lines of ROCm/rccl#1026)
    inside = [line for line in _lines("rccl_slingshot_no_plugin_socket.log") if "via P2P/" in line]
    diagnosis = comm_failures.diagnose(_lines("rccl_no_plugin_socket_one_node.log") + inside)
    assert diagnosis.findings == []


@pytest.mark.parametrize(("name", "network"), [
    ("nccl_ib_gdrdma.log", "network IB"),
    ("nccl_ibext_v8.log", "network IB"),
    ("aws_ofi_efa_gdrdma_shared.log", "network libfabric"),
    ("rccl_ucx_gdrdma.log", "network UCX"),
    ("rccl_frontier_ofi.log", "network libfabric"),
])
def test_healthy_field_logs_are_not_called_failures(name, network):
    sentence = comm_failures.diagnose(_lines(name)).sentence()
    assert sentence.startswith("communication log: not recognised (none of the known failures); read: ")
    assert network in sentence


def test_a_log_it_does_not_know_gets_what_it_read():
    sentence = comm_failures.diagnose(_lines("aws_ofi_efa_old.log")).sentence()
    assert sentence == ("communication log: not recognised (none of the known failures); read: library NCCL "
                        "2.10.3+cuda11.3; network libfabric; plugin aws-ofi-nccl 1.3.0aws; interfaces eth0; "
                        "no set-up stage; no error line")
    slingshot = comm_failures.diagnose(_lines("rccl_slingshot_no_plugin_socket.log")).what_was_read()
    assert slingshot.startswith("library RCCL 2.16.5+hip5.6; network Socket; interfaces bond0, hsn0, hsn1, hsn2, "
                                "hsn3; set-up reached: aborted; 3 error line(s), the first: NCCL WARN [Proxy")
    ifname = comm_failures.diagnose(_lines("nccl_socket_ifname_not_found.log")).what_was_read()
    assert "NCCL_SOCKET_IFNAME=eth2" in ifname and "the first: ncclInternalError: Internal check failed." in ifname
    gloo = comm_failures.diagnose("rank 0: all-reduce ok\n").sentence()
    assert gloo.endswith("read: no NCCL/RCCL version line; no network named; no set-up stage; no error line")
    # a line that quotes the library's words (a learner's note, a grep in the job script) is not its progress
    quoted = comm_failures.diagnose("echo 'waiting for Connected all trees'\nthe init reached Init COMPLETE?\n")
    assert "no set-up stage" in quoted.what_was_read()


def test_the_command_line_prints_the_sentence(tmp_path, capsys):
    log = tmp_path / "job.err"
    log.write_text("\n".join(_lines("torch_watchdog_timeout.log")))
    assert comm_failures.main([str(log)]) == 0
    assert capsys.readouterr().out.startswith("communication log: a collective did not finish")
    assert comm_failures.main([str(tmp_path / "missing.log")]) == 2

