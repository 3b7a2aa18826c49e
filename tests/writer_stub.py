"""A real OpenAI-compatible HTTP server for the writer's tests: it replays queued responses in order.

    with StubServer([streamed("```cuda\\n...```"), http_error(503)]) as stub:
        ChatEndpoint(WriterConfig(url=stub.url, model="m")).complete(messages)
        stub.requests[0]["body"]["messages"]

A response is a plain dict (so a replay file can hold it as JSON) with a "type":
  streamed  SSE chunks as OpenAI/vLLM send them (text in `chunk`-character deltas, finish_reason, usage, [DONE])
  plain     one chat.completion object (a server that ignores "stream")
  http_error  a status with an error body, optionally Retry-After
  truncated the start of a stream, then the connection closes: no finish_reason, no [DONE]
  malformed 200 with exactly these bytes as the body
  slow      waits `seconds`, then answers `then` (for timeouts)
  hang_up   reads the request and closes the socket without a word
  raw       a recorded answer: status, headers and body bytes as a server sent them
"text_file" / "body_file" name a file beside the replay file (or the `base` directory) instead of inline text.
Standard library only, and runnable as a process for subprocess tests:
    python tests/writer_stub.py --replay FILE.json --port-file PATH [--log REQUESTS.jsonl]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import threading
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

RECORDED = Path(__file__).parent / "data" / "writer" / "recorded"
MODEL = "stub-model"


# --- responses ----------------------------------------------------------------------------------------

def streamed(text: str, chunk: int = 24, finish: str | None = "stop", usage: dict | None = None, *,
             gap_s: float = 0.0, stall_s: float = 0.0, chunked: bool = True, model: str = MODEL) -> dict:
    """`gap_s`: pause before each chunk; `stall_s`: one pause half-way through the text;
    `chunked=False`: no Transfer-Encoding, the end of the body is the socket's close."""
    return {"type": "streamed", "text": text, "chunk": chunk, "finish": finish, "usage": usage,
            "gap_s": gap_s, "stall_s": stall_s, "chunked": chunked, "model": model}


def plain(text: str, finish: str = "stop", usage: dict | None = None, *, model: str = MODEL) -> dict:
    return {"type": "plain", "text": text, "finish": finish, "usage": usage, "model": model}


def http_error(status: int, body: str | dict = "", retry_after: float | str | None = None) -> dict:
    return {"type": "http_error", "status": status, "body": body, "retry_after": retry_after}


def truncated(text: str, chunk: int = 24, *, chunked: bool = True) -> dict:
    return {"type": "truncated", "text": text, "chunk": chunk, "chunked": chunked}


def malformed(raw: bytes | str, content_type: str = "application/json") -> dict:
    raw = raw.encode("utf-8") if isinstance(raw, str) else raw
    return {"type": "malformed", "raw": raw.decode("latin-1"), "content_type": content_type}


def slow(seconds: float, then: dict | None = None) -> dict:
    return {"type": "slow", "seconds": seconds, "then": then or plain("late")}


def hang_up() -> dict:
    return {"type": "hang_up"}


def recorded(name: str) -> dict:
    """A recorded response from tests/data/writer/recorded/NAME.json, its files resolved."""
    path = RECORDED / f"{name}.json"
    return resolve(json.loads(path.read_text(encoding="utf-8")), path.parent)


def resolve(response: dict, base: Path) -> dict:
    """Inline the "text_file" / "body_file" a response names (relative to `base`), recursively for slow's `then`."""
    response = dict(response)
    if "text_file" in response:
        response["text"] = (base / response.pop("text_file")).read_text(encoding="utf-8")
    if "body_file" in response:
        response["body"] = (base / response.pop("body_file")).read_text(encoding="utf-8")
    if isinstance(response.get("then"), dict):
        response["then"] = resolve(response["then"], base)
    return response


def load_replay(path: str | Path) -> list[dict]:
    path = Path(path)
    responses = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(responses, list):
        raise ValueError(f"{path}: a replay file holds a JSON list of responses")
    return [resolve(r, path.parent) for r in responses]


def sse_chunks(text: str, chunk: int, finish: str | None, usage: dict | None, model: str) -> list[dict]:
    """The chunk objects OpenAI and vLLM stream: a role delta, content deltas, the finish, then usage."""
    def obj(choices, **extra):
        return {"id": "chatcmpl-stub", "object": "chat.completion.chunk", "created": 1700000000,
                "model": model, "choices": choices, **extra}

    def choice(delta, finish_reason=None):
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}

    chunks = [obj([choice({"role": "assistant", "content": ""})])]
    chunks += [obj([choice({"content": text[i:i + chunk]})]) for i in range(0, len(text), max(1, chunk))]
    if finish is not None:
        chunks.append(obj([choice({}, finish)]))
    if usage is not None:
        chunks.append(obj([], usage=usage))
    return chunks


def completion(text: str, finish: str, usage: dict | None, model: str) -> dict:
    body = {"id": "chatcmpl-stub", "object": "chat.completion", "created": 1700000000, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "logprobs": None, "finish_reason": finish}]}
    if usage is not None:
        body["usage"] = usage
    return body


# --- the server ---------------------------------------------------------------------------------------

class StubServer:
    """A ThreadingHTTPServer on 127.0.0.1 (a free port) in a daemon thread. `.url` is the API base
    (http://127.0.0.1:PORT/v1); `.requests` every request received (method, path, headers, body as parsed
    JSON or None, raw); each request takes the next queued response, or a 500 saying none is left."""

    def __init__(self, responses: list[dict] = (), *, port: int = 0, log: str | Path | None = None):
        self._queue = deque(responses)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._log = Path(log) if log else None
        self.requests: list[dict] = []
        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), _handler_for(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="writer-stub", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def add(self, *responses: dict) -> None:
        with self._lock:
            self._queue.extend(responses)

    def start(self) -> "StubServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()            # wakes slow responses
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> "StubServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _next(self, request: dict) -> dict | None:
        with self._lock:
            self.requests.append(request)
            if self._log:
                with self._log.open("a", encoding="utf-8") as f:
                    f.write(json.dumps(request) + "\n")
            return self._queue.popleft() if self._queue else None


def _handler_for(stub: StubServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format, *args):   # quiet: the tests read .requests instead
            pass

        def do_GET(self):
            self._serve()

        def do_POST(self):
            self._serve()

        def _serve(self):
            self.close_connection = True
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
            response = stub._next({"method": self.command, "path": self.path, "headers": dict(self.headers),
                                   "body": body, "raw": raw.decode("utf-8", "replace")})
            if response is None:
                response = http_error(500, {"error": {"message": "stub: no response left to replay"}})
            try:
                self._answer(response)
            except (BrokenPipeError, ConnectionResetError):
                pass            # the client gave up (a timeout test): nothing to answer

        def _answer(self, r: dict):
            kind = r["type"]
            if kind == "slow":
                if stub._stop.wait(r["seconds"]):
                    return
                return self._answer(r["then"])
            if kind == "hang_up":
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            if kind == "streamed":
                chunks = sse_chunks(r["text"], r["chunk"], r["finish"], r.get("usage"), r.get("model", MODEL))
                events = [b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks] + [b"data: [DONE]\n\n"]
                return self._stream(events, chunked=r.get("chunked", True), gap_s=r.get("gap_s", 0.0),
                                    stall_s=r.get("stall_s", 0.0))
            if kind == "truncated":
                chunks = sse_chunks(r["text"], r["chunk"], None, None, MODEL)
                events = [b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks]
                self._stream(events, chunked=r.get("chunked", True), cut=True)
                return
            if kind == "plain":
                body = completion(r["text"], r["finish"], r.get("usage"), r.get("model", MODEL))
                return self._send(200, {"Content-Type": "application/json"}, json.dumps(body).encode())
            if kind == "http_error":
                body = r["body"]
                data = (json.dumps(body) if isinstance(body, dict) else str(body)).encode()
                headers = {"Content-Type": "application/json" if isinstance(body, dict) else "text/plain"}
                if r.get("retry_after") is not None:
                    headers["Retry-After"] = str(r["retry_after"])
                return self._send(r["status"], headers, data)
            if kind == "malformed":
                return self._send(200, {"Content-Type": r["content_type"]}, r["raw"].encode("latin-1"))
            if kind == "raw":
                headers = dict(r.get("headers") or {})
                body = r.get("body", "").encode("utf-8")
                if "event-stream" in headers.get("Content-Type", headers.get("content-type", "")):
                    events = [e + b"\n\n" for e in body.split(b"\n\n") if e.strip()]
                    return self._stream(events, chunked=True, status=r.get("status", 200), headers=headers)
                return self._send(r.get("status", 200), headers, body)
            raise ValueError(f"stub: unknown response type {kind!r}")

        def _send(self, status: int, headers: dict, body: bytes):
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)

        def _stream(self, events: list[bytes], *, chunked: bool, gap_s: float = 0.0, stall_s: float = 0.0,
                    cut: bool = False, status: int = 200, headers: dict | None = None):
            self.send_response(status)
            for name, value in (headers or {"Content-Type": "text/event-stream"}).items():
                self.send_header(name, value)
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            if chunked:
                self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i, event in enumerate(events):
                pause = gap_s + (stall_s if i == len(events) // 2 else 0.0)
                if pause and stub._stop.wait(pause):
                    return
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event) if chunked else event)
                self.wfile.flush()
            if cut:             # no terminating chunk: the client sees the body end early
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
            elif chunked:
                self.wfile.write(b"0\r\n\r\n")

    return Handler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Replay recorded chat-completion responses over HTTP.")
    parser.add_argument("--replay", required=True, help="a JSON list of responses (text_file relative to it)")
    parser.add_argument("--port-file", required=True, help="where to write the URL once listening")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--log", help="append each request received to this file as a JSON line")
    args = parser.parse_args(argv)
    stub = StubServer(load_replay(args.replay), port=args.port, log=args.log).start()
    stopped = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopped.set())
    partial = Path(args.port_file + ".part")       # written whole, then renamed: a reader never sees half
    partial.write_text(stub.url + "\n", encoding="utf-8")
    os.replace(partial, args.port_file)
    while not stopped.wait(0.2):
        pass
    stub.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
