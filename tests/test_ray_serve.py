"""Replicas on Ray Serve (packed_ss/serve/ray/): a local Ray cluster of this machine's 2 CPUs, two replicas of the
tiny model with one CPU each behind the engine-less ingress, spoken to with the real `openai` client. 32
concurrent requests, streamed and whole, completions and chat, greedy and seeded, spread over both replicas
(the `x-replica` header), each equal to what Engine.generate returns for it alone, counted in /metrics per
replica; then one replica's process is killed mid-stream: its streams end with an error event after a correct
prefix, the other replica's streams are exact, and the next requests succeed, all within a bound. Without a
cluster: the router's ranking, the options' checks, and the CLI's one line without Ray.
Marked `ray`: `pytest -m "not ray"` skips them."""
import asyncio
import os
import signal
import socket
import sys
import urllib.request
from types import SimpleNamespace

import pytest
import torch

import packed_ss

openai = pytest.importorskip("openai")
ray = pytest.importorskip("ray")
from ray import serve  # noqa: E402
from ray.serve._private.common import DeploymentHandleSource, DeploymentID  # noqa: E402
from ray.serve.request_router import ReplicaID  # noqa: E402

from packed_ss.serve.protocol import plain_chat  # noqa: E402
from packed_ss.serve.ray import APP_NAME, build_app  # noqa: E402
from packed_ss.serve.ray.routing import PrefixAwareRouter, block_keys  # noqa: E402

pytestmark = pytest.mark.ray

NAME = "default"
API_KEY = "sk-test"
SETTINGS = dict(schedule="packed", width=3, dtype="float32")       # the reference engine's, below
PROMPTS = ["def fibonacci(n):", "class Stack:\n    def push(self, item):", "import os\n\n\ndef main():",
           "# sort a list\ndef sort(xs):"]
SAMPLINGS = [dict(temperature=0.0), dict(temperature=1.0), dict(temperature=0.7, top_p=0.95)]
BOUND_S = 120                 # no phase may take longer: nothing hangs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(build_app(num_replicas=2, num_cpus=1, max_batch=16, max_waiting=48, api_key=API_KEY,
                        served_model_name=NAME, **SETTINGS), name=APP_NAME, route_prefix="/")
    path = packed_ss.default_model_path()
    reference = packed_ss.Engine(packed_ss.load_model(path, dtype=torch.float32), **{
        k: v for k, v in SETTINGS.items() if k != "dtype"})
    yield f"http://127.0.0.1:{port}", reference, packed_ss.load_tokenizer(path)
    serve.shutdown()
    ray.shutdown()


def job(i: int, max_tokens: int) -> dict:
    sampling = dict(SAMPLINGS[i % 3], **({"seed": 100 + i} if i % 3 else {}))
    return dict(chat=i % 4 == 3, stream=i % 2 == 0, prompt=PROMPTS[i % 4], max_tokens=max_tokens, **sampling)


def alone(reference, tok, j: dict) -> list[int]:
    text = plain_chat([{"role": "user", "content": j["prompt"]}]) if j["chat"] else j["prompt"]
    sampling = {k: v for k, v in j.items() if k not in ("chat", "stream", "prompt", "max_tokens")}
    return reference.generate(tok.encode(text).ids, max_new_tokens=j["max_tokens"], **sampling).tokens


async def call(aclient, j: dict, begun: asyncio.Event) -> dict:
    """One request: its replica, its text and token ids, or the error event that ended its stream after `text`.
    `begun` is set once it has text."""
    args = {k: v for k, v in j.items() if k not in ("chat", "prompt")}
    if j["chat"]:
        create = aclient.chat.completions.with_raw_response.create
        args["messages"] = [{"role": "user", "content": j["prompt"]}]
    else:
        create = aclient.completions.with_raw_response.create
        args["prompt"] = j["prompt"]
    raw = await create(model=NAME, **args)
    got = {"replica": raw.headers.get("x-replica"), "text": "", "ids": None, "error": None}
    body = raw.parse()
    if not j["stream"]:
        choice = body.choices[0]
        got.update(text=choice.message.content if j["chat"] else choice.text,
                   ids=body.model_extra["packed_ss"]["token_ids"])
        return got
    try:
        async for chunk in body:
            if chunk.choices:
                got["text"] += (chunk.choices[0].delta.content or "") if j["chat"] else chunk.choices[0].text
                if got["text"]:
                    begun.set()
                if chunk.choices[0].finish_reason:
                    got["ids"] = chunk.model_extra["packed_ss"]["token_ids"]
    except openai.APIError as err:
        got["error"] = err
    return got


async def requests(url: str, jobs: list[dict], kill: str | None = None) -> list[dict]:
    """The jobs all at once on a client of their own; with `kill`, that replica's process is killed (SIGKILL)
    once every stream has text."""
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0) as aclient:
        begun = [asyncio.Event() for _ in jobs]
        calls = asyncio.gather(*(call(aclient, j, b) for j, b in zip(jobs, begun)))
        if kill is not None:
            await asyncio.wait_for(asyncio.gather(*(b.wait() for b in begun)), BOUND_S)
            actor = ray.get_actor(kill, namespace="serve")
            os.kill(await actor.__ray_call__.remote(lambda replica: os.getpid()), signal.SIGKILL)
        return await asyncio.wait_for(calls, BOUND_S)


def scrape(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(urllib.request.Request(url + "/metrics", headers={
        "Authorization": f"Bearer {API_KEY}"})).read().decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


def test_replicas_serve_exact_text_and_survive_a_replica_killed_mid_stream(cluster):
    """One test in three phases, so that pytest-xdist cannot split it over two workers (two clusters on 2 CPUs).
    Every phase is bounded (BOUND_S): nothing hangs."""
    url, reference, tok = cluster

    # 32 concurrent requests, each equal to Engine.generate alone, spread over both replicas
    jobs = [job(i, 16 + 4 * (i % 8)) for i in range(32)]
    results = asyncio.run(requests(url, jobs))
    replicas = sorted({got["replica"] for got in results})
    assert len(replicas) == 2 and all(r.startswith("SERVE_REPLICA::") for r in replicas)
    for j, got in zip(jobs, results):
        want = alone(reference, tok, j)
        assert got["error"] is None and got["ids"] == want and got["text"] == tok.decode(want), j
    values = scrape(url)
    for replica in replicas:
        served = sum(got["replica"] == replica for got in results)
        assert values[f'packed_ss:request_success_total{{replica="{replica}"}}'] == served

    # one replica's process killed while every stream is under way: its streams end with an error event after
    # text that was right so far, the other replica's are whole and exact
    long_jobs = [dict(job(i, 400), stream=True, chat=False) for i in range(8)]
    dead = replicas[0]
    ended = asyncio.run(requests(url, long_jobs, kill=dead))
    assert {got["replica"] for got in ended} == set(replicas)
    for j, got in zip(long_jobs, ended):
        want = tok.decode(alone(reference, tok, j))
        if got["replica"] == dead:
            assert got["error"] is not None and "died" in str(got["error"])
            assert want.startswith(got["text"]) and len(got["text"]) < len(want)
        else:
            assert got["error"] is None and got["text"] == want

    # the next requests succeed, on the live replica or the one Ray started in the dead one's place
    after_jobs = [job(i, 24) for i in range(8)]
    for j, got in zip(after_jobs, asyncio.run(requests(url, after_jobs))):
        assert got["error"] is None and got["ids"] == alone(reference, tok, j) and got["replica"] != dead


class Replica(SimpleNamespace):
    """What the router reads of a replica."""


def router(**options) -> PrefixAwareRouter:
    r = PrefixAwareRouter(DeploymentID("engine", "app"), DeploymentHandleSource.UNKNOWN,
                          use_replica_queue_len_cache=True)
    r.initialize_state(**options)
    return r


def pending(tokens: list[int]):
    return SimpleNamespace(args=[SimpleNamespace(prompt_ids=tokens)],
                           routing_context=SimpleNamespace(should_backoff=False))


def test_router_prefers_the_longest_prefix_within_the_load_bound():
    """Two system prompts sharing a chat header: each request goes to the replica that served the longest head
    of its prompt (not the shared first block), unless that replica holds more than `imbalance` requests over
    the least loaded one; a replica that died is forgotten."""
    r = router(block=4, imbalance=2)
    a, b = (Replica(replica_id=ReplicaID(name, DeploymentID("engine", "app"))) for name in "ab")
    header, system_a, system_b = [1, 2, 3, 4], [5, 6, 7, 8] * 2, [9, 10, 11, 12] * 2
    r.on_request_routed(pending(header + system_a + [40, 41, 42, 43]), a.replica_id, None)
    r.on_request_routed(pending(header + system_b + [50, 51, 52, 53]), b.replica_id, None)

    def first(tokens):
        return asyncio.run(r.choose_replicas([a, b], pending(tokens)))[0][0]

    assert first(header + system_b + [60, 61, 62, 63]) is b and first(header + system_a + [70, 71]) is a
    r.replica_queue_len_cache.update(a.replica_id, 3)
    r.replica_queue_len_cache.update(b.replica_id, 1)
    assert first(header + system_a) is a                                    # 3 <= 1 + 2: the match wins
    r.replica_queue_len_cache.update(a.replica_id, 4)
    assert first(header + system_a) is b                                    # beyond the bound: the load wins
    r.on_replica_actor_died(a.replica_id)
    assert a.replica_id not in r.recent
    assert block_keys([1, 2, 3, 4, 5], 2) == block_keys([1, 2, 3, 4, 6], 2)  # whole blocks only
    with pytest.raises(ValueError, match="imbalance must be an integer >= 0"):
        router(imbalance=-1)


@pytest.mark.parametrize("options, named", [
    (dict(num_replicas=0), "num_replicas"), (dict(max_batch=0), "max_batch"), (dict(num_cpus=-1), "num_cpus"),
    (dict(widht=3), "widht"), (dict(width=0), r"width must be an integer \[1, 64\]"),
    (dict(num_replicas=2, autoscaling_config={"max_replicas": 2}), "num_replicas or autoscaling_config")])
def test_bad_options_are_refused_by_name(options, named):
    with pytest.raises(ValueError, match=named):
        build_app(**options)


def test_replicas_without_ray_say_how_to_install(monkeypatch, capsys):
    from packed_ss.serve import cli
    for name in [name for name in sys.modules if name.startswith("packed_ss.serve.ray")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "ray", None)
    assert cli.main(["--replicas", "2"]) == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "pip install -e '.[ray]'" in out[0]
