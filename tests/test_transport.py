"""Which transport NCCL/RCCL used, read from their own INFO reports in the libraries' real line formats."""

from pathlib import Path

import pytest

from course_utils.doctor import transport

FIXTURES = Path(__file__).parent / "fixtures" / "nccl"


def _read(name: str) -> transport.Transport:
    return transport.read((FIXTURES / name).read_text().splitlines())


def test_one_node_shows_direct_paths_between_gpus_and_the_pair_through_host_memory():
    found = _read("one_node_p2p.log")
    table = found.table().set_index("kind")
    assert table.loc["P2P", "connections"] == 3 and table.loc["SHM", "connections"] == 1
    assert found.verdict().startswith("transport: one node: P2P on 3 connection(s), SHM on 1")


def test_two_nodes_over_infiniband_count_gpu_direct_connections():
    found = _read("two_nodes_ib.log")
    assert set(found.connections["direction"].dropna()) == {"send", "receive"}
    assert found.verdict().startswith("transport: between nodes InfiniBand/RoCE (NCCL's IB verbs) on 4 "
                                      "connection(s), 2 with GPU-direct RDMA; inside nodes P2P on 2")


def test_lumi_through_the_libfabric_plugin_names_plugin_and_provider():
    found = _read("lumi_libfabric.log")
    assert found.plugin == "aws-ofi-rccl 1.4.0" and found.provider == "cxi"
    assert transport.kind("NET/AWS Libfabric/0/GDRDMA") == "NET/libfabric" == transport.kind("NET/OFI/1")
    assert "between nodes libfabric through aws-ofi-rccl 1.4.0 (provider cxi, 4 NICs) on 2 connection(s), 2 with" \
        in found.verdict()


def test_tcp_between_nodes_is_a_warning_that_names_the_fix():
    verdict = _read("lumi_socket.log").verdict()
    assert verdict.startswith("transport: WARNING: TCP sockets between nodes on 2 connection(s)")
    assert "LUMI's PyTorch container" in verdict


def test_gloo_or_no_debug_output_says_why_there_is_nothing(tmp_path, capsys):
    assert transport.read(["rank 0: all-reduce ok"]).verdict().startswith("transport: no NCCL/RCCL report")
    log = tmp_path / "run.log"
    log.write_text((FIXTURES / "two_nodes_ib.log").read_text())
    assert transport.main([str(log)]) == 0
    assert "NET/IB" in capsys.readouterr().out
    assert transport.main([str(tmp_path / "missing.log")]) == 2


@pytest.mark.parametrize("name", sorted(path.name for path in FIXTURES.glob("*.log")))
def test_every_recorded_report_has_connections(name):
    assert not _read(name).connections.empty


FIELD = FIXTURES / "field"  # real reports from public issue threads and notes (sources in fixtures/README.md)


def _field(name: str) -> transport.Transport:
    return transport.read((FIELD / name).read_text().splitlines())


@pytest.mark.parametrize(("name", "kind", "connections", "gpu_direct"), [
    ("nccl_ib_gdrdma.log", "NET/IB", 12, 12),
    ("nccl_ibext_v8.log", "NET/IB", 12, 0),  # the HPC-X plugin's IB is IB, not an unknown network
    ("aws_ofi_efa_gdrdma_shared.log", "NET/libfabric", 4, 4),  # .../GDRDMA/Shared
    ("rccl_frontier_ofi.log", "NET/libfabric", 1, 1),  # RCCL's "... comm 0x9bbf3b0 nRanks 4096" after the path
    ("rccl_ucx_gdrdma.log", "NET/UCX", 4, 4),
    ("nccl_socket_fallback.log", "NET/Socket", 2, 0),
])
def test_real_reports_count_connections_and_gpu_direct_rdma_between_nodes(name, kind, connections, gpu_direct):
    found = _field(name)
    assert found.used_network() == kind
    table = found.table().set_index("kind")
    assert (table.loc[kind, "connections"], table.loc[kind, "gpu_direct"]) == (connections, gpu_direct)
    assert "GDRDMA" not in " ".join(found.connections["kind"])  # the path's tail never becomes a kind


def test_rccl_channel_lines_keep_their_path_without_the_communicator():
    found = _field("rccl_frontier_ofi.log")
    assert set(found.connections["path"]) == {"P2P/IPC", "NET/AWS Libfabric/2/GDRDMA"}


@pytest.mark.parametrize(("name", "plugin", "provider", "fabric", "nics"), [
    ("aws_ofi_efa_old.log", "aws-ofi-nccl 1.3.0aws", "efa", None, None),
    ("aws_ofi_cxi_old.log", "aws-ofi-nccl 1.6.0", "cxi", None, 8),
    ("aws_ofi_efa_gdrdma_shared.log", "aws-ofi-nccl 1.11.0-aws", None, None, None),
    ("aws_ofi_cxi_new.log", "aws-ofi-nccl 1.19.0", "cxi", "cxi", 4),
])
def test_the_plugin_and_its_provider_are_read_in_old_and_new_wording(name, plugin, provider, fabric, nics):
    found = _field(name)
    assert (found.plugin, found.provider, found.fabric, found.nics) == (plugin, provider, fabric, nics)


def test_the_verdict_credits_the_plugin_only_where_nccl_used_it():
    shared = _field("aws_ofi_efa_gdrdma_shared.log").verdict()
    assert shared.startswith("transport: between nodes libfabric through aws-ofi-nccl 1.11.0-aws on 4 "
                             "connection(s), 4 with GPU-direct RDMA")
    unused = _field("aws_ofi_loaded_socket_used.log").verdict()
    assert unused.startswith("transport: WARNING: TCP sockets between nodes")
    assert "aws-ofi-nccl 1.11.0-aws was loaded, but NCCL did not use it" in unused
    assert "initialization failed" in unused
    plugin_and_ib = transport.read([*(FIELD / "aws_ofi_cxi_new.log").read_text().splitlines(),
                                    *(FIELD / "nccl_ib_gdrdma.log").read_text().splitlines()])
    assert plugin_and_ib.verdict().startswith("transport: between nodes InfiniBand/RoCE (NCCL's IB verbs) on 12")
    assert "aws-ofi-nccl 1.19.0 (provider cxi, 4 NICs) was loaded, but NCCL did not use it" in \
        plugin_and_ib.verdict()
    cxi = _field("aws_ofi_cxi_old.log").verdict()
    assert cxi.startswith("transport: NCCL chose libfabric through aws-ofi-nccl 1.6.0 (provider cxi, 8 NICs)")


@pytest.mark.parametrize("name", sorted(path.name for path in FIELD.glob("*.log")))
def test_every_real_report_gives_a_sentence_without_none(name):
    verdict = _field(name).verdict()
    assert verdict.startswith("transport: ") and "None" not in verdict and "nan" not in verdict
    assert not verdict.startswith("transport: no NCCL/RCCL report")
