"""execd on an IPv6 pod IP.

The pod manifest starts execd with ``--host "$POD_IP"`` (the Downward API's
``status.podIP``). On an IPv6 cluster, or a dual-stack one whose primary family is IPv6,
that is an IPv6 address: "the first IP in status.podIPs ... is of the primary IP family"
(https://kubernetes.io/docs/concepts/services-networking/dual-stack/). execd must listen
on it, and say so in a form the controller's ``host:port`` parsers take: ``[ADDR]:PORT``.
"""

import http.client
import json
import socket
from typing import Any, Callable

import pytest

from execd.tests.helpers import TOKEN, ipv6_loopback

pytestmark = pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 loopback here")


@pytest.mark.parametrize("host", ["::1", "[::1]"])
def test_execd_listens_on_an_ipv6_address(start_execd: Callable[..., Any], host: str) -> None:
    d = start_execd("--host", host)
    assert d.listening == "listening on [::1]:%d" % d.port
    conn = http.client.HTTPConnection("::1", d.port, timeout=30)
    try:
        conn.request("GET", "/health", headers={"Authorization": "Bearer " + TOKEN})
        resp = conn.getresponse()
        body = json.loads(resp.read())
    finally:
        conn.close()
    assert resp.status == 200
    assert body["ok"] is True
    # Bound to the IPv6 address only: nothing answers on IPv4 at that port.
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", d.port), timeout=5).close()


def test_an_ipv4_host_still_prints_a_plain_address(start_execd: Callable[..., Any]) -> None:
    d = start_execd("--host", "127.0.0.1")
    assert d.listening == "listening on 127.0.0.1:%d" % d.port
