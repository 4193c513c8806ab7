"""An in-process stand-in for NDIF: intercepts nnsight's network layer and serves requests locally.

nnsight's ``RemoteBackend`` subscribes on a websocket (``websocket.create_connection``), POSTs the
serialised request with ``httpx.Client.post`` and waits for status messages on the socket.
:class:`FakeNDIF` replaces exactly those two calls: it records every request as it would leave the
machine (URL, headers, routing envelope, payload size), then deserialises the payload the way the
server does -- against a server-side nnsight model holding real weights -- runs it, and answers
with a COMPLETED message carrying the saved values.  Nothing touches the network.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any


@dataclass
class SentRequest:
    url: str
    headers: dict[str, str]
    envelope: dict[str, Any]
    payload_bytes: int
    ws_url: str = ""
    ws_headers: dict[str, str] = field(default_factory=dict)


class FakeNDIF:
    """Monkeypatch target set: ``websocket.create_connection``, ``httpx.Client``, ``HfApi.model_info``."""

    def __init__(self, server_model: Any, *, fail_with: str | None = None) -> None:
        self.server_model = server_model  # nnsight TransformersModel with the weights ("the server")
        self.sent: list[SentRequest] = []
        self.fail_with = fail_with
        self._socket: _FakeSocket | None = None

    def install(self, monkeypatch) -> "FakeNDIF":
        import httpx
        import websocket
        from huggingface_hub import HfApi

        monkeypatch.setattr(websocket, "create_connection", self._connect)
        monkeypatch.setattr(httpx, "Client", self._client)
        monkeypatch.setattr(HfApi, "model_info", lambda _self, repo_id, **kw: SimpleNamespace(id=repo_id))
        return self

    # -- websocket -------------------------------------------------------------------------------
    def _connect(self, url: str, header: dict | None = None, **kwargs: Any) -> "_FakeSocket":
        self._socket = _FakeSocket(url, dict(header or {}))
        return self._socket

    # -- HTTP ------------------------------------------------------------------------------------
    def _client(self, *args: Any, **kwargs: Any) -> "_FakeClient":
        return _FakeClient(self)

    def handle_post(self, url: str, data: dict, files: dict, headers: dict) -> Any:
        from nnsight.schema.response import ResponseModel, Status
        envelope = json.loads(data["data"])
        blob = files["blob"][1]
        sock = self._socket
        self.sent.append(SentRequest(url, dict(headers), envelope, len(blob),
                                     sock.url if sock else "", sock.headers if sock else {}))
        job = f"job-{len(self.sent)}"
        if self.fail_with is not None:
            sock.queue.append(ResponseModel(id=job, status=Status.ERROR, description=self.fail_with)
                              .model_dump_json())
        else:
            result = self._run(blob, envelope)
            raw = io.BytesIO()
            import torch
            torch.save(result, raw)
            payload = raw.getvalue()
            if envelope.get("compress"):
                import zstandard
                payload = zstandard.ZstdCompressor().compress(payload)
            sock.queue.append(ResponseModel(id=job, status=Status.RUNNING).model_dump_json())
            sock.queue.append(ResponseModel(id=job, status=Status.COMPLETED, data=payload).pickle())
        return SimpleNamespace(text=ResponseModel(id=job, status=Status.RECEIVED).model_dump_json(),
                               raise_for_status=lambda: None)

    def _run(self, blob: bytes, envelope: dict) -> dict[str, Any]:
        """What the server does with a request: rebuild the block against its model, run, return saves."""
        import linecache

        from nnsight.schema.request import RequestModel
        from nnsight.tracing.tracer import _saves, dec, inc
        model = self.server_model
        model._remoteable_set_env(envelope.get("env") or {})
        # deserialize() registers the block's source in linecache under the client's file name; a real
        # server is another process, so keep this process's entries as they were
        saved = dict(linecache.cache)
        try:
            tracer = RequestModel.deserialize(blob, model._remoteable_persistent_objects(),
                                              compress=bool(envelope.get("compress")))
        finally:
            linecache.cache.clear()
            linecache.cache.update(saved)
        inc()
        try:
            tracer.execute(tracer.info.code)
            frame = tracer.info.frame
            return {k: v for k, v in frame.f_locals.items() if id(v) in _saves()}
        finally:
            dec()


class _FakeSocket:
    def __init__(self, url: str, headers: dict[str, str]) -> None:
        self.url = url
        self.headers = headers
        self.queue: list[Any] = [json.dumps({"session_id": "session-1"})]

    def recv(self) -> Any:
        return self.queue.pop(0)

    def settimeout(self, _t: float) -> None:
        pass

    def close(self) -> None:
        pass


class _FakeClient:
    def __init__(self, server: FakeNDIF) -> None:
        self.server = server

    def __enter__(self) -> "_FakeClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def post(self, url: str, data: dict, files: dict, headers: dict) -> Any:
        return self.server.handle_post(url, data, files, headers)
