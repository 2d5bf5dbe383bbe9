"""Reads an `strace -f -e trace=connect,sendto,sendmsg,sendmmsg,close` log and lists traffic that would
leave this machine. Ray's one UDP `connect()` to 8.8.8.8:53, which it uses to learn its own IP
and which sends no packet, is allowed only while nothing is ever sent on that socket."""

from __future__ import annotations

import ipaddress
import re
import socket

CONNECT = re.compile(
    r"^(\d+)\s+connect\((\d+), \{sa_family=AF_INET6?, sin6?_port=htons\((\d+)\), (?:sin_addr=inet_addr\(\"([^\"]+)\"\)|.*inet_pton\(AF_INET6, \"([^\"]+)\")"
)
SEND = re.compile(r"^(\d+)\s+(sendto|sendmsg|sendmmsg)\((\d+),")
CLOSE = re.compile(r"^(\d+)\s+close\((\d+)\)")
SEND_ADDR = re.compile(r"sin_addr=inet_addr\(\"([^\"]+)\"\)|inet_pton\(AF_INET6, \"([^\"]+)\"")
IP_DISCOVERY = ("8.8.8.8", 53)


def own_addresses() -> set[str]:
    addrs = {"127.0.0.1", "::1", "0.0.0.0"}
    try:
        addrs |= {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None)}
    except OSError:
        pass
    try:
        import subprocess

        addrs |= set(subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split())
    except OSError:
        pass
    return addrs


def is_local(addr: str, own: set[str]) -> bool:
    if addr.startswith("::ffff:"):
        addr = addr[7:]
    return addr in own or ipaddress.ip_address(addr).is_loopback


def outside_traffic(log: str) -> list[str]:
    own = own_addresses()
    discovery_sockets: set[tuple[str, str]] = set()
    bad = []
    for line in log.splitlines():
        m = CLOSE.match(line)
        if m:  # the descriptor may be reused for a local socket
            discovery_sockets.discard(m.groups())
            continue
        m = CONNECT.match(line)
        if m:
            pid, fd, port, v4, v6 = m.groups()
            addr = v4 or v6
            if is_local(addr, own):
                discovery_sockets.discard((pid, fd))
                continue
            if (addr, int(port)) == IP_DISCOVERY:
                discovery_sockets.add((pid, fd))
                continue
            bad.append(line)
            continue
        m = SEND.match(line)
        if m:
            pid, _, fd = m.groups()
            if (pid, fd) in discovery_sockets:
                bad.append(line)
                continue
            a = SEND_ADDR.search(line)
            if a and not is_local(a.group(1) or a.group(2), own):
                bad.append(line)
    return bad
