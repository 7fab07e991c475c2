"""The operator's lists at start (its NodeFeatures, the Nodes, the Devices records' names, prune's) and its
leader lease against a raw-socket server: every page is read up to wire.MAX_ANSWER, as the two clients
read every write's answer (a 1 MiB bound here, for speed), pagination as it was (limit, continue)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import kubernetes
import pytest
from test_operator_wire import Conn, Served, api_at, endless, raw_server

from nodefabric_operator import leader, reconcile, sinks, wire
from nodefabric_operator.metrics import Metrics
from nodefabric_operator.reconcile import transient

NS, DOMAIN = "nodefabric", "example.com"


def _nodefeatures(api: kubernetes.client.ApiClient) -> list[Any]:
    return list(sinks.NodeFeatureSink(api, NS, DOMAIN).existing())


def _nodes(api: kubernetes.client.ApiClient) -> list[Any]:
    return list(sinks.NodeSink(api, DOMAIN).existing())


def _records(api: kubernetes.client.ApiClient) -> list[Any]:
    return list(reconcile.record_names(kubernetes.client.CustomObjectsApi(api), Metrics()))


def _generated(api: kubernetes.client.ApiClient) -> list[Any]:
    """prune's list: a generated call, its answer not preloaded, read by sinks.pages."""
    custom = kubernetes.client.CustomObjectsApi(api)
    fn = custom.list_namespaced_custom_object
    args = (sinks.NFD_GROUP, sinks.NFD_VERSION, NS, sinks.NFD_PLURAL)
    return list(sinks.pages(Metrics(), sinks.NFD_PLURAL, fn, *args, label_selector=sinks.NFD_NODE_NAME))


LISTS: dict[str, Callable[[kubernetes.client.ApiClient], list[Any]]] = {
    "nodefeatures": _nodefeatures,
    "nodes": _nodes,
    "devices records": _records,
    "a generated call": _generated,
}
# Sent through rawcall: a refusal's body is bounded too (a generated call reads it whole before raising).
THROUGH_RAWCALL = ["nodefeatures", "nodes", "devices records"]


@pytest.fixture(autouse=True)
def small_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wire, "MAX_ANSWER", 1024 * 1024)
    monkeypatch.setattr(wire, "CHUNK", 64 * 1024)


@pytest.mark.parametrize("framing", ["chunked", "close", "announced"])
@pytest.mark.parametrize("what", list(LISTS))
def test_a_list_page_that_never_ends_is_refused_at_the_bound(what: str, framing: str) -> None:
    """A LIST page answered with a body that never ends (four times the bound, here) is refused as
    AnswerTooLarge (transient, as a broken connection), not buffered whole and then failed as garbage;
    the next list, on a new connection, is read."""
    with raw_server(endless(framing)) as served:
        api = api_at(served.url)
        with pytest.raises(wire.AnswerTooLarge) as refused:
            LISTS[what](api)
        assert transient(refused.value)
        assert LISTS[what](api) == []  # the server's later answers: an object with no items


def _refusing_endlessly(conn: Conn, served: Served) -> None:
    while conn.request() is not None:
        conn.sock.sendall(b"HTTP/1.1 500 Internal Server Error\r\nTransfer-Encoding: chunked\r\n\r\n")
        piece = b"x" * 65536
        for _ in range(4 * wire.MAX_ANSWER // len(piece)):
            conn.sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
        return


@pytest.mark.parametrize("what", THROUGH_RAWCALL)
def test_a_list_refused_with_a_body_that_never_ends_is_refused_at_the_bound(what: str) -> None:
    with raw_server(_refusing_endlessly) as served, pytest.raises(wire.AnswerTooLarge):
        LISTS[what](api_at(served.url))


def _page(number: int, size: int, last: bool) -> bytes:
    """A list page of one item, padded to exactly `size` bytes, continued unless `last`."""
    meta = {} if last else {"continue": f"token-{number}"}
    item = {"metadata": {"name": f"n{number}", "uid": f"u-{number}", "resourceVersion": "1"}}
    base = {"kind": "List", "items": [item], "metadata": meta, "pad": ""}
    pad = size - len(json.dumps(base, separators=(",", ":")))
    return json.dumps({**base, "pad": "x" * pad}, separators=(",", ":")).encode()


def _paged(over: int) -> tuple[Callable[[Conn, Served], None], list[list[tuple[str, str]]]]:
    """Two pages, each exactly the bound plus `over` bytes; the query of each request kept."""
    asked: list[list[tuple[str, str]]] = []

    def handle(conn: Conn, served: Served) -> None:
        while (head := conn.request()) is not None:
            target = head.split(b"\r\n")[0].split()[1].decode()
            query = parse_qsl(urlsplit(target).query)
            asked.append(query)
            number = len(asked)
            conn.answer(_page(number, wire.MAX_ANSWER + over, last=number == 2))

    return handle, asked


@pytest.mark.parametrize("what", list(LISTS))
def test_pages_exactly_at_the_bound_are_read_and_paged_as_before(what: str) -> None:
    """Two pages of exactly MAX_ANSWER bytes each: both read whole, the second asked for with the
    first's continue token, the limit on each as it was (sinks.PAGE), a selector kept on both."""
    handle, asked = _paged(0)
    with raw_server(handle) as served:
        listed = LISTS[what](api_at(served.url))
    assert len(listed) == 2
    assert [dict(q).get("continue") for q in asked] == [None, "token-1"]
    assert [dict(q)["limit"] for q in asked] == [str(sinks.PAGE)] * 2
    if what in ("nodefeatures", "a generated call"):
        assert [dict(q)["labelSelector"] for q in asked] == [sinks.NFD_NODE_NAME] * 2


@pytest.mark.parametrize("what", list(LISTS))
def test_a_page_one_byte_over_the_bound_is_refused(what: str) -> None:
    handle, asked = _paged(1)
    with raw_server(handle) as served, pytest.raises(wire.AnswerTooLarge):
        LISTS[what](api_at(served.url))
    assert len(asked) == 1  # nothing more asked for


def _lease_oversized(method: str) -> Callable[[Conn, Served], None]:
    """The request `method` makes answered with a lease four times the bound (a whole, valid object, so
    a client that read it all would go on: take the lease); a read otherwise 404 (none yet), any other
    write answered."""

    def handle(conn: Conn, served: Served) -> None:
        while (head := conn.request()) is not None:
            if head.startswith(method.encode()):
                conn.sock.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                piece = b"x" * 65536
                pieces = [b'{"spec":{},"pad":"', *[piece] * (4 * wire.MAX_ANSWER // len(piece)), b'"}']
                for part in pieces:
                    conn.sock.sendall(b"%x\r\n%s\r\n" % (len(part), part))
                conn.sock.sendall(b"0\r\n\r\n")
            elif head.startswith(b"GET"):
                conn.answer(b'{"kind":"Status","code":404}', status="404 Not Found")
            else:
                conn.answer(b'{"kind":"Lease"}', status="201 Created")

    return handle


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_a_lease_answer_over_the_bound_is_a_failed_try(method: str) -> None:
    """The lease's read (or its create) answered with a body over the bound: refused, a failed try
    (False, tried again later), never buffered whole (read whole, the read would be taken: a lease with
    no holder, and the create's answer drained to its end, the lease held)."""
    with raw_server(_lease_oversized(method)) as served:
        elector = leader.Elector(api_at(served.url), leader.LeaseConfig(NS, "nodefabric-operator", "me"))
        assert elector.try_once() is False
        assert not elector.leading
