"""API keys on `specledger serve` (server/auth.py), end to end with the embedded model on 127.0.0.1:
raw httpx, the official openai client, and the harness's HTTP backend with api_key_env."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from specledger.bench.backends.openai_http import OpenAIBackend, Unauthorized
from specledger.records.config import BenchConfig, parse_run_config
from specledger.records.results import load_run, read_requests
from specledger.bench.runner import Runner, run_benchmark
from specledger.decoding.factory import make_strategy
from specledger.errors import BadInput, SpecLedgerError
from specledger.server.app import create_app
from tests.support.server_thread import ServerThread
from specledger.server.auth import ENV_VAR, collect_keys, exposure_warning, key_matches
from tests.support.fake_openai_server import FakeOpenAIServer, FakeSettings
from tests.support.fake_backend import before_request

KEYS = ["key-one", "key-two"]
CHAT = {"model": "smollm2-135m", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 3,
        "temperature": 0}


@pytest.fixture(scope="module")
def keyed(smollm):
    with ServerThread(create_app(smollm, make_strategy("ar", target=smollm), api_keys=KEYS)) as srv:
        yield srv


@pytest.fixture(scope="module")
def closed_metrics(smollm):
    app = create_app(smollm, make_strategy("ar", target=smollm), api_keys=KEYS[:1], metrics_require_key=True)
    with ServerThread(app) as srv:
        yield srv


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def assert_401(r: httpx.Response, code: str) -> None:
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and err["code"] == code and err["param"] is None
    assert not any(k in err["message"] for k in KEYS)


def test_v1_without_or_with_a_wrong_key_is_401(keyed):
    for path in ("/v1/models", "/v1/anything"):
        assert_401(httpx.get(keyed.url + path), "missing_api_key")
    assert_401(httpx.post(keyed.url + "/v1/chat/completions", json=CHAT), "missing_api_key")
    assert_401(httpx.post(keyed.url + "/v1/chat/completions", json=CHAT, headers=bearer("key-three")),
               "invalid_api_key")
    assert_401(httpx.post(keyed.url + "/v1/completions", content=b"not json", headers=bearer("key-on")),
               "invalid_api_key")  # refused before the body is even parsed
    assert_401(httpx.get(keyed.url + "/v1/models", headers={"Authorization": "Basic key-one"}), "invalid_api_key")


def test_any_configured_key_opens_v1_and_health_and_metrics_stay_open(keyed):
    for key in KEYS:
        r = httpx.get(keyed.url + "/v1/models", headers=bearer(key))
        assert r.status_code == 200 and r.json()["data"][0]["id"] == "smollm2-135m"
    r = httpx.post(keyed.url + "/v1/chat/completions", json=CHAT, headers=bearer(KEYS[1]), timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    assert httpx.get(keyed.url + "/health").status_code == 200
    metrics = httpx.get(keyed.url + "/metrics")
    assert metrics.status_code == 200
    assert 'specledger:requests_total{endpoint="/v1/chat/completions",status="401"}' in metrics.text


def test_metrics_closed_needs_the_key(closed_metrics):
    assert_401(httpx.get(closed_metrics.url + "/metrics"), "missing_api_key")
    assert_401(httpx.get(closed_metrics.url + "/metrics", headers=bearer(KEYS[1])), "invalid_api_key")
    r = httpx.get(closed_metrics.url + "/metrics", headers=bearer(KEYS[0]))
    assert r.status_code == 200 and "specledger:requests_total" in r.text
    assert httpx.get(closed_metrics.url + "/health").status_code == 200


def test_streaming_with_key(keyed):
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", keyed.url + "/v1/chat/completions", json=body, headers=bearer(KEYS[0]),
                      timeout=60) as r:
        assert r.status_code == 200
        lines = [ln for ln in r.iter_lines() if ln.startswith("data:")]
    assert lines[-1] == "data: [DONE]"
    assert json.loads(lines[-2][5:])["usage"]["completion_tokens"] == 3
    with httpx.stream("POST", keyed.url + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 401


def test_official_openai_client_with_api_key(keyed):
    client = openai.OpenAI(base_url=keyed.url + "/v1", api_key=KEYS[0], max_retries=0, timeout=60)
    out = client.chat.completions.create(model="smollm2-135m", messages=CHAT["messages"], max_tokens=3,
                                         temperature=0)
    assert out.usage.completion_tokens == 3 and out.choices[0].message.content
    stream = client.completions.create(model="smollm2-135m", prompt="The capital of France is", max_tokens=3,
                                       temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in stream if c.choices)
    wrong = openai.OpenAI(base_url=keyed.url + "/v1", api_key="nope", max_retries=0, timeout=60)
    with pytest.raises(openai.AuthenticationError) as err:
        wrong.models.list()
    assert err.value.status_code == 401 and err.value.code == "invalid_api_key"


def bench_config(url: str, wl: Path, env: str | None, **openai_extra) -> dict:
    o = {"base_url": url, "connect_timeout_s": 2, "timeout_s": 60, **openai_extra}
    if env:
        o["api_key_env"] = env
    return {"configs": [{"name": "srv", "backend": "openai", "model": "smollm2-135m", "max_tokens": 3,
                         "openai": o}],
            "workload": {"spec": str(wl)}, "load": {"warmup": 0}, "bootstrap": 0}


def workload(tmp_path: Path, n: int = 2) -> Path:
    wl = tmp_path / "w.jsonl"
    wl.write_text("".join(json.dumps({"question_id": i, "category": "qa", "turns": [f"Say {i}."]}) + "\n"
                          for i in range(n)))
    return wl


def test_harness_sends_the_key_from_api_key_env(keyed, tmp_path, monkeypatch):
    wl = workload(tmp_path)
    monkeypatch.setenv("SRV_KEY", KEYS[1])
    run, path = run_benchmark(parse_run_config(bench_config(keyed.url, wl, "SRV_KEY")), run_dir=tmp_path / "ok",
                              show_progress=False)
    assert run.status == "complete" and all(r.status == "ok" for r in read_requests(path))

    monkeypatch.setenv("SRV_KEY", "stale-key")
    with pytest.raises(SpecLedgerError, match=r"HTTP 401 .*environment variable SRV_KEY \(api_key_env\) was refused"):
        run_benchmark(parse_run_config(bench_config(keyed.url, wl, "SRV_KEY")), run_dir=tmp_path / "bad",
                      show_progress=False)
    with pytest.raises(SpecLedgerError, match=r"wants an API key; .*api_key_env"):
        run_benchmark(parse_run_config(bench_config(keyed.url, wl, None)), run_dir=tmp_path / "none",
                      show_progress=False)
    assert load_run(tmp_path / "none").status == "failed"


def test_a_401_mid_run_stops_the_run_and_keeps_what_was_measured(tmp_path, monkeypatch):
    """The key is revoked after two requests: the third is refused, the run stops with one line."""
    monkeypatch.setenv("FAKE_KEY", "k")
    with FakeOpenAIServer(FakeSettings(api_key="k")) as srv:
        def rotate() -> None:
            srv.settings.api_key = "rotated"

        cfg = parse_run_config(bench_config(srv.base_url, workload(tmp_path, 5), "FAKE_KEY", retries=3))
        with pytest.raises(SpecLedgerError, match="environment variable FAKE_KEY") as err:
            Runner(cfg, tmp_path / "r", show_progress=False, backend_factory=before_request(3, rotate)).run()
        assert "\n" not in str(err.value)
        assert srv.stats.unauthorized == 1  # not retried
    recs = read_requests(tmp_path / "r")
    assert len(recs) == 2 and all(r.status == "ok" for r in recs)
    run = load_run(tmp_path / "r")
    assert run.status == "failed" and "FAKE_KEY" in run.notes[-1]


def test_a_401_while_waiting_for_the_server_is_unauthorized_before_any_request(monkeypatch):
    """The readiness wait itself stops on a 401 (not "not up yet", not "cannot reach"): the one probe refused,
    no completion sent, and the error names the status and the key's variable."""
    monkeypatch.setenv("FAKE_KEY", "stale")
    with FakeOpenAIServer(FakeSettings(api_key="k")) as srv:
        bc = BenchConfig(name="srv", backend="openai", model="fake-model", max_tokens=3,
                         openai={"base_url": srv.base_url, "connect_timeout_s": 5, "api_key_env": "FAKE_KEY",
                                 "scrape_metrics": False})
        b = OpenAIBackend(bc)

        async def start() -> None:
            try:
                await b.start()
            finally:
                await b.close()

        t0 = time.monotonic()
        with pytest.raises(Unauthorized, match=r"answered HTTP 401 \(Invalid API key\): the key in the environment "
                                               r"variable FAKE_KEY \(api_key_env\) was refused"):
            asyncio.run(start())
        assert time.monotonic() - t0 < 4  # at once, not after connect_timeout_s of polling
        assert srv.stats.unauthorized == 1 and srv.stats.requests == 0


def test_keys_from_flags_file_and_environment(tmp_path):
    f = tmp_path / "keys.txt"
    f.write_text("# team keys\nfile-key-1\n\n  file-key-2  \n")
    assert collect_keys(["flag-key"], f, {ENV_VAR: "env-key"}) == ["flag-key", "file-key-1", "file-key-2", "env-key"]
    assert collect_keys([], None, {}) == []
    with pytest.raises(BadInput, match="no key in it"):
        collect_keys([], _write(tmp_path / "empty.txt", "# nothing\n"), {})
    with pytest.raises(BadInput, match="cannot read it"):
        collect_keys([], tmp_path / "missing.txt", {})
    with pytest.raises(BadInput, match="--api-key is empty"):
        collect_keys([" "], None, {})
    assert key_matches(b"Bearer file-key-2", [b"file-key-1", b"file-key-2"])
    assert key_matches(b"bearer  file-key-1 ", [b"file-key-1"])
    assert not key_matches(b"Bearer file-key", [b"file-key-1"])
    assert not key_matches(None, [b"file-key-1"])


def _write(p: Path, text: str) -> Path:
    p.write_text(text)
    return p


def test_warning_when_listening_beyond_this_machine_without_a_key():
    for host in ("0.0.0.0", "::", "192.168.1.20", "myhost.example"):
        w = exposure_warning(host, [])
        assert w is not None and w.startswith("warning: listening on") and "\n" not in w and ENV_VAR in w
    for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        assert exposure_warning(host, []) is None
    assert exposure_warning("0.0.0.0", ["k"]) is None


def test_serve_rejects_closed_metrics_without_a_key_before_loading():
    r = subprocess.run([sys.executable, "-m", "specledger.cli", "serve", "--metrics-require-key", "--port", "0"],
                       capture_output=True, text=True, timeout=120, env={**os.environ, ENV_VAR: ""}, check=False)
    assert r.returncode == 2 and "--metrics-require-key needs a key" in r.stderr


def test_lone_surrogate_and_undecodable_body_are_400_naming_the_field(keyed):
    h = {**bearer(KEYS[0]), "Content-Type": "application/json"}
    raw = b'{"messages": [{"role": "user", "content": "bad \\ud800 text"}], "max_tokens": 2}'
    r = httpx.post(keyed.url + "/v1/chat/completions", content=raw, headers=h)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content"
    assert "lone surrogate" in r.json()["error"]["message"]
    raw = b'{"prompt": "x\\udfff", "max_tokens": 2}'
    r = httpx.post(keyed.url + "/v1/completions", content=raw, headers=h)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    raw = b'{"prompt": "x", "stop": ["\\ud800"], "max_tokens": 2}'
    r = httpx.post(keyed.url + "/v1/completions", content=raw, headers=h)
    assert r.status_code == 400 and r.json()["error"]["param"] == "stop"
    raw = b'{"messages": [{"role": "user", "content": "caf\xe9 \xff"}]}'  # not UTF-8
    r = httpx.post(keyed.url + "/v1/chat/completions", content=raw, headers=h)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.slow
def test_cli_serve_with_keys_from_a_file_and_the_environment(tmp_path):
    """`specledger serve` as a user runs it: keys from --api-key-file and SPECLEDGER_API_KEY, none logged."""
    import socket
    import time

    keys = tmp_path / "keys.txt"
    keys.write_text("file-secret-1\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, ENV_VAR: "env-secret-2"}
    p = subprocess.Popen([sys.executable, "-m", "specledger.cli", "serve", "--port", str(port), "--api-key-file",
                          str(keys), "--max-seq-len", "512"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            assert p.poll() is None, p.stdout.read()
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.5)
        assert httpx.get(url + "/v1/models").status_code == 401
        for key in ("file-secret-1", "env-secret-2"):
            assert httpx.get(url + "/v1/models", headers=bearer(key)).status_code == 200
        client = openai.OpenAI(base_url=url + "/v1", api_key="env-secret-2", max_retries=0, timeout=60)
        out = client.chat.completions.create(model="smollm2-135m", messages=CHAT["messages"], max_tokens=2)
        assert out.usage.completion_tokens == 2
        assert httpx.get(url + "/metrics").status_code == 200
    finally:
        p.terminate()
        log, _ = p.communicate(timeout=60)
    assert "2 API keys accepted" in log and "warning:" not in log
    assert "secret" not in log


def test_bench_api_key_env_flag_reaches_the_configuration():
    from specledger.cli.bench import build_config

    cfg = build_config(None, strategies=["ar"], backend="openai", model="m", dtype="fp32", quant="none",
                       group_size=32, params=[], max_tokens=4, temperature=0.0, seed=0,
                       base_url="http://127.0.0.1:9", api="chat", tokenizer=None, retries=None, timeout=None,
                       connect_timeout=None, overrides={}, api_key_env="MY_SERVER_KEY")
    assert cfg.configs[0].openai.api_key_env == "MY_SERVER_KEY"
