"""Where the writer's model lives and how much it may spend: WriterConfig.

The API key is never a field: api_key() reads it from the environment variable named by key_env
each time, so repr(), public() and anything written from them cannot carry it.
"""
from __future__ import annotations

import ipaddress
import math
import os
import re
from dataclasses import dataclass, fields
from urllib.parse import urlsplit

from ..errors import StitchError


class WriterError(StitchError):
    """Base of every writer error (endpoint, gate, executors); `str(err)` is one line a user reads."""


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass
class WriterConfig:
    url: str                        # the API base, e.g. http://127.0.0.1:8000/v1 (POSTs go to {url}/chat/completions)
    model: str
    rounds: int = 3
    key_env: str = "STITCHCUDA_WRITER_KEY"
    timeout_s: float = 120.0        # connect and each read (a streamed reply may take longer in total)
    retries: int = 2                # extra attempts after a connection error, a timeout, 429 or 5xx
    max_tokens: int = 8192
    region_token_cap: int = 60_000
    run_token_cap: int = 400_000
    regions: tuple[str, ...] = ()   # empty: every region that runs a kernel or falls back

    def __post_init__(self):
        self.regions = tuple(self.regions)

    def __repr__(self) -> str:
        body = ", ".join(f"{k}={v!r}" for k, v in self._fields().items())
        return f"WriterConfig({body})"

    def _fields(self) -> dict:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values["url"] = _without_userinfo(self.url)
        return values

    def api_key(self) -> str | None:
        key = os.environ.get(self.key_env, "").strip()
        return key or None

    def host(self) -> str:
        """host[:port] of the endpoint: what events and the studio show (no path, no credentials)."""
        parts = urlsplit(self.url)
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        try:
            port = parts.port
        except ValueError:
            port = None
        return f"{host}:{port}" if port else host

    def is_remote(self) -> bool:
        """False only for this machine (localhost, 127.0.0.0/8, ::1): anything else sees what we send."""
        host = (urlsplit(self.url).hostname or "").rstrip(".").lower()
        if host == "localhost" or host.endswith(".localhost"):
            return False
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            return True
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return not ip.is_loopback

    def public(self) -> dict:
        """Everything but the key, JSON-ready, for events and records."""
        values = self._fields()
        values["regions"] = list(self.regions)
        values["host"] = self.host()
        values["remote"] = self.is_remote()
        return values

    def validate(self) -> "WriterConfig":
        """Raise WriterError naming the first bad setting; returns self so a caller can chain it."""
        url = (self.url or "").strip()
        if not url:
            raise WriterError("writer: no endpoint URL given (e.g. --writer http://127.0.0.1:8000/v1)")
        parts = urlsplit(url)
        shown = _without_userinfo(url)
        if parts.scheme not in ("http", "https"):
            raise WriterError(f"writer: endpoint URL {shown!r} must start with http:// or https://")
        if not parts.hostname:
            raise WriterError(f"writer: endpoint URL {shown!r} has no host")
        try:
            parts.port
        except ValueError:
            raise WriterError(f"writer: endpoint URL {shown!r} has a bad port") from None
        if parts.username is not None or parts.password is not None:
            raise WriterError(f"writer: endpoint URL {shown!r} carries credentials; put the key in "
                              f"the environment variable {self.key_env} instead")
        if parts.query or parts.fragment:
            raise WriterError(f"writer: endpoint URL {shown!r} must be the API base, without ?query or #fragment")
        if not isinstance(self.model, str) or not self.model.strip():
            raise WriterError("writer: no model name given (--writer-model)")
        _at_least("rounds", self.rounds, 1)
        _at_least("retries", self.retries, 0)
        _at_least("max_tokens", self.max_tokens, 1)
        _at_least("region_token_cap", self.region_token_cap, 1)
        _at_least("run_token_cap", self.run_token_cap, 1)
        if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, (int, float)) \
                or not math.isfinite(self.timeout_s) or self.timeout_s <= 0:
            raise WriterError(f"writer: timeout_s must be a positive number of seconds, not {self.timeout_s!r}")
        if not isinstance(self.key_env, str) or not _ENV_NAME.match(self.key_env):
            raise WriterError(f"writer: key_env {self.key_env!r} is not an environment variable name")
        bad = [r for r in self.regions if not isinstance(r, str) or not r]
        if bad:
            raise WriterError(f"writer: region ids must be non-empty strings, not {bad[0]!r}")
        return self


def _at_least(name: str, value, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise WriterError(f"writer: {name} must be an integer >= {low}, not {value!r}")


def _without_userinfo(url: str) -> str:
    """The URL with any user:password@ replaced, so a credential typed into it is never shown."""
    parts = urlsplit(url or "")
    if "@" not in parts.netloc:
        return url
    return parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]).geturl()
