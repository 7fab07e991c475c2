"""kmock's surfaces over our store, for tests written against kmock: `objects` (resource, namespace,
name -> kmock Object) and `_buses` (resource -> the event bus watches read).

They hold the API as a `Backend`, the few methods they call, so this module needs nothing of the server
that builds them (which imports it)."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from typing import Any, Protocol, runtime_checkable

import kmock

from nodefabric_operator.demo.kubeapi.catalogue import Catalogue
from nodefabric_operator.demo.kubeapi.routes import resource_key
from nodefabric_operator.demo.kubeapi.store import Hub, Store, key_of


@runtime_checkable
class Backend(Protocol):
    """What the kmock surfaces use of the API (`server.KubeAPI`)."""

    @property
    def catalogue(self) -> Catalogue: ...

    @property
    def store(self) -> Store: ...

    def hub(self, resource: str) -> Hub: ...

    def declare(self, key: str, *, kind: str, namespaced: bool, subresources: Any = ()) -> None: ...

    def put_object(self, key: str, obj: dict[str, Any], *, validate: bool = True) -> dict[str, Any]: ...

    def remove_object(self, key: str, name: str, namespace: str | None = None) -> None: ...

    def clear_objects(self) -> None: ...


class Buses(dict[Any, Hub]):
    """kmock's `_buses` (resource -> event bus), for tests that put events on a resource's bus."""

    def __init__(self, api: Backend) -> None:
        super().__init__()
        self._api = api

    def __missing__(self, ref: Any) -> Hub:
        return self._api.hub(str(resource_key(ref)))


class ResourcesView(Mapping[Any, Any]):
    """kmock's `resources` (resource -> ResourceInfo) over our catalogue: what is served, by key; an
    assignment declares a resource, as with kmock."""

    def __init__(self, api: Backend) -> None:
        self._api = api

    def __getitem__(self, key: Any) -> Any:
        rt = self._api.catalogue.by_key(resource_key(key))
        if rt is None:
            raise KeyError(key)
        return kmock.ResourceInfo(
            kind=rt.kind,
            singular=rt.singular,
            namespaced=rt.namespaced,
            verbs={"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"},
            shortnames=set(rt.short_names),
            categories=set(rt.categories),
            subresources=set(rt.subresources),
        )

    def __setitem__(self, key: Any, info: Any) -> None:
        kind = getattr(info, "kind", None) or (info.get("kind") if isinstance(info, Mapping) else None)
        namespaced = getattr(info, "namespaced", None)
        if isinstance(info, Mapping):
            namespaced = info.get("namespaced")
        subresources = getattr(info, "subresources", None) or (
            info.get("subresources", ()) if isinstance(info, Mapping) else ()
        )
        ref = kmock.resource(resource_key(key))
        self._api.declare(
            resource_key(key),
            kind=kind or str(ref.plural).capitalize(),
            namespaced=bool(namespaced),
            subresources=subresources,
        )

    def __iter__(self) -> Iterator[Any]:
        return iter([rt.ref for rt in self._api.catalogue])

    def __len__(self) -> int:
        return len(list(self._api.catalogue))


class LiveObject(kmock.Object):  # type: ignore[misc]
    """A copy of a stored object whose API-like methods act on the store: `delete()` deletes it (watches
    see DELETED), `patch(changes)` merges into it. Item assignment changes only the copy."""

    def __init__(self, api: Backend, resource: str, obj: Mapping[str, Any]) -> None:
        super().__init__(copy.deepcopy(dict(obj)))
        self._api, self._resource, self._key = api, resource, key_of(obj)

    def delete(self) -> None:
        ns, name = self._key
        self._api.remove_object(self._resource, name, ns or None)
        super().delete()

    def patch(self, changes: Mapping[str, Any] | None = None, /, **kwargs: Any) -> None:
        super().patch(changes, **kwargs)
        self._api.put_object(self._resource, copy.deepcopy(self.raw))


class ObjectsView:
    """kmock's `objects` array over our store: `items()`, `[resource, namespace, name]`, assignment."""

    def __init__(self, api: Backend) -> None:
        self._api = api

    def _ref(self, resource: str) -> Any:
        rt = self._api.catalogue.by_key(resource)
        return rt.ref if rt is not None else kmock.resource(resource)

    def items(self) -> Iterator[tuple[tuple[Any, str | None, str], Any]]:
        for resource, obj in self._api.store.items():
            ns, name = key_of(obj)
            yield (self._ref(resource), ns or None, name), LiveObject(self._api, resource, obj)

    def keys(self) -> Iterator[tuple[Any, str | None, str]]:
        for key, _ in self.items():
            yield key

    def values(self) -> Iterator[Any]:
        for _, obj in self.items():
            yield obj

    def __iter__(self) -> Iterator[tuple[Any, str | None, str]]:
        return self.keys()

    def __len__(self) -> int:
        return sum(1 for _ in self._api.store.items())

    def __contains__(self, key: Any) -> bool:
        return self._api.store.get(resource_key(key[0]), key[1], key[2]) is not None

    def __getitem__(self, key: Any) -> Any:
        obj = self._api.store.get(resource_key(key[0]), key[1], key[2])
        if obj is None:
            raise KeyError(key)
        return LiveObject(self._api, resource_key(key[0]), obj)

    def __setitem__(self, key: Any, value: Mapping[str, Any]) -> None:
        body = copy.deepcopy(dict(value))
        body.setdefault("metadata", {}).update({"name": key[2], **({"namespace": key[1]} if key[1] else {})})
        self._api.put_object(resource_key(key[0]), body)

    def clear(self) -> None:
        """Delete every object but what the API started with: the CRDs it serves, its namespaces."""
        self._api.clear_objects()

    def __delitem__(self, key: Any) -> None:
        self._api.remove_object(resource_key(key[0]), key[2], key[1])
