"""The demo sends nothing off this machine: no TCP connection, no DNS lookup beyond its own addresses."""

from __future__ import annotations

import pytest

from tests import required

from .conftest import demo_trace
from .netcheck import outside_traffic

pytestmark = pytest.mark.e2e


def test_netcheck_flags_outside_connections():
    log = "\n".join(
        [
            '10 connect(6, {sa_family=AF_INET, sin_port=htons(53), sin_addr=inet_addr("8.8.8.8")}, 16) = 0',
            '10 connect(7, {sa_family=AF_INET, sin_port=htons(6379), sin_addr=inet_addr("127.0.0.1")}, 16) = 0',
            '11 connect(8, {sa_family=AF_INET, sin_port=htons(80), sin_addr=inet_addr("169.254.169.254")}, 16) = -1 EINPROGRESS',
        ]
    )
    assert outside_traffic(log) == [log.splitlines()[2]]
    sent = log.splitlines()[0] + "\n10 sendmmsg(6, [{msg_hdr={...}}], 2, MSG_NOSIGNAL) = 2"
    assert len(outside_traffic(sent)) == 1  # a DNS query on the discovery socket is traffic
    reused = log.splitlines()[0] + "\n10 close(6) = 0\n10 sendmsg(6, {msg_name=NULL}, MSG_NOSIGNAL) = 9"
    assert outside_traffic(reused) == []  # the descriptor was closed, then reused for a local socket


def test_demo_makes_no_outside_connection(demo_run):
    """The shared demo run, traced from its start (conftest.demo_run)."""
    required.tool("strace")
    root, _ = demo_run
    assert all((root / study / "report.html").exists() for study in ("decade", "openworld"))
    log = demo_trace(root)
    assert log.exists(), "strace is installed but could not trace the demo run (is ptrace allowed here?)"
    text = log.read_text()
    assert "connect(" in text  # the trace saw Ray's own local connections
    assert outside_traffic(text) == []
