"""A minimal HTTPS client for the few calls the harness makes while starting a cluster.

Polling /readyz, creating nodes and reading a handful of objects needs no more than
``http.client`` with a client certificate; using it keeps ``up`` quick (importing the
``kubernetes`` package takes about a second) and independent of that library.
Tests and the operator use the real client (``Cluster.api_client()``).
"""

from __future__ import annotations

import http.client
import json
import ssl
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit


class ApiError(RuntimeError):
    """A non-2xx answer; ``status`` is the HTTP status (0 when nothing answered)."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(f"HTTP {status}: {message}" if status else message)


def https_status(url: str, *, ca_cert: Path, timeout_s: float = 2.0) -> int:
    """HTTP status of a GET of ``url`` over TLS verified by ``ca_cert``, without a client
    certificate (how a webhook server is probed); 0 when nothing answered. Never raises."""
    parts = urlsplit(url)
    context = ssl.create_default_context(cafile=str(ca_cert))
    return _get_status(http.client.HTTPSConnection(parts.hostname, parts.port, timeout=timeout_s, context=context),
                       parts.path)


def http_status(url: str, *, timeout_s: float = 2.0) -> int:
    """HTTP status of a plain-HTTP GET of ``url`` (how the oracle service's /readyz is probed);
    0 when nothing answered. Never raises."""
    parts = urlsplit(url)
    return _get_status(http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout_s), parts.path)


def _get_status(conn: http.client.HTTPConnection, path: str) -> int:
    try:
        conn.request("GET", path or "/")
        return conn.getresponse().status
    except (OSError, http.client.HTTPException):
        return 0
    finally:
        conn.close()


@dataclass(frozen=True)
class Api:
    """Talks to ``server`` ("https://127.0.0.1:<port>") as the client cert's identity."""

    server: str
    ca_cert: Path
    client_cert: Path
    client_key: Path
    timeout_s: float = 5.0

    def _context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca_cert))
        context.load_cert_chain(str(self.client_cert), str(self.client_key))
        return context

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, str]:
        """One request; returns (HTTP status, body text). Raises ApiError(0, ...) when the
        server cannot be reached."""
        url = urlsplit(self.server)
        conn = http.client.HTTPSConnection(url.hostname, url.port, timeout=self.timeout_s,
                                           context=self._context())
        try:
            payload = json.dumps(body).encode() if body is not None else None
            headers = {"Accept": "application/json"}
            if payload is not None:
                headers["Content-Type"] = "application/json"
            conn.request(method, path, body=payload, headers=headers)
            response = conn.getresponse()
            return response.status, response.read().decode(errors="replace")
        except (OSError, http.client.HTTPException) as err:
            raise ApiError(0, f"{self.server}{path}: {err}") from err
        finally:
            conn.close()

    def get_json(self, path: str) -> dict | None:
        """GET ``path`` as JSON; None on 404. Raises ApiError otherwise."""
        status, text = self.request("GET", path)
        if status == 404:
            return None
        if status // 100 != 2:
            raise ApiError(status, text[:500])
        return json.loads(text)

    def create(self, path: str, body: dict) -> bool:
        """POST ``body`` to collection ``path``; True if created, False if it existed."""
        status, text = self.request("POST", path, body)
        if status == 409:
            return False
        if status // 100 != 2:
            raise ApiError(status, text[:500])
        return True

    def readyz(self) -> tuple[bool, str]:
        """(ready, reason) from GET /readyz; never raises."""
        try:
            status, text = self.request("GET", "/readyz")
        except ApiError as err:
            return False, str(err)
        if status == 200:
            return True, "ok"
        failing = [line for line in text.splitlines() if line.startswith("[-]")]
        return False, f"HTTP {status}: " + ("; ".join(failing) or text.strip()[-200:])
