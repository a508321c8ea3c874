"""The interface the workers' collectives use is found from their Ray node's address, not guessed
from the host name (which may resolve to loopback), and a user's GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME
is never replaced. A run across hosts with their own addresses: tests/test_namespace_cluster.py."""

from __future__ import annotations

import psutil
import pytest

from trainers._internal.network import INTERFACE_VARIABLES, interface_carrying, pin_collective_interface


@pytest.fixture(autouse=True)
def no_interface_set(monkeypatch):
    """Unset for the test, and put back as it was after it, whatever the test set: a value left in
    this process would reach the Ray workers started later in the session."""
    for variable in INTERFACE_VARIABLES:
        monkeypatch.setenv(variable, "")  # records the value before, so teardown restores it
        monkeypatch.delenv(variable)


def test_each_local_address_names_its_own_interface():
    seen = 0
    for name, addresses in psutil.net_if_addrs().items():
        for entry in addresses:
            if entry.family.name == "AF_INET":
                assert interface_carrying(entry.address) == name
                seen += 1
    assert seen >= 1 and interface_carrying("127.0.0.1") == "lo"


def test_an_address_this_host_does_not_hold_or_no_address_names_none():
    assert interface_carrying("203.0.113.77") is None
    assert interface_carrying("not-an-address") is None


def test_the_interface_of_the_node_address_is_pinned_for_gloo_and_nccl(monkeypatch):
    import os

    assert pin_collective_interface("127.0.0.1") == "lo"
    assert [os.environ[v] for v in INTERFACE_VARIABLES] == ["lo", "lo"]


def test_a_users_interface_is_kept(monkeypatch):
    import os

    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth7")
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "ib0")
    assert pin_collective_interface("127.0.0.1") == "eth7"
    assert os.environ["GLOO_SOCKET_IFNAME"] == "eth7" and os.environ["NCCL_SOCKET_IFNAME"] == "ib0"


def test_no_interface_found_leaves_the_variables_unset():
    import os

    assert pin_collective_interface("203.0.113.77") is None
    assert not any(v in os.environ for v in INTERFACE_VARIABLES)
