"""The OpenAI-compatible server (packed_ss/serve/), started on 127.0.0.1 at an ephemeral port and spoken to with
the real `openai` client: completions and chat, streamed and whole, stop strings, usage, seeds; every response
is what Engine.generate returns for the same prompt tokens and arguments, alone and under concurrent load;
clients that disconnect free their slots; bad input gets an OpenAI-style error naming the field while the
good requests around it stay exact."""
import asyncio
import json
import threading
import time
import urllib.error
import urllib.request

import pytest
import torch

import packed_ss

openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")
from packed_ss.serve.app import make_app  # noqa: E402
from packed_ss.serve.protocol import plain_chat  # noqa: E402

NAME = "default"
API_KEY = "sk-test"
PROMPTS = ["def fibonacci(n):", "class Stack:\n    def push(self, item):", "import os\n\n\ndef main():",
           "# sort a list\ndef sort(xs):"]


class Served:
    """The app on a uvicorn server in a thread of its own, at an ephemeral port."""

    def __init__(self, app):
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        for _ in range(500):
            if self.server.started:
                break
            time.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self):
        self.server.should_exit = True
        self.thread.join(timeout=30)


@pytest.fixture(scope="module")
def served():
    path = packed_ss.default_model_path()
    model = packed_ss.load_model(path, dtype=torch.float32)
    tok = packed_ss.load_tokenizer(path)
    engine = packed_ss.Engine(model, schedule="packed", width=3, max_batch=16)
    reference = packed_ss.Engine(model, schedule="packed", width=3)   # offline, its own runtime
    app = make_app(engine, tok, NAME, path, api_key=API_KEY, max_waiting=64)
    server = Served(app)
    yield server, reference, tok, app
    server.stop()


def client(server, **kw):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, **kw)


def offline(reference, tok, text, max_tokens, **sampling) -> list[int]:
    return reference.generate(tok.encode(text).ids, max_new_tokens=max_tokens, **sampling).tokens


SAMPLINGS = [dict(temperature=0.0), dict(temperature=1.0, seed=7), dict(temperature=0.7, top_p=0.95, seed=3)]


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["greedy", "T=1", "top-p"])
def test_completion_equals_generate(served, sampling):
    server, reference, tok, _ = served
    got = client(server).completions.create(model=NAME, prompt=PROMPTS[0], max_tokens=40, **sampling)
    want = offline(reference, tok, PROMPTS[0], 40, **sampling)
    extra = got.model_extra["packed_ss"]
    assert extra["token_ids"] == want and got.choices[0].text == tok.decode(want)
    assert got.usage.prompt_tokens == len(tok.encode(PROMPTS[0]).ids) and got.usage.completion_tokens == len(want)
    assert extra["model_calls"] > 0 and extra["tokens_per_call"] == pytest.approx(len(want) / extra["model_calls"])
    assert got.choices[0].finish_reason == ("length" if len(want) == 40 and want[-1] != 0 else "stop")


@pytest.mark.parametrize("sampling", SAMPLINGS[:2], ids=["greedy", "T=1"])
def test_streamed_chat_equals_generate(served, sampling):
    server, reference, tok, _ = served
    messages = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "a stack class"}]
    chunks = list(client(server).chat.completions.create(model=NAME, messages=messages, max_tokens=32, stream=True,
                                                         stream_options={"include_usage": True}, **sampling))
    want = offline(reference, tok, plain_chat(messages), 32, **sampling)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == tok.decode(want)
    final = next(c for c in chunks if c.choices and c.choices[0].finish_reason)
    assert final.model_extra["packed_ss"]["token_ids"] == want
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(want)


def test_stop_string_ends_the_text_before_it(served):
    """The stop string is found in the decoded text wherever the tokens split it; the text ends before it, and
    the streamed text equals the whole one."""
    server, reference, tok, app = served
    want = tok.decode(offline(reference, tok, PROMPTS[1], 60))
    stop = want[len(want) // 3: len(want) // 3 + 3]
    assert stop and stop in want
    whole = client(server).completions.create(model=NAME, prompt=PROMPTS[1], max_tokens=60, temperature=0, stop=stop)
    assert whole.choices[0].text == want[:want.index(stop)] and whole.choices[0].finish_reason == "stop"
    figures = whole.model_extra["packed_ss"]        # the engine's counts at the abort
    assert figures["model_calls"] > 0 and figures["tokens_per_call"] > 1 and figures["mean_acceptance_length"] > 1
    assert len(figures["accepted_per_position"]) == app.state.metrics.width and figures["accepted_per_position"][0] > 0
    streamed = client(server).completions.create(model=NAME, prompt=PROMPTS[1], max_tokens=60, temperature=0,
                                                 stop=[stop, "@@never@@"], stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == whole.choices[0].text


def test_models_health_and_api_key(served):
    server, _, _, _ = served
    assert [m.id for m in client(server).models.list()] == [NAME]
    assert json.load(urllib.request.urlopen(server.url + "/health")) == {"status": "ok"}
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).models.list()


def post(server, path: str, payload: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(server.url + path, data=payload, method="POST",
                                     headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request) as reply:
            return reply.status, json.load(reply)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)


BAD = [
    ("/v1/completions", b"{not json", 400, None),
    ("/v1/completions", json.dumps({"prompt": 5}).encode(), 400, "prompt"),
    ("/v1/completions", json.dumps({"prompt": "x", "max_tokens": -1}).encode(), 400, "max_tokens"),
    ("/v1/completions", json.dumps({"prompt": "x", "temperature": "hot"}).encode(), 400, "temperature"),
    ("/v1/completions", json.dumps({"prompt": "x", "top_p": 1.5}).encode(), 400, "top_p"),
    ("/v1/completions", json.dumps({"prompt": "x", "n": 2}).encode(), 400, "n"),
    ("/v1/completions", json.dumps({"prompt": "x", "model": "gpt-9"}).encode(), 404, "model"),
    ("/v1/completions", json.dumps({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}).encode(), 400, "stop"),
    ("/v1/completions", json.dumps({"prompt": "x", "max_tokens": 5000}).encode(), 400, "max_tokens"),
    ("/v1/completions", json.dumps({"prompt": [1, 99999]}).encode(), 400, "prompt"),
    ("/v1/chat/completions", json.dumps({"messages": [{"role": "user"}]}).encode(), 400, "messages"),
]


def test_bad_input_is_refused_by_field_while_good_requests_stay_exact(served):
    server, reference, tok, _ = served
    want = offline(reference, tok, PROMPTS[2], 24, temperature=1.0, seed=11)
    for path, payload, status, param in BAD:
        code, body = post(server, path, payload)
        assert code == status and body["error"]["param"] == param and body["error"]["message"], (payload, body)
        got = client(server).completions.create(model=NAME, prompt=PROMPTS[2], max_tokens=24, temperature=1.0,
                                                seed=11)
        assert got.model_extra["packed_ss"]["token_ids"] == want


def test_concurrent_streams_and_disconnects(served):
    """32 concurrent streamed requests of different lengths and sampling settings: each equals its offline
    result, nothing lost or duplicated; then 8 clients hang up mid-stream while 8 others continue: the survivors
    are exact, and /metrics shows the aborted requests and no request left running."""
    server, reference, tok, app = served
    jobs = [dict(prompt=PROMPTS[i % 4], max_tokens=16 + 4 * (i % 8), **SAMPLINGS[i % 3]) for i in range(32)]
    for i, job in enumerate(jobs):
        if "seed" in job:
            job["seed"] = 100 + i
    want = [offline(reference, tok, j["prompt"], j["max_tokens"], **{k: v for k, v in j.items()
                                                                     if k not in ("prompt", "max_tokens")}) for j in jobs]

    async def one(aclient, job, hang_up_after=None):
        stream = await aclient.completions.create(model=NAME, stream=True, **job)
        text, ids, seen = "", None, 0
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].text
                if chunk.choices[0].finish_reason:
                    ids = chunk.model_extra["packed_ss"]["token_ids"]
            seen += 1
            if hang_up_after is not None and seen >= hang_up_after:
                await stream.close()
                return None
        return text, ids

    async def run(batch, hang_ups):
        aclient = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0)
        try:
            return await asyncio.gather(*(one(aclient, job, h) for job, h in zip(batch, hang_ups)))
        finally:
            await aclient.close()

    results = asyncio.run(run(jobs, [None] * 32))
    for (text, ids), w in zip(results, want):
        assert ids == w and text == tok.decode(w)
    before = app.state.metrics.values["packed_ss:request_aborted"]
    long_jobs = [dict(j, max_tokens=200) for j in jobs[:16]]
    survivors = asyncio.run(run(long_jobs, [2 if i % 2 else None for i in range(16)]))
    for i, got in enumerate(survivors):
        if i % 2 == 0:
            w = offline(reference, tok, long_jobs[i]["prompt"], 200, **{k: v for k, v in long_jobs[i].items()
                                                                      if k not in ("prompt", "max_tokens")})
            assert got[1] == w
    for _ in range(200):
        metrics = urllib.request.urlopen(urllib.request.Request(server.url + "/metrics", headers={
            "Authorization": f"Bearer {API_KEY}"})).read().decode()
        if "packed_ss:num_requests_running 0" in metrics:
            break
        time.sleep(0.05)
    assert "packed_ss:num_requests_running 0" in metrics
    assert app.state.metrics.values["packed_ss:request_aborted"] - before == 8
    values = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
              if line and not line.startswith("#")}
    per_pos = [v for k, v in values.items() if k.startswith("packed_ss:spec_decode_num_accepted_tokens_per_pos")]
    assert len(per_pos) == app.state.metrics.width and per_pos[0] > 0
    assert sum(per_pos) == values["packed_ss:spec_decode_num_accepted_tokens_total"]


def test_a_shared_prompt_head_is_cached_and_counted(served):
    """Two completions of one long prompt head: the second's prefill reads the first's published pages, which its
    usage reports (OpenAI's prompt_tokens_details.cached_tokens), with the same text as offline; /metrics counts
    the prefix cache's queries and hits, the pool's usage and the time to first token."""
    server, reference, tok, _ = served
    head = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(12))
    first = client(server).completions.create(model=NAME, prompt=head + "def g(", max_tokens=8, temperature=0.0)
    second = client(server).completions.create(model=NAME, prompt=head + "class C:", max_tokens=8, temperature=0.0)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached <= len(tok.encode(head).ids) and cached % 16 == 0
    assert second.choices[0].text == tok.decode(offline(reference, tok, head + "class C:", 8))
    metrics = urllib.request.urlopen(urllib.request.Request(server.url + "/metrics", headers={
        "Authorization": f"Bearer {API_KEY}"})).read().decode()
    values = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
              if line and not line.startswith("#")}
    assert values["packed_ss:prefix_cache_hits_total"] >= cached
    assert values["packed_ss:prefix_cache_queries_total"] >= values["packed_ss:prefix_cache_hits_total"]
    assert 0 <= values["packed_ss:kv_cache_usage_perc"] < 1 and "packed_ss:num_preemptions_total" in values
    assert values['packed_ss:time_to_first_token_seconds_bucket{le="+Inf"}'] == values[
        "packed_ss:time_to_first_token_seconds_count"] > 0
