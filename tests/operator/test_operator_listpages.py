"""The operator's lists at start (its NodeFeatures, the Nodes, the Devices records' names, prune's) and its
leader lease against a raw-socket server: every page is read up to wire.MAX_ANSWER, as the two clients
read every write's answer (a 1 MiB bound here, for speed), pagination as it was (limit, continue)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import kubernetes
import pytest
from test_operator_wire import Conn, Served, api_at, endless, raw_server

from nodefabric_devicemanager import models
from nodefabric_devicemanager.shell.errors import StartupError
from nodefabric_operator import leader, prune, reconcile, sinks, startup, wire
from nodefabric_operator.metrics import Metrics
from nodefabric_operator.reconcile import transient
from nodefabric_operator.topology.shell import Projector, TopologyOptions

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


def _topology(api: kubernetes.client.ApiClient) -> list[Any]:
    """--topology's Node list at start (Projector.prime): the fleet it holds after."""
    projector = Projector(api, TopologyOptions(), Metrics())
    projector.prime()
    return list(projector.fleet)


LISTS: dict[str, Callable[[kubernetes.client.ApiClient], list[Any]]] = {
    "nodefeatures": _nodefeatures,
    "nodes": _nodes,
    "devices records": _records,
    "a generated call": _generated,
    "topology nodes": _topology,
}
# Sent through rawcall: a refusal's body is bounded too (a generated call reads it whole before raising).
THROUGH_RAWCALL = ["nodefeatures", "nodes", "devices records", "topology nodes"]


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


def test_prunes_list_refused_with_a_body_that_never_ends_is_refused_at_the_bound() -> None:
    """`--prune`'s NodeFeature list goes through rawcall too: a refusal's endless body is refused at the
    bound, not read whole by the generated call before it raises."""
    with raw_server(_refusing_endlessly) as served, pytest.raises(wire.AnswerTooLarge):
        prune.nodefeatures(api_at(served.url), NS)


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


def _item(number: int) -> dict[str, Any]:
    return {"metadata": {"name": f"n{number}", "uid": f"u-{number}", "resourceVersion": "1"}}


# A second page that a real API server never sends: each once silently cut the list short (items not a
# list, a continue token of another type: taken as the last page) or lost an entry (one not an object:
# skipped). A list cut short is no harmless thing: the Node sink takes a record missing from its start's
# list of names for one deleted, and withdraws that Node's labels.
ODD_SECOND_PAGES: dict[str, dict[str, Any]] = {
    "items an object": {"items": {"metadata": {"name": "n2"}}, "metadata": {}},
    "items a string": {"items": "n2", "metadata": {}},
    "an item a string": {"items": [_item(2), "n3"], "metadata": {}},
    "an item null": {"items": [None, _item(2)], "metadata": {}},
    "continue a number": {"items": [_item(2)], "metadata": {"continue": 7}},
    "continue a list": {"items": [_item(2)], "metadata": {"continue": ["token-2"]}},
    "metadata a string": {"items": [_item(2)], "metadata": "continue=token-2"},
}


def _two_pages(second: dict[str, Any]) -> tuple[Callable[[Conn, Served], None], list[list[tuple[str, str]]]]:
    """A first page of one item continued with token-1, then `second`; a third page (none should be
    asked for) ends the list."""
    asked: list[list[tuple[str, str]]] = []

    def handle(conn: Conn, served: Served) -> None:
        while (head := conn.request()) is not None:
            asked.append(parse_qsl(urlsplit(head.split(b"\r\n")[0].split()[1].decode()).query))
            page: dict[str, Any] = {
                1: {"items": [_item(1)], "metadata": {"continue": "token-1"}},
                2: second,
            }.get(len(asked), {"items": [_item(9)], "metadata": {}})
            conn.answer(json.dumps(page).encode())

    return handle, asked


@pytest.mark.parametrize("odd", list(ODD_SECOND_PAGES))
@pytest.mark.parametrize("what", list(LISTS))
def test_a_page_of_the_wrong_shape_fails_the_list_instead_of_cutting_it_short(what: str, odd: str) -> None:
    handle, asked = _two_pages(ODD_SECOND_PAGES[odd])
    with raw_server(handle) as served, pytest.raises(sinks.SinkError) as refused:
        LISTS[what](api_at(served.url))
    assert len(asked) == 2  # nothing asked for after the odd page
    resource = {"nodes": "nodes", "topology nodes": "nodes", "devices records": models.PLURAL}.get(
        what, sinks.NFD_PLURAL
    )
    assert f"a page of {resource}" in str(refused.value)
    assert not transient(refused.value)  # a garbled list is not read again at once


@pytest.mark.parametrize("what", list(LISTS))
def test_pages_without_items_or_metadata_are_an_empty_last_page(what: str) -> None:
    """No `items` (or null: a Go nil slice) and no metadata: an empty page, the last; as before."""
    handle, asked = _two_pages({"items": None})
    with raw_server(handle) as served:
        assert len(LISTS[what](api_at(served.url))) == 1
    assert len(asked) == 2


@pytest.mark.parametrize("what", list(LISTS))
def test_a_continue_token_that_comes_back_fails_the_list_instead_of_looping(what: str) -> None:
    """A page continued with a token already followed (a broken proxy's cache, a looping server) would
    make the list endless: refused at the first repeat. The server here gives up after 20 pages, so a
    client that loops lists the same items 20 times instead of hanging the test."""
    asked: list[str | None] = []

    def handle(conn: Conn, served: Served) -> None:
        while (head := conn.request()) is not None:
            asked.append(_query(head).get("continue"))
            token = ["token-a", "token-b"][len(asked) % 2] if len(asked) < 20 else ""
            conn.answer(json.dumps({"items": [_item(len(asked))], "metadata": {"continue": token}}).encode())

    with raw_server(handle) as served, pytest.raises(sinks.SinkError, match="token"):
        LISTS[what](api_at(served.url))
    assert asked == [None, "token-b", "token-a"]


# A lease read answered 200 with what no API server sends: each was an exception no caller handles
# (SinkError, ValueError, TypeError, KeyError) escaping try_once, so escaping the wait to lead (the
# operator crashed) or the renewals (the holding ended without a word); or escaping release at the stop.
ODD_LEASES: dict[str, bytes] = {
    "a list": b"[]",
    "not JSON": b"<html>proxy</html>",
    "nested too deep": b"[" * 100_000 + b"]" * 100_000,
    "spec a string": b'{"metadata":{"resourceVersion":"1"},"spec":"x"}',
    "spec a list of pairs": b'{"metadata":{"resourceVersion":"1"},"spec":[["holderIdentity","other"]]}',
    "no metadata": b'{"spec":{"holderIdentity":"me"}}',
    "metadata a string": b'{"metadata":"rv=1","spec":{"holderIdentity":"me"}}',
    "no resourceVersion": b'{"metadata":{},"spec":{"holderIdentity":"me"}}',
}


def _lease_answered(body: bytes) -> tuple[Callable[[Conn, Served], None], list[bytes]]:
    """The lease's read answered `body`; any write answered and kept."""
    writes: list[bytes] = []

    def handle(conn: Conn, served: Served) -> None:
        while (head := conn.request()) is not None:
            if head.startswith(b"GET"):
                conn.answer(body)
            else:
                writes.append(conn.requests[-1])
                conn.answer(b'{"kind":"Lease","metadata":{"resourceVersion":"2"}}')

    return handle, writes


@pytest.mark.parametrize("odd", list(ODD_LEASES))
def test_a_lease_read_of_the_wrong_shape_is_a_failed_try_and_writes_nothing(odd: str) -> None:
    handle, writes = _lease_answered(ODD_LEASES[odd])
    with raw_server(handle) as served:
        elector = leader.Elector(api_at(served.url), leader.LeaseConfig(NS, "nodefabric-operator", "me"))
        assert elector.try_once() is False
        assert not elector.leading
        elector.leading = True  # as if held: release reads the lease again, and must not raise either
        elector.release()
    assert writes == []  # no lease written over one not read (no resourceVersion: an unconditional write)


def test_a_lease_whose_transitions_are_no_number_is_taken_counting_from_zero() -> None:
    """A free lease whose leaseTransitions someone set to a word: taken (the count restarted at 1), not
    an escaping ValueError that kept every replica from leading."""
    body = b'{"metadata":{"resourceVersion":"5"},"spec":{"holderIdentity":"","leaseTransitions":"many"}}'
    handle, writes = _lease_answered(body)
    with raw_server(handle) as served:
        elector = leader.Elector(api_at(served.url), leader.LeaseConfig(NS, "nodefabric-operator", "me"))
        assert elector.try_once() is True
    (write,) = writes
    sent = json.loads(write.split(b"\r\n\r\n", 1)[1])
    assert sent["spec"]["leaseTransitions"] == 1
    assert sent["metadata"]["resourceVersion"] == "5"


def _query(head: bytes) -> dict[str, str]:
    """The query of a raw request's head, as a dict."""
    return dict(parse_qsl(urlsplit(head.split(b"\r\n")[0].split()[1].decode()).query))


def _expiring(
    full: Callable[[], tuple[bytes, str]],
) -> tuple[Callable[[Conn, Served], None], list[list[tuple[str, str]]]]:
    """A first page (n1, continued with token-1) whose token has expired by the second request (410
    Gone, as the API server answers once etcd compacted past the list); a request without a token after
    it is answered `full()`."""
    asked: list[list[tuple[str, str]]] = []

    def handle(conn: Conn, served: Served) -> None:
        while (head := conn.request()) is not None:
            asked.append(parse_qsl(urlsplit(head.split(b"\r\n")[0].split()[1].decode()).query))
            query = dict(asked[-1])
            if len(asked) == 1:
                conn.answer(json.dumps({"items": [_item(1)], "metadata": {"continue": "token-1"}}).encode())
            elif "continue" in query:
                gone = {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "code": 410,
                    "reason": "Expired",
                    "message": "too old",
                }
                conn.answer(json.dumps(gone).encode(), status="410 Gone")
            else:
                body, status = full()
                conn.answer(body, status=status)

    return handle, asked


def _names(listed: list[Any]) -> list[str]:
    """The names listed, whatever each list holds (names, raw objects, or SinkObjects)."""
    return sorted(
        o if isinstance(o, str) else getattr(o, "name", None) or o["metadata"]["name"] for o in listed
    )


@pytest.mark.parametrize("what", list(LISTS))
def test_a_410_mid_list_is_followed_by_one_full_list_each_object_once(what: str) -> None:
    """The continue token expired between two pages, and the 410 (reason Expired) carries no token of
    its own (an API server that could not make one): the rest is read as one full list (limit=0, no
    token), as client-go's pager does, instead of failing the list (the operator's start exited 2, and on
    a fleet whose list outlasts etcd's compaction it would never start). n1, already handed on from the
    first page in the same version, is not handed on twice; n2 and n3, only in the newer snapshot, are."""
    full = {"items": [_item(1), _item(2), _item(3)], "metadata": {"resourceVersion": "9"}}
    handle, asked = _expiring(lambda: (json.dumps(full).encode(), "200 OK"))
    with raw_server(handle) as served:
        listed = LISTS[what](api_at(served.url))
    assert len(listed) == 3
    assert _names(listed) == ["n1", "n2", "n3"]
    assert [(q.get("continue"), q.get("limit")) for q in map(dict, asked)] == [
        (None, str(sinks.PAGE)),
        ("token-1", str(sinks.PAGE)),
        (None, "0"),
    ]


@pytest.mark.parametrize("what", list(LISTS))
def test_a_410_on_the_full_list_after_an_expiry_fails_the_list_without_relisting_again(what: str) -> None:
    """The full list is tried once: a 410 to it too (no API server answers a list without a token
    410, but a proxy might) fails the whole list, never handed on in part, never asked for in a loop."""
    gone = json.dumps(
        {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410, "reason": "Expired"}
    ).encode()
    handle, asked = _expiring(lambda: (gone, "410 Gone"))
    with raw_server(handle) as served, pytest.raises(kubernetes.client.ApiException) as refused:
        LISTS[what](api_at(served.url))
    assert refused.value.status == 410
    assert len(asked) == 3


def _gone_with_tokens(
    rest: list[dict[str, Any]],
) -> tuple[Callable[[Conn, Served], None], list[tuple[Any, Any]]]:
    """A first page (n1, continued with token-1), then the API server's answer to an expired token: 410
    Gone carrying a continue token of its own (token-2, for the rest from the newest snapshot), answered
    with `rest`, the one page after it; any other request with a token is 410 again (with a fresh
    token), and a full list (no token) is answered n1 to n3, whole."""
    asked: list[tuple[Any, Any]] = []

    def handle(conn: Conn, served: Served) -> None:
        while (head := conn.request()) is not None:
            query = _query(head)
            asked.append((query.get("continue"), query.get("limit")))
            if len(asked) == 1:
                conn.answer(json.dumps({"items": [_item(1)], "metadata": {"continue": "token-1"}}).encode())
            elif query.get("continue") == "token-2" and rest:
                conn.answer(json.dumps(rest.pop(0)).encode())
            elif "continue" in query:
                gone = {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "code": 410,
                    "reason": "Expired",
                    "metadata": {"continue": f"token-{len(asked)}"},
                }
                conn.answer(json.dumps(gone).encode(), status="410 Gone")
            else:
                conn.answer(json.dumps({"items": [_item(1), _item(2), _item(3)]}).encode())

    return handle, asked


@pytest.mark.parametrize("what", list(LISTS))
def test_a_410_carrying_a_continue_token_is_followed_in_pages_not_by_a_full_list(what: str) -> None:
    """The API server's 410 to an expired continue token carries one for the rest of the list from its
    newest snapshot: followed, in pages of PAGE. A full list instead is one answer, bounded by
    wire.MAX_ANSWER and decoded whole: on the fleets whose list outlasts etcd's compaction (the ones the
    fallback is for), likely past the bound, and the list failed after all, at every restart."""
    handle, asked = _gone_with_tokens([{"items": [_item(2), _item(3)]}])
    with raw_server(handle) as served:
        listed = LISTS[what](api_at(served.url))
    assert _names(listed) == ["n1", "n2", "n3"]
    page = str(sinks.PAGE)
    assert asked == [(None, page), ("token-1", page), ("token-2", page)]


@pytest.mark.parametrize("what", list(LISTS))
def test_a_410_to_the_token_a_410_carried_fails_the_list_never_expiring_in_a_loop(what: str) -> None:
    """Two 410s in a row (the token the first carried has expired too, or a server that answers every
    continue so) fail the list: no third request, no endless chain of fresh tokens, no full list."""
    handle, asked = _gone_with_tokens([])
    with raw_server(handle) as served, pytest.raises(kubernetes.client.ApiException) as refused:
        LISTS[what](api_at(served.url))
    assert refused.value.status == 410
    page = str(sinks.PAGE)
    assert asked == [(None, page), ("token-1", page), ("token-2", page)]


def test_a_full_list_that_comes_in_pages_after_all_is_listed_whole_once_only() -> None:
    """The full list after an expiry without a token is answered with a continue token after
    all: followed; that token expiring too fails the list instead of a second full list, and a third,
    for as long as the server keeps at it."""
    asked: list[tuple[Any, Any]] = []

    def handle(conn: Conn, served: Served) -> None:
        while (head := conn.request()) is not None:
            query = _query(head)
            asked.append((query.get("continue"), query.get("limit")))
            if "continue" in query:
                gone = {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "code": 410,
                    "reason": "Expired",
                }
                conn.answer(json.dumps(gone).encode(), status="410 Gone")
            else:
                more = {"continue": f"token-{len(asked)}"}
                conn.answer(json.dumps({"items": [_item(len(asked))], "metadata": more}).encode())

    with raw_server(handle) as served, pytest.raises(kubernetes.client.ApiException) as refused:
        _records(api_at(served.url))
    assert refused.value.status == 410
    page = str(sinks.PAGE)
    assert asked == [(None, page), ("token-1", page), (None, "0"), ("token-3", "0")]


def test_the_full_list_after_an_expiry_hands_on_an_object_changed_in_between_again() -> None:
    """The full list after a 410 without a token holds n1 recreated (a new uid and resourceVersion):
    handed on again, after the version from the first page, so a caller keeping the last (the Devices
    records' names and uids) holds the record that exists, not the one deleted in between."""
    changed = {"metadata": {"name": "n1", "uid": "u-1b", "resourceVersion": "7"}}
    full = {"items": [changed, _item(2)]}
    handle, asked = _expiring(lambda: (json.dumps(full).encode(), "200 OK"))
    with raw_server(handle) as served:
        names = reconcile.record_names(kubernetes.client.CustomObjectsApi(api_at(served.url)), Metrics())
    assert names == {"n1": "u-1b", "n2": "u-2"}
    assert [dict(q).get("limit") for q in asked] == [str(sinks.PAGE), str(sinks.PAGE), "0"]


@pytest.mark.parametrize(
    "body",
    [
        b'{"kind":"Status","code":410,"reason":"Gone","metadata":{"continue":"token-9"}}',
        b'{"kind":"Status","code":410,"reason":"expired"}',
        b'{"kind":"Status","code":410}',
        b"<html>410 Gone</html>",
        b"\xff\xfe garbage",
        b'[{"reason":"Expired"}]',
        b'{"reason":"Expired","metadata":{"continue":"token-9"}}',
        b'{"kind":"Table","status":"Failure","reason":"Expired","metadata":{"continue":"token-9"}}',
        b'{"kind":"Status","status":"Success","reason":"Expired","metadata":{"continue":"token-9"}}',
        b'{"kind":"Status","reason":"Expired","metadata":{"continue":"token-9"}}',
        b"",
        b"[" * 100_000 + b"]" * 100_000,
    ],
)
def test_a_410_that_is_no_expiry_fails_the_list_without_relisting(body: bytes) -> None:
    """A 410 mid-list whose body is no Status of reason Expired (another reason, a proxy's page,
    garbage, nothing) is not taken for an expired token, as client-go's pager does not: the list fails
    there, as for any refusal, with no full list and no token followed from it."""
    asked: list[tuple[Any, Any]] = []

    def handle(conn: Conn, served: Served) -> None:
        while (head := conn.request()) is not None:
            query = _query(head)
            asked.append((query.get("continue"), query.get("limit")))
            if "continue" in query:
                conn.answer(body, status="410 Gone")
            else:
                conn.answer(json.dumps({"items": [_item(1)], "metadata": {"continue": "token-1"}}).encode())

    with raw_server(handle) as served, pytest.raises(kubernetes.client.ApiException) as refused:
        _records(api_at(served.url))
    assert refused.value.status == 410
    page = str(sinks.PAGE)
    assert asked == [(None, page), ("token-1", page)]


@pytest.mark.parametrize(("status", "code"), [("410 Gone", 410), ("500 Internal Server Error", 500)])
def test_a_first_page_refused_or_a_later_one_refused_otherwise_fails_the_list(status: str, code: int) -> None:
    """Only an expired token is listed again: a 410 to the first page (no token to have expired) and a
    500 mid-list fail the list as before (its callers retry or exit 2)."""
    asked: list[str | None] = []
    refusal = json.dumps({"kind": "Status", "code": code}).encode()

    def handle(conn: Conn, served: Served) -> None:
        while (head := conn.request()) is not None:
            asked.append(_query(head).get("continue"))
            if code == 500 and len(asked) == 1:
                conn.answer(json.dumps({"items": [_item(1)], "metadata": {"continue": "token-1"}}).encode())
            else:
                conn.answer(refusal, status=status)

    with raw_server(handle) as served, pytest.raises(kubernetes.client.ApiException) as refused:
        _nodes(api_at(served.url))
    assert refused.value.status == code
    assert asked == ([None] if code == 410 else [None, "token-1"])


async def test_topologys_start_listing_answered_with_garbage_is_a_startup_error() -> None:
    """--topology's Node list answered with a JSON list: a StartupError naming what came (one line, exit
    2), not the AttributeError (later SinkError) that escaped as a traceback."""

    def handle(conn: Conn, served: Served) -> None:
        while conn.request() is not None:
            conn.answer(b"[]")

    with raw_server(handle) as served:
        projector = Projector(api_at(served.url), TopologyOptions(), Metrics())
        with pytest.raises(
            StartupError, match="--topology: cannot list Nodes: the API server answered a list"
        ):
            await startup.prime_topology(projector)


def _refuse_endlessly(conn: Conn, served: Served) -> None:
    """Answer 500 with a chunked body of 64 times the bound, the bytes sent noted in `served.sent` (how far
    the client read before it went away)."""
    conn.sock.sendall(b"HTTP/1.1 500 Internal Server Error\r\nTransfer-Encoding: chunked\r\n\r\n")
    piece, sent = b"x" * 65536, 0
    try:
        while sent < 64 * wire.MAX_ANSWER:
            conn.sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
            sent += len(piece)
        conn.sock.sendall(b"0\r\n\r\n")
    finally:
        served.sent.append(sent)


def _lease_refused_endlessly(method: str) -> Callable[[Conn, Served], None]:
    """The request `method` makes answered 500 with a body of 64 times the bound (the bytes sent kept);
    a read otherwise 404 (no lease yet)."""

    def handle(conn: Conn, served: Served) -> None:
        while (head := conn.request()) is not None:
            if not head.startswith(method.encode()):
                conn.answer(b'{"kind":"Status","code":404}', status="404 Not Found")
                continue
            _refuse_endlessly(conn, served)
            return

    return handle


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_a_lease_refused_with_a_body_that_never_ends_is_refused_at_the_bound(method: str) -> None:
    """The lease's read (or create) refused with an endless body: a failed try once the bound is
    passed, not a body read whole by the generated call before it raised (64 MiB here, any size from a
    hostile proxy, on every renewal)."""
    with raw_server(_lease_refused_endlessly(method)) as served:
        elector = leader.Elector(api_at(served.url), leader.LeaseConfig(NS, "nodefabric-operator", "me"))
        assert elector.try_once() is False
        for _ in range(500):  # the server's thread notes what it sent once its send fails
            if served.sent:
                break
            time.sleep(0.01)
    (sent,) = served.sent
    assert sent < 16 * wire.MAX_ANSWER  # the client stopped reading near the bound (socket buffers aside)


def test_prunes_delete_refused_with_a_body_that_never_ends_is_refused_at_the_bound() -> None:
    """`--prune`'s delete of a NodeFeature it owns, refused with an endless body: refused at the bound
    (a failed pass, retried), not read whole by the generated delete call before it raises."""
    owned = {
        "metadata": {
            "name": "n1",
            "uid": "u-nf",
            "ownerReferences": [
                {
                    "apiVersion": models.API_VERSION,
                    "kind": models.KIND,
                    "name": "n1",
                    "uid": "u-1",
                    "controller": True,
                }
            ],
        }
    }

    def handle(conn: Conn, served: Served) -> None:
        while (head := conn.request()) is not None:
            if head.startswith(b"GET"):
                conn.answer(json.dumps({"items": [owned], "metadata": {}}).encode())
                continue
            _refuse_endlessly(conn, served)
            return

    with raw_server(handle) as served, pytest.raises(wire.AnswerTooLarge):
        prune.nodefeatures(api_at(served.url), NS)
    for _ in range(500):
        if served.sent:
            break
        time.sleep(0.01)
    assert served.sent and served.sent[0] < 16 * wire.MAX_ANSWER


@pytest.mark.parametrize(
    "body",
    [
        b'{"kind": "Status", "status": "Failure", "reason": "Expired", "metadata": {"continue": 7}}',
        b'{"kind": "Status", "status": "Failure", "reason": "Expired", "metadata": {"continue": ""}}',
        b'{"kind": "Status", "status": "Failure", "reason": "Expired", "metadata": ["continue"]}',
        b'{"kind": "Status", "status": "Failure", "reason": "Expired", "metadata": {"continue": "token-1"}}',
    ],
)
def test_a_410_whose_body_holds_no_token_is_followed_by_the_full_list(body: bytes) -> None:
    """An expiry (reason Expired) whose Status holds no token to follow (one of another type, empty,
    metadata no object, the very token that expired): the full list, never an exception out of reading
    the body, never the same token asked for again."""
    asked: list[tuple[Any, Any]] = []

    def handle(conn: Conn, served: Served) -> None:
        while (head := conn.request()) is not None:
            query = _query(head)
            asked.append((query.get("continue"), query.get("limit")))
            if len(asked) == 1:
                conn.answer(json.dumps({"items": [_item(1)], "metadata": {"continue": "token-1"}}).encode())
            elif "continue" in query:
                conn.answer(body, status="410 Gone")
            else:
                conn.answer(json.dumps({"items": [_item(1), _item(2)]}).encode())

    with raw_server(handle) as served:
        assert _names(_nodes(api_at(served.url))) == ["n1", "n2"]
    assert asked[-1] == (None, "0")
