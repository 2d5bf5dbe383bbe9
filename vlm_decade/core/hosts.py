"""Who a local server answers: the loopback names, and the name a request's Host header gives.

The viewer (`view.access`) and the experiment server (`studies.decade.human.serve`) both refuse a
request whose Host is not a name they were bound to, so a page on another site that points its own
name at this machine (DNS rebinding) gets 400; both read the header here.
"""

from __future__ import annotations

import ipaddress

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an address, brackets allowed) is this machine's loopback."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """The name in a Host header, without the port and brackets, lower case."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else ""
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header
