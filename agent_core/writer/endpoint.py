"""Talking to the model: one OpenAI-compatible chat-completions endpoint over HTTP (standard library only).

ChatEndpoint.complete() POSTs {url}/chat/completions with "stream": true and reads Server-Sent Events
(`data: {...}` ... `data: [DONE]`), or a plain chat.completion body from servers that do not stream.
Failures are EndpointError with a `kind` a caller can act on. Connection errors, timeouts, 429 and 5xx
are retried with exponential backoff (1 s, 2 s, 4 s, ... or the server's Retry-After when small), but
only while nothing of the reply has reached on_delta yet: a retry would start the text over.
The key goes only into the Authorization header; any echo of it in a server's message is masked.
TokenBudget counts what each region and the whole run spent against the caps of the config.
"""
from __future__ import annotations

import email.utils
import http
import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable, Iterable, Iterator

from ..text import plural
from .config import WriterConfig, WriterError

__all__ = ["WriterError", "EndpointError", "Reply", "ChatEndpoint", "TokenBudget", "KINDS"]

KINDS = ("http", "timeout", "connection", "malformed", "truncated", "cap", "cancelled")
BACKOFF_S = 1.0             # the first retry waits this long, each later one twice the one before
BACKOFF_MAX_S = 30.0
RETRY_AFTER_MAX_S = 30.0    # a longer Retry-After is not waited for: the error is raised at once
MAX_BODY = 32 << 20         # a plain reply larger than this is refused (a hostile or broken server)
MAX_LINE = 1 << 20          # likewise one line of a stream
MAX_ERROR_BODY = 64 << 10
_RETRY_STATUS = {408, 429} | (set(range(500, 600)) - {501, 505})


class EndpointError(WriterError):
    """The endpoint did not give a usable reply. `kind` is one of KINDS; `status` the HTTP status if any."""

    def __init__(self, message: str, kind: str, *, status: int | None = None,
                 retry_after: float | None = None):
        if kind not in KINDS:
            raise ValueError(f"unknown EndpointError kind {kind!r}")
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.retry_after = retry_after


@dataclass
class Reply:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str      # "stop", "length" (cut at max_tokens), ... or "unknown" when the server said none
    seconds: float          # the whole call, retries included


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an error: following it would resend the key to wherever it points."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


class ChatEndpoint:
    def __init__(self, config: WriterConfig, *, sleep: Callable[[float], None] = time.sleep):
        self.config = config
        self._sleep = sleep
        self._where = f"writer endpoint {config.host()}"
        # a local server is reached directly even when the environment names a proxy
        proxies = urllib.request.ProxyHandler() if config.is_remote() else urllib.request.ProxyHandler({})
        self._opener = urllib.request.build_opener(proxies, _NoRedirect())

    def complete(self, messages: list[dict], *, on_delta: Callable[[str], None] | None = None,
                 cancel: Callable[[], bool] | None = None) -> Reply:
        """The model's reply to `messages`; each piece of text goes to on_delta as it arrives, in order.
        `cancel()` returning True stops it between chunks (EndpointError kind "cancelled")."""
        start = time.monotonic()
        key = self.config.api_key()
        body = json.dumps({
            "model": self.config.model, "messages": messages, "stream": True,
            "max_tokens": self.config.max_tokens, "temperature": 0,
            "stream_options": {"include_usage": True},   # the real token counts in the last chunk
        }).encode("utf-8")
        attempts = self.config.retries + 1
        for attempt in range(attempts):
            pieces: list[str] = []
            try:
                self._check_cancel(cancel)
                text, finish, usage = self._attempt(body, key, pieces, on_delta, cancel)
            except EndpointError as err:
                delay = None if pieces or attempt + 1 == attempts else _retry_delay(err, attempt)
                if delay is None:
                    raise _final(err, attempt + 1, key)
                self._sleep(delay)
                continue
            return Reply(text=text, finish_reason=finish or "unknown",
                         prompt_tokens=_count(usage, "prompt_tokens", _estimate_prompt(messages)),
                         completion_tokens=_count(usage, "completion_tokens", _estimate(text)),
                         seconds=time.monotonic() - start)
        raise AssertionError("unreachable")

    # --- one attempt -------------------------------------------------------------------------------

    def _attempt(self, body: bytes, key: str | None, pieces: list[str], on_delta, cancel):
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream, application/json",
                   "User-Agent": "stitchcuda-writer"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        req = urllib.request.Request(self.config.url.rstrip("/") + "/chat/completions",
                                     data=body, headers=headers, method="POST")
        try:
            resp = self._opener.open(req, timeout=self.config.timeout_s)
        except urllib.error.HTTPError as err:
            with err:
                raise self._http_error(err.code, err.headers, _read_quietly(err, MAX_ERROR_BODY)) from None
        except urllib.error.URLError as err:
            raise self._transport_error(err.reason) from err
        except (OSError, http.client.HTTPException) as err:
            raise self._transport_error(err) from err

        def deliver(piece: str) -> None:
            pieces.append(piece)
            if on_delta is not None:
                on_delta(piece)
            self._check_cancel(cancel)

        with resp:
            try:
                if "event-stream" in resp.headers.get("Content-Type", ""):
                    return self._read_stream(_lines(resp, self._where), deliver)
                raw = resp.read(MAX_BODY + 1)
                if len(raw) > MAX_BODY:
                    raise EndpointError(f"{self._where}: reply larger than {MAX_BODY >> 20} MiB", "malformed")
                if raw.lstrip().startswith(b"data:"):       # a stream labelled as something else
                    return self._read_stream(iter(raw.splitlines(keepends=True)), deliver)
                text, finish, usage = self._parse_plain(raw)
                if text:
                    deliver(text)
                return text, finish, usage
            except TimeoutError as err:
                raise EndpointError(f"{self._where}: no data for {self.config.timeout_s:g} s in the middle "
                                    f"of the reply", "timeout") from err
            except (http.client.IncompleteRead, ConnectionError) as err:
                got = f" after {len(''.join(pieces))} characters" if pieces else ""
                raise EndpointError(f"{self._where}: the connection closed in the middle of the reply{got}",
                                    "truncated") from err

    def _read_stream(self, lines: Iterable[bytes], deliver) -> tuple[str, str | None, dict | None]:
        """Server-Sent Events: `data:` lines make an event, a blank line ends it, `:` lines are keep-alives."""
        state = {"text": [], "finish": None, "usage": None, "chunks": 0, "done": False}
        data: list[bytes] = []
        for raw in lines:
            line = raw.rstrip(b"\r\n")
            if line:
                name, _, value = line.partition(b":")
                if name == b"data":
                    data.append(value[1:] if value.startswith(b" ") else value)
                continue                    # comments and the fields we do not use (event, id, retry)
            if data:
                self._stream_event(b"\n".join(data), state, deliver)
                data = []
            if state["done"]:
                break
        if data and not state["done"]:      # the last event without its blank line
            self._stream_event(b"\n".join(data), state, deliver)
        if not state["done"] and state["finish"] is None:
            raise EndpointError(f"{self._where}: the reply stream ended before it finished (no [DONE] and no "
                                f"finish_reason after {plural(state['chunks'], 'chunk')})", "truncated")
        return "".join(state["text"]), state["finish"], state["usage"]

    def _stream_event(self, payload: bytes, state: dict, deliver) -> None:
        if payload.strip() == b"[DONE]":
            state["done"] = True
            return
        state["chunks"] += 1
        n = state["chunks"]
        try:
            chunk = json.loads(payload)
        except (ValueError, UnicodeDecodeError):
            raise EndpointError(f"{self._where}: stream chunk {n} is not JSON: {_head(payload)}", "malformed") from None
        if not isinstance(chunk, dict):
            raise EndpointError(f"{self._where}: stream chunk {n} is not an object: {_head(payload)}", "malformed")
        if "error" in chunk and "choices" not in chunk:
            raise EndpointError(f"{self._where}: the server reported an error in the middle of the reply: "
                                f"{_message_of(chunk)}", "http")
        if isinstance(chunk.get("usage"), dict):
            state["usage"] = chunk["usage"]
        choices = chunk.get("choices")
        if choices is None and "usage" in chunk:
            return                                  # a usage-only chunk
        if not isinstance(choices, list):
            raise EndpointError(f"{self._where}: stream chunk {n} has no 'choices' list: {_head(payload)}",
                                "malformed")
        for choice in choices[:1]:                  # we ask for one completion
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if not isinstance(delta, dict):
                raise EndpointError(f"{self._where}: stream chunk {n} has a choice without a 'delta' object: "
                                    f"{_head(payload)}", "malformed")
            content = delta.get("content")
            if content is not None and not isinstance(content, str):
                raise EndpointError(f"{self._where}: stream chunk {n} has non-text content: {_head(payload)}",
                                    "malformed")
            if isinstance(choice.get("finish_reason"), str):
                state["finish"] = choice["finish_reason"]
            if content:
                state["text"].append(content)
                deliver(content)

    def _parse_plain(self, raw: bytes) -> tuple[str, str | None, dict | None]:
        """A whole chat.completion object (a server that ignored "stream")."""
        try:
            obj = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise EndpointError(f"{self._where}: the reply is not JSON: {_head(raw)}", "malformed") from None
        if not isinstance(obj, dict):
            raise EndpointError(f"{self._where}: the reply is a JSON {type(obj).__name__}, not a chat "
                                f"completion object", "malformed")
        if "error" in obj and "choices" not in obj:
            raise EndpointError(f"{self._where}: the server reported an error: {_message_of(obj)}", "http")
        choices = obj.get("choices")
        if not isinstance(choices, list) or not choices:
            raise EndpointError(f"{self._where}: the reply has no 'choices': {_head(raw)}", "malformed")
        choice = choices[0] if isinstance(choices[0], dict) else {}
        message = choice.get("message")
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, str):
            raise EndpointError(f"{self._where}: the reply's choices[0].message has no text content: "
                                f"{_head(raw)}", "malformed")
        finish = choice.get("finish_reason")
        usage = obj.get("usage")
        return content, finish if isinstance(finish, str) else None, usage if isinstance(usage, dict) else None

    # --- errors ------------------------------------------------------------------------------------

    def _http_error(self, status: int, headers, body: bytes) -> EndpointError:
        try:
            phrase = http.HTTPStatus(status).phrase
        except ValueError:
            phrase = "HTTP error"
        message = f"{self._where}: {status} {phrase}"
        said = _server_message(body)
        if said:
            message += f": {said}"
        if 300 <= status < 400:
            message += f" (redirected to {headers.get('Location', '?')}; give that URL instead)"
        elif status == 404:
            message += f" (is {self.config.url} the API base, e.g. http://127.0.0.1:8000/v1?)"
        retry_after = _retry_after(headers.get("Retry-After")) if headers is not None else None
        if retry_after is not None and retry_after > RETRY_AFTER_MAX_S and status in _RETRY_STATUS:
            message += f" (the server asks to retry after {retry_after:.0f} s; not waiting that long)"
        return EndpointError(message, "http", status=status, retry_after=retry_after)

    def _transport_error(self, reason) -> EndpointError:
        if isinstance(reason, TimeoutError):
            return EndpointError(f"{self._where}: no answer within {self.config.timeout_s:g} s", "timeout")
        if isinstance(reason, socket.gaierror):
            return EndpointError(f"{self._where}: cannot resolve the host ({reason.strerror or reason})",
                                 "connection")
        if isinstance(reason, http.client.RemoteDisconnected):
            return EndpointError(f"{self._where}: the server closed the connection without answering",
                                 "connection")
        if isinstance(reason, http.client.HTTPException):
            return EndpointError(f"{self._where}: not an HTTP answer ({type(reason).__name__})", "malformed")
        text = getattr(reason, "strerror", None) or str(reason) or type(reason).__name__
        return EndpointError(f"{self._where}: cannot connect ({text})", "connection")

    def _check_cancel(self, cancel) -> None:
        if cancel is not None and cancel():
            raise EndpointError(f"{self._where}: cancelled", "cancelled")


class TokenBudget:
    """Tokens spent per region and per run, against region_token_cap and run_token_cap. A cap is checked
    before each request, so a region or a run goes over it by at most one reply."""

    def __init__(self, config: WriterConfig):
        self.config = config
        self._used: dict[str, int] = {}
        self._total = 0
        self._lock = threading.Lock()

    def charge(self, region: str, reply: Reply) -> None:
        n = reply.prompt_tokens + reply.completion_tokens
        with self._lock:
            self._used[region] = self._used.get(region, 0) + n
            self._total += n

    def check(self, region: str) -> None:
        """Raise EndpointError(kind="cap") naming the cap when the run or the region has spent its tokens."""
        with self._lock:
            total, used = self._total, self._used.get(region, 0)
        if total >= self.config.run_token_cap:
            raise EndpointError(f"writer: the run has used {total} tokens, its cap run_token_cap is "
                                f"{self.config.run_token_cap}", "cap")
        if used >= self.config.region_token_cap:
            raise EndpointError(f"writer: region {region} has used {used} tokens, its cap region_token_cap "
                                f"is {self.config.region_token_cap}", "cap")

    def used(self, region: str) -> int:
        with self._lock:
            return self._used.get(region, 0)

    @property
    def total(self) -> int:
        with self._lock:
            return self._total


# --- helpers --------------------------------------------------------------------------------------------

def _retry_delay(err: EndpointError, attempt: int) -> float | None:
    """Seconds to wait before the next attempt, or None when this error is not worth retrying."""
    if err.kind not in ("timeout", "connection") and not (err.kind == "http" and err.status in _RETRY_STATUS):
        return None
    if err.retry_after is not None:
        return err.retry_after if err.retry_after <= RETRY_AFTER_MAX_S else None
    return min(BACKOFF_S * 2 ** attempt, BACKOFF_MAX_S)


def _final(err: EndpointError, attempts: int, key: str | None) -> EndpointError:
    """The error as the caller sees it: how many attempts it took, and never the key."""
    message = str(err)
    if attempts > 1:
        message += f" (after {plural(attempts, 'attempt')})"
    if key:
        message = message.replace(key, "***")
    err.args = (message,)
    return err


def _lines(resp, where: str) -> Iterator[bytes]:
    while True:
        line = resp.readline(MAX_LINE + 1)
        if not line:
            return
        if len(line) > MAX_LINE:
            raise EndpointError(f"{where}: a line of the reply stream is longer than {MAX_LINE >> 20} MiB",
                                "malformed")
        yield line


def _read_quietly(resp, limit: int) -> bytes:
    try:
        return resp.read(limit) or b""
    except (OSError, http.client.HTTPException):
        return b""


def _retry_after(value: str | None) -> float | None:
    """Retry-After as seconds: a number, or an HTTP date."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


def _message_of(obj: dict) -> str:
    """The human part of an error object in the shapes servers use: OpenAI/vLLM {"error": {"message"}},
    Ollama {"error": "..."}, vLLM {"object": "error", "message"}, FastAPI {"detail"}."""
    err = obj.get("error")
    said = err.get("message") if isinstance(err, dict) else err
    for candidate in (said, obj.get("message"), obj.get("detail")):
        if candidate:
            return _one_line(candidate if isinstance(candidate, str) else json.dumps(candidate))
    return _one_line(json.dumps(obj))


def _server_message(body: bytes) -> str:
    text = body.decode("utf-8", "replace").strip()
    try:
        obj = json.loads(text)
    except ValueError:
        return _one_line(text)
    return _message_of(obj) if isinstance(obj, dict) else _one_line(text)


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _head(raw: bytes) -> str:
    return repr(_one_line(raw.decode("utf-8", "replace"), 80)) if raw.strip() else "(empty)"


def _count(usage: dict | None, name: str, estimate: int) -> int:
    value = usage.get(name) if usage else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else estimate


def _estimate(text: str) -> int:
    """About four characters a token: what a server that reports no usage is charged."""
    return (len(text) + 3) // 4


def _estimate_prompt(messages: list[dict]) -> int:
    return sum(_estimate(str(m.get("content", ""))) for m in messages if isinstance(m, dict))
