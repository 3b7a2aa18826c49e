"""The writer's endpoint client over real sockets: every test talks HTTP to a StubServer on 127.0.0.1."""
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent_core.errors import StitchError
from agent_core.writer.config import WriterConfig, WriterError
from agent_core.writer.endpoint import ChatEndpoint, EndpointError, Reply, TokenBudget
from tests.writer_stub import (RECORDED, StubServer, hang_up, http_error, malformed, plain, recorded, slow,
                               streamed, truncated)

MESSAGES = [{"role": "system", "content": "You write CUDA."}, {"role": "user", "content": "Fuse add and relu."}]
KERNEL = (RECORDED / "answer_add_relu.md").read_text(encoding="utf-8")
KEY = "sk-test-0123456789abcdef"


def client(stub, sleeps=None, **settings):
    """A ChatEndpoint on the stub with test-sized timeouts; backoff sleeps are recorded, not slept."""
    settings = {"model": "coder", "timeout_s": 0.3, **settings}
    sleeps = [] if sleeps is None else sleeps
    return ChatEndpoint(WriterConfig(url=stub.url, **settings), sleep=sleeps.append)


def failure(stub, sleeps=None, **settings) -> EndpointError:
    with pytest.raises(EndpointError) as info:
        client(stub, sleeps, **settings).complete(MESSAGES)
    return info.value


# --- replies -----------------------------------------------------------------------------------------

def test_streamed_reply_arrives_delta_by_delta_in_order():
    usage = {"prompt_tokens": 1200, "completion_tokens": 88, "total_tokens": 1288}
    with StubServer([streamed(KERNEL, chunk=7, usage=usage)]) as stub:
        deltas = []
        reply = client(stub).complete(MESSAGES, on_delta=deltas.append)
    assert deltas == [KERNEL[i:i + 7] for i in range(0, len(KERNEL), 7)]
    assert reply.text == KERNEL
    assert (reply.prompt_tokens, reply.completion_tokens, reply.finish_reason) == (1200, 88, "stop")
    assert reply.seconds > 0


def test_the_request_is_an_openai_chat_completion():
    with StubServer([streamed("ok")]) as stub:
        client(stub, max_tokens=1234).complete(MESSAGES)
    (request,) = stub.requests
    assert (request["method"], request["path"]) == ("POST", "/v1/chat/completions")
    body = request["body"]
    assert {k: body[k] for k in ("model", "messages", "stream", "max_tokens", "temperature")} == {
        "model": "coder", "messages": MESSAGES, "stream": True, "max_tokens": 1234, "temperature": 0}
    assert request["headers"]["Content-Type"] == "application/json"


def test_a_server_that_ignores_stream_answers_with_one_plain_body():
    with StubServer([plain(KERNEL, usage={"prompt_tokens": 10, "completion_tokens": 20})]) as stub:
        deltas = []
        reply = client(stub).complete(MESSAGES, on_delta=deltas.append)
    assert (reply.text, reply.prompt_tokens, reply.completion_tokens) == (KERNEL, 10, 20)
    assert deltas == [KERNEL]


def test_without_usage_the_tokens_are_estimated_from_the_text():
    with StubServer([plain("x" * 401), streamed("y" * 40)]) as stub:
        first, second = (client(stub).complete(MESSAGES) for _ in range(2))
    prompt_chars = sum(len(m["content"]) for m in MESSAGES)
    assert first.completion_tokens == 101 and second.completion_tokens == 10
    assert first.prompt_tokens == second.prompt_tokens == sum((len(m["content"]) + 3) // 4 for m in MESSAGES)
    assert prompt_chars // 4 <= first.prompt_tokens <= prompt_chars


@pytest.mark.parametrize("name, prompt_tokens, completion_tokens", [
    ("vllm_stream", 1187, 156), ("llamacpp_stream_no_done", 1190, 156), ("ollama_plain", 1203, 236)])
def test_recorded_server_answers_parse_to_the_same_kernel(name, prompt_tokens, completion_tokens):
    with StubServer([recorded(name)]) as stub:
        deltas = []
        reply = client(stub).complete(MESSAGES, on_delta=deltas.append)
    assert reply.text == KERNEL == "".join(deltas)
    assert (reply.prompt_tokens, reply.completion_tokens, reply.finish_reason) == (
        prompt_tokens, completion_tokens, "stop")


def test_finish_reason_length_is_surfaced():
    with StubServer([streamed("half a kern", finish="length"), plain("half", finish="length")]) as stub:
        assert client(stub).complete(MESSAGES).finish_reason == "length"
        assert client(stub).complete(MESSAGES).finish_reason == "length"


def test_a_local_endpoint_is_reached_directly_even_with_a_proxy_set(monkeypatch):
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")     # the discard port: nothing answers there
    with StubServer([streamed("direct")]) as stub:
        assert client(stub).complete(MESSAGES).text == "direct"


# --- retries -----------------------------------------------------------------------------------------

def test_503_and_429_are_retried_with_exponential_backoff():
    sleeps = []
    with StubServer([http_error(503, "busy"), http_error(429, {"error": {"message": "slow down"}}),
                     streamed("third time")]) as stub:
        reply = client(stub, sleeps, retries=2).complete(MESSAGES)
    assert reply.text == "third time"
    assert len(stub.requests) == 3
    assert sleeps == [1.0, 2.0]


def test_a_small_retry_after_is_honoured():
    sleeps = []
    with StubServer([http_error(429, "rate limited", retry_after=3), http_error(503, "", retry_after=0),
                     plain("ok")]) as stub:
        assert client(stub, sleeps, retries=2).complete(MESSAGES).text == "ok"
    assert sleeps == [3.0, 0.0]


def test_a_long_retry_after_is_not_waited_for():
    sleeps = []
    with StubServer([http_error(429, "quota", retry_after=3600), plain("never")]) as stub:
        err = failure(stub, sleeps, retries=2)
    assert (err.kind, err.status, len(stub.requests), sleeps) == ("http", 429, 1, [])
    assert "429 Too Many Requests: quota" in str(err) and "3600 s" in str(err)


def test_retries_run_out_and_say_how_many_attempts():
    sleeps = []
    with StubServer([http_error(502, "bad gateway")] * 3) as stub:
        err = failure(stub, sleeps, retries=2)
    assert (err.kind, err.status, len(stub.requests), sleeps) == ("http", 502, 3, [1.0, 2.0])
    assert str(err).endswith("(after 3 attempts)")


@pytest.mark.parametrize("status, body, said", [
    (401, {"error": {"message": "invalid key"}}, "401 Unauthorized: invalid key"),
    (400, {"object": "error", "message": "max_tokens too large"}, "400 Bad Request: max_tokens too large"),
    (404, {"detail": "Not Found"}, "404 Not Found: Not Found (is http://127.0.0.1"),
    (403, "forbidden by policy", "403 Forbidden: forbidden by policy")])
def test_other_4xx_are_not_retried_and_say_the_status_and_the_servers_message(status, body, said):
    sleeps = []
    with StubServer([http_error(status, body), plain("never")]) as stub:
        err = failure(stub, sleeps, retries=2)
    assert (err.kind, err.status, len(stub.requests), sleeps) == ("http", status, 1, [])
    assert said in str(err) and "\n" not in str(err)
    assert isinstance(err, WriterError) and isinstance(err, StitchError)


def test_recorded_vllm_context_error_is_a_400():
    with StubServer([recorded("vllm_error_400")]) as stub:
        err = failure(stub, retries=2)
    assert err.status == 400 and len(stub.requests) == 1
    assert "400 Bad Request: This model's maximum context length is 32768 tokens" in str(err)


def test_a_redirect_is_refused_not_followed():
    moved = {"type": "raw", "status": 307, "headers": {"Location": "http://elsewhere.example/v1/chat/completions"},
             "body": ""}
    with StubServer([moved, plain("never")]) as stub:
        err = failure(stub)
    assert (err.kind, err.status, len(stub.requests)) == ("http", 307, 1)
    assert "redirected to http://elsewhere.example/v1/chat/completions" in str(err)


# --- failures ----------------------------------------------------------------------------------------

def test_no_answer_within_the_timeout_is_a_timeout_after_the_retries():
    sleeps = []
    with StubServer([slow(2.0)] * 2) as stub:
        started = time.monotonic()
        err = failure(stub, sleeps, retries=1, timeout_s=0.3)
    assert (err.kind, len(stub.requests), sleeps) == ("timeout", 2, [1.0])
    assert "no answer within 0.3 s" in str(err)
    assert time.monotonic() - started < 1.5


def test_the_timeout_is_per_read_so_a_slow_steady_stream_completes():
    with StubServer([streamed("abcdef", chunk=1, gap_s=0.1)]) as stub:   # 9 chunks, 0.9 s in all
        assert client(stub, timeout_s=0.3).complete(MESSAGES).text == "abcdef"


def test_a_stall_after_text_arrived_is_a_timeout_without_retry():
    """A retry would start the reply over, repeating what on_delta already showed."""
    sleeps, deltas = [], []
    with StubServer([streamed("abcdef", chunk=1, stall_s=0.6), plain("never")]) as stub:
        with pytest.raises(EndpointError) as info:
            client(stub, sleeps, retries=2).complete(MESSAGES, on_delta=deltas.append)
    assert (info.value.kind, len(stub.requests), sleeps) == ("timeout", 1, [])
    assert deltas and "".join(deltas) in "abcdef"
    assert "in the middle of the reply" in str(info.value)


@pytest.mark.parametrize("chunked", [True, False])
def test_a_stream_cut_before_its_end_is_truncated(chunked):
    deltas = []
    with StubServer([truncated("__global__ void r0(", chunk=4, chunked=chunked), plain("never")]) as stub:
        with pytest.raises(EndpointError) as info:
            client(stub, retries=2).complete(MESSAGES, on_delta=deltas.append)
    assert info.value.kind == "truncated" and len(stub.requests) == 1
    assert "".join(deltas) == "__global__ void r0("
    assert "ended before it finished" in str(info.value) or "closed in the middle" in str(info.value)


@pytest.mark.parametrize("response, said", [
    (malformed(b"{\"choices\": [oops"), "the reply is not JSON: '{\"choices\": [oops'"),
    (malformed(b"[1, 2]"), "the reply is a JSON list, not a chat completion object"),
    (malformed(json.dumps({"id": "x", "object": "chat.completion"})), "the reply has no 'choices'"),
    (malformed(json.dumps({"choices": [{"message": {"role": "assistant"}}]})), "has no text content"),
    (malformed(b"data: {\"choices\": [{\"delta\": {\"content\": \"a\"}}]}\n\ndata: {oops\n\n", "text/event-stream"),
     "stream chunk 2 is not JSON: '{oops'"),
    (malformed(b"data: {\"id\": \"c1\", \"object\": \"chat.completion.chunk\"}\n\n", "text/event-stream"),
     "stream chunk 1 has no 'choices' list"),
    (malformed(b"data: {\"choices\": [{\"delta\": {\"content\": 7}}]}\n\n", "text/event-stream"),
     "stream chunk 1 has non-text content")])
def test_malformed_replies_say_what_was_wrong(response, said):
    with StubServer([response, plain("never")]) as stub:
        err = failure(stub, retries=2)
    assert err.kind == "malformed" and len(stub.requests) == 1
    assert said in str(err)


def test_an_error_in_the_middle_of_a_stream_is_reported():
    body = b'data: {"choices": [{"delta": {"content": "a"}}]}\n\ndata: {"error": {"message": "engine died"}}\n\n'
    with StubServer([malformed(body, "text/event-stream")]) as stub:
        err = failure(stub)
    assert err.kind == "http" and "engine died" in str(err)


def test_a_hang_up_is_a_connection_error_after_the_retries():
    sleeps = []
    with StubServer([hang_up(), hang_up()]) as stub:
        err = failure(stub, sleeps, retries=1)
    assert (err.kind, len(stub.requests), sleeps) == ("connection", 2, [1.0])
    assert "closed the connection without answering" in str(err)


def test_nothing_listening_is_a_connection_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sleeps = []
    endpoint = ChatEndpoint(WriterConfig(url=f"http://127.0.0.1:{port}/v1", model="m", timeout_s=0.3, retries=1),
                            sleep=sleeps.append)
    with pytest.raises(EndpointError) as info:
        endpoint.complete(MESSAGES)
    assert info.value.kind == "connection" and sleeps == [1.0]
    assert "cannot connect" in str(info.value)


# --- cancel ------------------------------------------------------------------------------------------

def test_cancel_stops_the_stream_between_chunks():
    deltas = []
    with StubServer([streamed("a" * 50, chunk=5)]) as stub:
        with pytest.raises(EndpointError) as info:
            client(stub).complete(MESSAGES, on_delta=deltas.append, cancel=lambda: len(deltas) >= 2)
    assert info.value.kind == "cancelled" and deltas == ["aaaaa", "aaaaa"]


def test_cancel_during_a_backoff_stops_before_the_retry():
    cancelled = []
    with StubServer([http_error(503, "busy"), plain("never")]) as stub:
        endpoint = ChatEndpoint(WriterConfig(url=stub.url, model="m", timeout_s=0.3, retries=2),
                                sleep=lambda s: cancelled.append(s))
        with pytest.raises(EndpointError) as info:
            endpoint.complete(MESSAGES, cancel=lambda: bool(cancelled))
    assert info.value.kind == "cancelled" and len(stub.requests) == 1


# --- the key -----------------------------------------------------------------------------------------

def test_authorization_carries_the_key_only_when_its_variable_is_set(monkeypatch):
    monkeypatch.delenv("MY_WRITER_KEY", raising=False)
    with StubServer([plain("a"), plain("b")]) as stub:
        client(stub, key_env="MY_WRITER_KEY").complete(MESSAGES)
        monkeypatch.setenv("MY_WRITER_KEY", KEY)
        client(stub, key_env="MY_WRITER_KEY").complete(MESSAGES)
    first, second = (r["headers"] for r in stub.requests)
    assert "Authorization" not in first
    assert second["Authorization"] == f"Bearer {KEY}"


def test_the_key_never_appears_in_errors_repr_or_public(monkeypatch):
    monkeypatch.setenv("STITCHCUDA_WRITER_KEY", KEY)
    echo = http_error(401, {"error": {"message": f"invalid key {KEY}"}})
    responses = [echo, malformed(KEY.encode()), truncated(KEY), slow(1.0), hang_up(), http_error(500, KEY)]
    with StubServer(responses) as stub:
        config = WriterConfig(url=stub.url, model="coder", timeout_s=0.3, retries=0)
        errors = []
        for _ in responses:
            with pytest.raises(EndpointError) as info:
                ChatEndpoint(config).complete(MESSAGES)
            errors.append(info.value)
    assert [e.kind for e in errors] == ["http", "malformed", "truncated", "timeout", "connection", "http"]
    assert "401 Unauthorized: invalid key ***" in str(errors[0])
    for text in [str(e) for e in errors] + [repr(e) for e in errors] + [repr(config), json.dumps(config.public())]:
        assert KEY not in text
    assert config.api_key() == KEY


def test_a_credential_typed_into_the_url_is_refused_and_never_shown():
    config = WriterConfig(url="https://user:hunter2@api.example.com/v1", model="m")
    assert "hunter2" not in repr(config) and "hunter2" not in json.dumps(config.public())
    with pytest.raises(WriterError) as info:
        config.validate()
    assert "hunter2" not in str(info.value) and "STITCHCUDA_WRITER_KEY" in str(info.value)


# --- config ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("url, remote", [
    ("http://localhost:8000/v1", False), ("http://127.0.0.1:11434/v1", False), ("http://127.4.5.6/v1", False),
    ("http://[::1]:8000/v1", False), ("http://LOCALHOST/v1", False), ("http://[::ffff:127.0.0.1]/v1", False),
    ("https://api.openai.com/v1", True), ("http://192.168.1.20:8000/v1", True), ("http://10.0.0.7/v1", True),
    ("http://gpu-box.lan:8000/v1", True), ("http://128.0.0.1/v1", True), ("http://[2001:db8::1]/v1", True)])
def test_is_remote_is_false_only_for_this_machine(url, remote):
    assert WriterConfig(url=url, model="m").is_remote() is remote


def test_host_and_public_say_where_without_the_path():
    config = WriterConfig(url="http://127.0.0.1:8000/v1", model="qwen", regions=["r1", "r3"])
    assert config.host() == "127.0.0.1:8000"
    assert WriterConfig(url="http://[::1]:9/v1", model="m").host() == "[::1]:9"
    public = config.public()
    assert public["host"] == "127.0.0.1:8000" and public["remote"] is False
    assert public["model"] == "qwen" and public["regions"] == ["r1", "r3"] and public["rounds"] == 3
    assert config.regions == ("r1", "r3")
    json.dumps(public)


@pytest.mark.parametrize("settings, said", [
    ({"url": "ftp://x"}, "must start with http:// or https://"),
    ({"url": ""}, "no endpoint URL given"),
    ({"url": "http:///v1"}, "has no host"),
    ({"url": "http://h/v1?key=1"}, "without ?query"),
    ({"model": " "}, "no model name"),
    ({"rounds": 0}, "rounds must be an integer >= 1, not 0"),
    ({"retries": -1}, "retries must be an integer >= 0"),
    ({"timeout_s": 0}, "timeout_s must be a positive number"),
    ({"region_token_cap": 0}, "region_token_cap must be an integer >= 1"),
    ({"key_env": "MY KEY"}, "is not an environment variable name")])
def test_validate_names_the_bad_setting(settings, said):
    config = WriterConfig(**{"url": "http://127.0.0.1:8000/v1", "model": "m", **settings})
    with pytest.raises(WriterError) as info:
        config.validate()
    assert said in str(info.value) and "\n" not in str(info.value)


def test_a_good_config_validates():
    config = WriterConfig(url="https://api.example.com/v1/", model="m", rounds=1, retries=0)
    assert config.validate() is config


# --- the budget --------------------------------------------------------------------------------------

def test_token_budget_caps_each_region_and_the_run():
    budget = TokenBudget(WriterConfig(url="http://127.0.0.1/v1", model="m", region_token_cap=1000,
                                      run_token_cap=1500))
    reply = Reply(text="k", prompt_tokens=400, completion_tokens=200, finish_reason="stop", seconds=1.0)
    budget.check("r1")
    budget.charge("r1", reply)
    budget.check("r1")
    budget.charge("r1", reply)
    assert (budget.used("r1"), budget.used("r2"), budget.total) == (1200, 0, 1200)
    with pytest.raises(EndpointError) as info:
        budget.check("r1")
    assert info.value.kind == "cap" and "region r1" in str(info.value) and "region_token_cap is 1000" in str(info.value)
    budget.check("r2")
    budget.charge("r2", reply)
    with pytest.raises(EndpointError) as info:
        budget.check("r3")
    assert info.value.kind == "cap" and "run_token_cap is 1500" in str(info.value) and "1800 tokens" in str(info.value)


def test_token_budget_charges_what_the_server_reports():
    with StubServer([streamed("x", usage={"prompt_tokens": 900, "completion_tokens": 150})]) as stub:
        config = WriterConfig(url=stub.url, model="m", timeout_s=0.3, region_token_cap=1000)
        budget = TokenBudget(config)
        budget.charge("r0", ChatEndpoint(config).complete(MESSAGES))
    with pytest.raises(EndpointError, match="region r0 has used 1050 tokens"):
        budget.check("r0")


# --- the stub as a process ---------------------------------------------------------------------------

def test_the_stub_runs_as_a_process_replaying_a_file(tmp_path):
    (tmp_path / "round1.md").write_text(KERNEL, encoding="utf-8")
    replay = tmp_path / "replay.json"
    replay.write_text(json.dumps([{"type": "http_error", "status": 503, "body": "warming up"},
                                  {"type": "streamed", "text_file": "round1.md", "chunk": 16, "finish": "stop"}]))
    port_file, log = tmp_path / "url", tmp_path / "requests.jsonl"
    stub = subprocess.Popen([sys.executable, str(Path(__file__).parent / "writer_stub.py"), "--replay", str(replay),
                             "--port-file", str(port_file), "--log", str(log)])
    try:
        deadline = time.monotonic() + 10
        while not port_file.exists():
            assert stub.poll() is None and time.monotonic() < deadline, "the stub did not start"
            time.sleep(0.02)
        url = port_file.read_text().strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        reply = ChatEndpoint(WriterConfig(url=url, model="m", timeout_s=2), sleep=lambda s: None).complete(MESSAGES)
        assert reply.text == KERNEL
    finally:
        stub.terminate()
        assert stub.wait(5) == 0
    requests = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["path"] for r in requests] == ["/v1/chat/completions"] * 2
    assert requests[1]["body"]["messages"] == MESSAGES
