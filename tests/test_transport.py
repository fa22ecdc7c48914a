"""Which transport NCCL/RCCL used, read from their own INFO reports in the libraries' real line formats."""

from pathlib import Path

import pytest

from course_utils.parallel import transport

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
    assert found.verdict().startswith("transport: between nodes IB on 4 connection(s), 2 with GPU-direct RDMA; "
                                      "inside nodes P2P on 2")


def test_lumi_through_the_libfabric_plugin_names_plugin_and_provider():
    found = _read("lumi_libfabric.log")
    assert found.plugin == "aws-ofi-rccl 1.4.0" and found.provider == "cxi"
    assert transport.kind("NET/AWS Libfabric/0/GDRDMA") == "NET/libfabric" == transport.kind("NET/OFI/1")
    assert "between nodes AWS Libfabric (aws-ofi-rccl 1.4.0, provider cxi) on 2 connection(s), 2 with" in \
        found.verdict()


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
