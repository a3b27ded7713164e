"""An API server that argues back: kmock's emulator with the bookkeeping and refusals of a real one.

kmock's :class:`~kmock.KubernetesEmulator` assigns no resourceVersion, lets a duplicate create escape as a
server-side error and validates nothing. :class:`ArguingApiServer` adds, through kmock's own extension points
(``_handle`` for every request, ``_serve_watch`` for watch streams, ``_render_error`` for Status bodies):

- uid, generation and a new ``metadata.resourceVersion`` on every write (one counter per server);
- 409 ``AlreadyExists`` on a create whose name is taken (nothing is stored);
- 409 ``Conflict`` on a merge patch or update that carries a stale ``metadata.resourceVersion``, and 422 on a
  JSON patch whose ``test`` op fails (what kopf expects of its optimistic-concurrency finalizer patches);
- one-shot faults (:class:`Fault`): answer the next matching request(s) with an error, optionally after
  storing the created object anyway (a create that raced another writer);
- :meth:`ArguingApiServer.end_watches`: close every open watch stream of a resource (the API server's
  watch timeout, or a restart of the API server), or end them with ``410 Gone``;
- garbage collection: deleting an object deletes (in the background) every object whose ownerReferences
  name its uid, as the Kubernetes garbage collector does.

Every request the server answered with an error is in :attr:`ArguingApiServer.refused` (for counting).
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from typing import Any, AsyncIterator, Callable

import jsonpatch
import kmock

CLOSE = {"type": "pitlab-test-close"}  # a sentinel put on a watch bus: the stream ends there


@dataclasses.dataclass
class Fault:
    """Answer the next ``times`` requests that match with ``status``/``reason``/``message``.

    ``action``: a kmock action name (CREATE, UPDATE, FETCH, DELETE, LIST, WATCH); ``resource``: e.g.
    ``"kubeflow.org/v1/pytorchjobs"``; ``name``: only requests for (or creates of) that name; ``subresource``:
    e.g. ``"status"`` (None: only the main resource; ``"*"``: either); ``agent``: only requests whose
    User-Agent differs from it (the test's own calls are never faulted); ``store``: a create is stored first
    (another writer won the race), then refused; ``when``: an extra predicate on the request."""

    action: str
    resource: str
    status: int
    reason: str
    message: str
    name: str | None = None
    subresource: str | None = None
    times: int = 1
    store: bool = False
    when: Callable[[kmock.Request], bool] | None = None
    hits: list[kmock.Request] = dataclasses.field(default_factory=list)
    at: list[float] = dataclasses.field(default_factory=list)  # time.monotonic() of each hit

    def matches(self, request: kmock.Request) -> bool:
        """Whether ``request`` is one this fault answers (and it has shots left)."""
        if len(self.hits) >= self.times or request.action is None or request.action.name != self.action:
            return False
        if request.resource != self.resource:
            return False
        if self.subresource != "*" and request.subresource != self.subresource:
            return False
        if self.name is not None and _name(request) != self.name:
            return False
        return self.when is None or bool(self.when(request))


def _name(request: kmock.Request) -> str | None:
    if request.name is not None:
        return request.name
    return ((request.data if isinstance(request.data, dict) else {}).get("metadata") or {}).get("name")


def _namespace(request: kmock.Request) -> str | None:
    if request.namespace is not None:
        return request.namespace
    return ((request.data if isinstance(request.data, dict) else {}).get("metadata") or {}).get("namespace")


class ArguingApiServer(kmock.KubernetesEmulator):
    """kmock's emulator with resourceVersions, conflicts, one-shot faults, watch endings and garbage
    collection (see the module docstring). ``test_agent``: the User-Agent of the test's own calls."""

    test_agent = "pitlab-e2e-test"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.version = 0
        self.uids = 0
        self.faults: list[Fault] = []
        self.refused: list[tuple[kmock.Request, int]] = []

    # ---- faults and refusals
    def inject(self, fault: Fault) -> Fault:
        """Arm ``fault`` (see :class:`Fault`); returns it (its ``hits`` list the requests it answered)."""
        self.faults.append(fault)
        return fault

    async def _refuse(self, request: kmock.Request, status: int, reason: str, message: str,
                      details: dict | None = None):
        self.refused.append((request, status))
        err = kmock.KubernetesError(status=status, reason=reason, message=message, details=details or {})
        return await self._render_error(err)

    def _stored(self, request: kmock.Request) -> Any:
        key = (request.resource, _namespace(request), _name(request))
        obj = self.objects[key] if key in self.objects else None
        return None if obj is None or obj.deleted else obj

    async def _store(self, request: kmock.Request) -> None:
        """Store a create's object as if it had been accepted (watchers see it), without answering."""
        self._stamp(request)
        key = (request.resource, _namespace(request), _name(request))
        async with self._lock:
            if key in self.objects:
                self.objects[key].create(request.data)
            else:
                self.objects[key] = request.data
            await self._buses[request.resource].put({"type": "ADDED", "object": self.objects[key].raw})

    def _what(self, request: kmock.Request) -> str:
        res = request.resource
        group = f".{res.group}" if res.group else ""
        return f'{res.plural}{group} "{_name(request)}"'

    # ---- the request pipeline
    async def _handle(self, request: kmock.Request):
        if request.resource is None:
            return await super()._handle(request)
        ours = request.headers.get("User-Agent") != self.test_agent
        for fault in self.faults:
            if ours and fault.matches(request):
                fault.hits.append(request)
                fault.at.append(time.monotonic())
                if fault.store and request.action == kmock.action.CREATE and self._stored(request) is None:
                    await self._store(request)
                return await self._refuse(request, fault.status, fault.reason, fault.message)
        if request.action == kmock.action.CREATE and self._stored(request) is not None:
            return await self._refuse(request, 409, "AlreadyExists", f"{self._what(request)} already exists",
                                      {"name": _name(request), "kind": request.resource.plural})
        if request.action == kmock.action.UPDATE:
            refusal = self._check_precondition(request)
            if refusal is not None:
                return await self._refuse(request, *refusal)
        if request.action in (kmock.action.CREATE, kmock.action.UPDATE):
            self._stamp(request)
        owner_uid = self._uid_if_deleting(request)
        try:
            response = await super()._handle(request)
        except (jsonpatch.JsonPatchTestFailed, jsonpatch.JsonPatchConflict) as err:
            return await self._refuse(request, 422, "Invalid", f"the JSON patch does not apply: {err}")
        if owner_uid is not None and self._stored(request) is None:
            await self._collect(owner_uid)
        return response

    def _check_precondition(self, request: kmock.Request) -> tuple[int, str, str] | None:
        """A merge patch or update carrying a resourceVersion that is not the stored one: 409 Conflict."""
        obj = self._stored(request)
        if obj is None or not isinstance(request.data, dict):
            return None
        wanted = (request.data.get("metadata") or {}).get("resourceVersion")
        stored = (obj.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != stored:
            return 409, "Conflict", (f"Operation cannot be fulfilled on {self._what(request)}: the object has been "
                                     "modified; please apply your changes to the latest version and try again")
        return None

    def _stamp(self, request: kmock.Request) -> None:
        """A new resourceVersion for the write (uid, generation and generateName on a create)."""
        self.version += 1
        rv = str(self.version)
        if isinstance(request.data, dict):
            meta = request.data.setdefault("metadata", {})
            if request.action == kmock.action.CREATE:
                if not meta.get("name") and meta.get("generateName"):
                    meta["name"] = f"{meta['generateName']}{rv:0>5}"
                if not meta.get("uid"):
                    self.uids += 1
                    meta["uid"] = f"uid-{self.uids:04d}-{meta.get('name')}"
                meta.setdefault("generation", 1)
                meta["creationTimestamp"] = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            meta["resourceVersion"] = rv
        elif isinstance(request.data, list):  # a JSON patch: its test ops see the old version first
            request.data.append({"op": "add", "path": "/metadata/resourceVersion", "value": rv})

    # ---- garbage collection
    def _uid_if_deleting(self, request: kmock.Request) -> str | None:
        """The uid of the object a delete (or a patch releasing its last finalizer) may remove."""
        if request.action not in (kmock.action.DELETE, kmock.action.UPDATE):
            return None
        obj = self._stored(request)
        return None if obj is None else (obj.get("metadata") or {}).get("uid")

    async def _collect(self, owner_uid: str) -> None:
        """Delete every object owned by ``owner_uid`` (background propagation: each one's own finalizers and
        dependents are handled like any deletion)."""
        for (res, ns, name), obj in list(self.objects.items()):
            if obj.deleted:
                continue
            refs = (obj.get("metadata") or {}).get("ownerReferences") or []
            if any(r.get("uid") == owner_uid for r in refs):
                await self.delete_object(res, ns, name)

    async def delete_object(self, resource: Any, namespace: str, name: str) -> None:
        """Delete one object as the API server does (finalizers honoured, watchers told, dependents
        collected)."""
        obj = self.objects[resource, namespace, name]
        meta = obj.get("metadata") or {}
        async with self._lock:
            if meta.get("finalizers"):
                if not meta.get("deletionTimestamp"):
                    self.version += 1
                    now = datetime.datetime.now(datetime.UTC).isoformat()
                    obj.patch({"metadata": {"deletionTimestamp": now, "resourceVersion": str(self.version)}})
                    await self._buses[resource].put({"type": "MODIFIED", "object": obj.raw})
                return
            raw = obj.raw
            obj.delete()
            await self._buses[resource].put({"type": "DELETED", "object": raw})
        await self._collect(meta.get("uid"))

    # ---- watch streams
    async def end_watches(self, resource: str, gone: bool = False) -> None:
        """End every open watch of ``resource``: the stream closes (``gone``: after an ``ERROR`` event with
        code 410, "resourceVersion too old", which makes a client list again)."""
        event = dict(CLOSE, gone=gone)
        await self._buses[kmock.resource(resource)].put(event)

    async def _serve_watch(self, request: kmock.Request) -> AsyncIterator[Any]:
        """The objects that exist, then every later event, none lost: kmock's own watch takes its place on the
        event bus only after it has sent the existing objects, so a write in between (a deletion's
        ``deletionTimestamp``, say) never reached the client; here the snapshot and the bus position are taken
        together under the store's lock, which every write holds while it publishes its event."""
        yield b""  # the headers: the stream has begun
        assert request.resource is not None
        bus = self._buses[request.resource]
        async with self._lock:
            objs = self._KubernetesEmulator__get_objs(request, strict=False)
            events = [{"type": "ADDED", "object": obj.raw} for obj in objs if not obj.deleted]
            mark = await bus.mark()
        try:
            for event in events:
                yield event
            async for event in bus.stream(since=mark):
                if isinstance(event, dict) and event.get("type") == CLOSE["type"]:
                    if event.get("gone"):
                        yield {"type": "ERROR", "object": {"apiVersion": "v1", "kind": "Status", "status": "Failure",
                                                           "code": 410, "reason": "Expired",
                                                           "message": "too old resource version"}}
                    return
                meta = (event.get("object") or {}).get("metadata") or {}
                if self._KubernetesEmulator__check(request, request.resource, meta.get("namespace"),
                                                   meta.get("name"), strict=False):
                    yield event
        finally:
            await bus.unmark(mark)
