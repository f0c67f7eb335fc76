"""speculators 0.9's own data-generation clients against `hsx serve`, launched the way
speculators' scripts/launch_vllm.py launches vLLM (underscore flag spellings, front-end
flags hsx has no use for):

- prepare-data's render client (`render_client.render_conversation`: POST
  /v1/chat/completions/render with truncate_prompt_tokens/truncation_side) and the loss mask
  it derives from the boundary between two renders;
- regenerate-responses' conversation loop (`regenerate_conversation`, posting with its own
  `_post_chat`): return_token_ids read from the top-level prompt_token_ids and
  choices[0].token_ids, each answer's text fed back into the next turn;
- data generation's chat path (`vllm_client.generate_hidden_states` with messages).

The modules are loaded from the installed package's files: the package itself imports torch
(CI installs it with --no-deps). Their CLIs (prepare-data, regenerate-responses) also import
torch and datasets at the top, so they are driven through these functions. Also here: vLLM's
skip_special_tokens (text without special tokens by default) against the tokenizers library,
/tokenize with messages and /v1/completions/render."""
import asyncio
import importlib.util
import json
import subprocess
import sys
import types

import openai
import pytest

from conftest import HSX, LAYERS, extraction_configs, free_port, read_safetensors, text_model, wait_for_server
from test_server_requests import post

tokenizers = pytest.importorskip("tokenizers")
pytest.importorskip("httpx")  # render_client's HTTP client

TEMPLATE = ("{{ bos_token }}{% for message in messages %}"
            "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] | trim + '<|im_end|>\\n' }}"
            "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi to the world."}]
CONVERSATION = MESSAGES + [{"role": "assistant", "content": "Hi, world."},
                           {"role": "user", "content": "And again?"}, {"role": "assistant", "content": "Hi again."}]
MODEL_NAME = "qwen3-fixture"


def special_ids(tokenizer_json):
    """The fixture's special tokens: every byte-level vocabulary token of the model's 3000
    ids that starts with a space ('Ġ'), marked as a special added token. Raw text never holds
    'Ġ', so prompts tokenize as before, while a dummy model generates such tokens often."""
    vocab = tokenizer_json["model"]["vocab"]
    return sorted(i for t, i in vocab.items() if t.startswith("Ġ") and 256 <= i < 3000)


@pytest.fixture(scope="module")
def pipeline_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("speculators")
    model = text_model(tmp, bos=True, files={
        "tokenizer_config.json": json.dumps({"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}),
        "chat_template.jinja": TEMPLATE})
    document = json.loads((model / "tokenizer.json").read_text())
    vocab = document["model"]["vocab"]
    ids = special_ids(document)
    by_id = {i: t for t, i in vocab.items()}
    document["added_tokens"] += [{"id": i, "content": by_id[i], "single_word": False, "lstrip": False,
                                  "rstrip": False, "normalized": False, "special": True} for i in ids]
    (model / "tokenizer.json").write_text(json.dumps(document))
    storage = tmp / "hidden_states"
    spec, kv = extraction_configs(storage, LAYERS)
    port = free_port()
    log_path = tmp / "server.log"
    log = open(log_path, "w")
    # As launch_vllm.py writes the command: underscore spellings and its front-end defaults.
    proc = subprocess.Popen(
        [HSX, "serve", str(model), "--speculative_config", json.dumps(spec), "--kv_transfer_config", json.dumps(kv),
         "--api-server-count", "4", "--renderer-num-workers", "2", "--served_model_name", MODEL_NAME,
         "--load_format=dummy", "--port", str(port), "--disable-log-requests"],
        stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_for_server(url, proc, log_path)
    server = types.SimpleNamespace(url=url, model_dir=model, log_path=log_path, special=ids,
                                   tokenizer=tokenizers.Tokenizer.from_file(str(model / "tokenizer.json")))
    yield server
    proc.terminate()
    proc.wait(timeout=30)
    log.close()


def test_launch_vllm_flags_are_accepted(pipeline_server):
    log = pipeline_server.log_path.read_text()
    for flag in ("--api-server-count", "--renderer-num-workers", "--disable-log-requests"):
        assert f"ignoring {flag}" in log, log
    assert "hidden states to" in log, log  # --kv_transfer_config took effect


def hf_chat_ids(server, messages, add_generation_prompt):
    """transformers' apply_chat_template(tokenize=True): the ids vLLM would render."""
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(server.model_dir / "tokenizer.json"),
                                                     bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    tokenizer.chat_template = TEMPLATE
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def load_speculators(relative, name):
    """A module of the installed speculators package, loaded from its file with the package's
    own __init__ (which imports torch) left out; modules it needs that only its other code
    paths use (datasets, for the CLI's dataset loading) stand in as empty placeholders."""
    package_dir = importlib.util.find_spec("speculators").submodule_search_locations[0]
    saved = dict(sys.modules)
    try:
        for package in ("speculators", "speculators.data_generation", "speculators.cli"):
            if package not in sys.modules:
                stub = types.ModuleType(package)
                stub.__path__ = [package_dir + package[len("speculators"):].replace(".", "/")]
                sys.modules[package] = stub
        if importlib.util.find_spec("datasets") is None:
            placeholder = types.ModuleType("datasets")
            placeholder.load_dataset = None
            sys.modules["datasets"] = placeholder
        spec = importlib.util.spec_from_file_location(name, f"{package_dir}/{relative}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module
    finally:
        sys.modules.clear()
        sys.modules.update(saved)


# ---------------------------------------------------------------------------- prepare-data


def test_prepare_data_render_client_and_boundary_mask(pipeline_server):
    """render_conversation as prepare-data calls it (truncate_prompt_tokens, right side), and
    the boundary rows it derives: the generation-prompt render of each assistant turn's
    context is a prefix of the full render, and the tokens past it are the turn's."""
    render = load_speculators("data_generation/render_client.py", "speculators_render_client")
    url = pipeline_server.url
    max_length = 200
    for j in (2, 4):  # the assistant turns
        prompt_ids = render.render_conversation(url, CONVERSATION[:j], add_generation_prompt=True,
                                                truncate_prompt_tokens=max_length, truncation_side="right")
        full_ids = render.render_conversation(url, CONVERSATION[:j + 1], add_generation_prompt=False,
                                              truncate_prompt_tokens=max_length, truncation_side="right")
        assert prompt_ids == hf_chat_ids(pipeline_server, CONVERSATION[:j], True)
        assert full_ids == hf_chat_ids(pipeline_server, CONVERSATION[:j + 1], False)
        assert full_ids[:len(prompt_ids)] == prompt_ids  # the boundary prepare-data masks at
        supervised = pipeline_server.tokenizer.decode(full_ids[len(prompt_ids):], skip_special_tokens=False)
        assert supervised == CONVERSATION[j]["content"] + "<|im_end|>\n"
    # Truncation as vLLM applies it: right keeps the first tokens, left (the default) the last.
    full = hf_chat_ids(pipeline_server, CONVERSATION, False)
    assert render.render_conversation(url, CONVERSATION, add_generation_prompt=False, truncate_prompt_tokens=10,
                                      truncation_side="right") == full[:10]
    assert render.render_conversation(url, CONVERSATION, add_generation_prompt=False,
                                      truncate_prompt_tokens=10) == full[-10:]
    # A request the template cannot render is the client's fault: 400, not retried.
    with pytest.raises(Exception, match="400"):
        render.render_conversation(url, [{"role": 5, "content": "x"}], add_generation_prompt=True, max_retries=0)


def test_chat_render_answers_vllms_generate_request(pipeline_server):
    status, body = post(pipeline_server.url + "/v1/chat/completions/render",
                        {"messages": MESSAGES, "return_loss_mask": True, "max_tokens": 5, "temperature": 0.5})
    assert status == 200, body
    assert body["token_ids"] == hf_chat_ids(pipeline_server, MESSAGES, True)
    assert body["loss_mask"] is None  # the template has no {% generation %} tags
    assert body["sampling_params"]["max_tokens"] == 5 and body["sampling_params"]["temperature"] == 0.5
    assert body["request_id"] and body["model"] == MODEL_NAME
    status, err = post(pipeline_server.url + "/v1/chat/completions/render",
                       {"messages": MESSAGES, "truncate_prompt_tokens": 100000})
    assert status == 400 and err["error"]["param"] == "truncate_prompt_tokens", err
    status, err = post(pipeline_server.url + "/v1/chat/completions/render",
                       {"messages": MESSAGES, "truncation_side": "middle"})
    assert status == 400 and err["error"]["param"] == "truncation_side", err


def test_completions_render_and_tokenize_messages(pipeline_server):
    url = pipeline_server.url
    tok = pipeline_server.tokenizer
    status, body = post(url + "/v1/completions/render", {"prompt": ["Hello world", [5, 6, 7]]})
    assert status == 200, body
    assert [b["token_ids"] for b in body] == [tok.encode("Hello world").ids, [5, 6, 7]]
    status, body = post(url + "/v1/completions/render",
                        {"prompt": "Hello world, hello again", "truncate_prompt_tokens": 2, "truncation_side": "right"})
    assert status == 200 and body[0]["token_ids"] == tok.encode("Hello world, hello again").ids[:2], body
    # /tokenize with messages, as vLLM's tokenize endpoint takes them.
    status, body = post(url + "/tokenize", {"messages": MESSAGES})
    assert status == 200, body
    assert body["tokens"] == hf_chat_ids(pipeline_server, MESSAGES, True) and body["count"] == len(body["tokens"])
    status, body = post(url + "/tokenize", {"messages": CONVERSATION, "add_generation_prompt": False})
    assert status == 200 and body["tokens"] == hf_chat_ids(pipeline_server, CONVERSATION, False), body
    status, body = post(url + "/tokenize", {"prompt": "Hello world"})
    assert status == 200 and body["tokens"] == tok.encode("Hello world").ids, body


# ---------------------------------------------------------------------------- regenerate-responses


def test_regenerate_responses_conversation_loop(pipeline_server):
    """regenerate_conversation with speculators' own _post_chat (aiohttp): one boundary row
    per generation, prompt_token_ids and token_ids read where vLLM puts them, and each answer
    fed back as the next turn's history."""
    aiohttp = pytest.importorskip("aiohttp")
    regen = load_speculators("cli/regenerate_responses.py", "speculators_regenerate_responses")
    endpoint = pipeline_server.url + "/v1/chat/completions"
    # Dummy weights: stop on any of the fixture's special tokens (about one token in three).
    sampling = {"temperature": 1.0, "seed": 11, "stop_token_ids": pipeline_server.special}
    item = {"primary_id": "conv0", "idx": 0, "turns": [
        {"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi."},
        {"role": "user", "content": "Once more."}]}
    samples = []

    async def run():
        async with aiohttp.ClientSession() as session:
            async def post_fn(payload):
                return await regen._post_chat(session, endpoint, payload, max_retries=1)
            return await regen.regenerate_conversation(
                post_fn, item, model=MODEL_NAME, max_tokens=120, endpoint=endpoint, sampling_params=sampling,
                samples=samples, detokenize=lambda ids: pipeline_server.tokenizer.decode(ids, skip_special_tokens=False))

    truncated = asyncio.run(run())
    assert not truncated and len(samples) == 2
    history = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi."}]
    for k, sample in enumerate(samples):
        prompt_len = sample["loss_mask"].index(1)
        assert sample["input_ids"][:prompt_len] == hf_chat_ids(pipeline_server, history, True)
        completion = sample["input_ids"][prompt_len:]
        assert all(m == 1 for m in sample["loss_mask"][prompt_len:]) and completion
        # The text fed back is the completion's, less its stop token (a special token).
        assert completion[-1] in pipeline_server.special
        content = pipeline_server.tokenizer.decode(completion, skip_special_tokens=True)
        history += [{"role": "assistant", "content": content}]
        if k == 0:
            history += [{"role": "user", "content": "Once more."}]


# ---------------------------------------------------------------------------- data generation (chat)


def test_generate_hidden_states_with_messages(pipeline_server):
    """vllm_client.generate_hidden_states' chat path: prompt_token_ids at the response's top
    level must equal the stored input_ids; the file holds them."""
    vllm_client = load_speculators("data_generation/vllm_client.py", "speculators_vllm_client_chat")
    client = openai.Client(base_url=pipeline_server.url + "/v1", api_key="unused", max_retries=0)
    input_ids = hf_chat_ids(pipeline_server, CONVERSATION, False)
    path, params = vllm_client.generate_hidden_states(client, MODEL_NAME, {"input_ids": input_ids,
                                                                           "messages": CONVERSATION})
    vllm_client.wait_for_lock(path + ".lock")
    assert read_safetensors(path)["token_ids"].tolist() == input_ids


def test_chat_stream_sends_prompt_token_ids_first(pipeline_server):
    client = openai.Client(base_url=pipeline_server.url + "/v1", api_key="unused", max_retries=0)
    chunks = list(client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=4, temperature=0,
                                                 stream=True, extra_body={"return_token_ids": True}))
    assert chunks[0].model_extra["prompt_token_ids"] == hf_chat_ids(pipeline_server, MESSAGES, True)
    assert all("prompt_token_ids" not in (c.model_extra or {}) for c in chunks[1:])
    whole = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=4, temperature=0,
                                           extra_body={"return_token_ids": True})
    streamed = [t for c in chunks if c.choices for t in (c.choices[0].model_extra.get("token_ids") or [])]
    assert streamed == whole.choices[0].model_extra["token_ids"]
    assert "prompt_token_ids" not in whole.choices[0].model_extra


# ---------------------------------------------------------------------------- skip_special_tokens


@pytest.mark.parametrize("chat", [False, True])
def test_text_skips_special_tokens_as_vllm(pipeline_server, chat):
    """The answer's text is tokenizers' decode(ids, skip_special_tokens=True) by default
    (vLLM's default) and decode(ids) with skip_special_tokens: false; streamed alike."""
    client = openai.Client(base_url=pipeline_server.url + "/v1", api_key="unused", max_retries=0)
    tok = pipeline_server.tokenizer
    for skip in (None, True, False):
        extra = {"return_token_ids": True, "ignore_eos": True, "spaces_between_special_tokens": False}
        if skip is not None:
            extra["skip_special_tokens"] = skip
        args = dict(model=MODEL_NAME, max_tokens=24, temperature=1.0, seed=3, extra_body=extra)
        if chat:
            whole = client.chat.completions.create(messages=MESSAGES, **args)
            stream = client.chat.completions.create(messages=MESSAGES, stream=True, **args)
            text = whole.choices[0].message.content
            streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        else:
            whole = client.completions.create(prompt=[11, 12, 13, 14], **args)
            stream = client.completions.create(prompt=[11, 12, 13, 14], stream=True, **args)
            text = whole.choices[0].text
            streamed = "".join(c.choices[0].text for c in stream if c.choices)
        ids = whole.choices[0].model_extra["token_ids"]
        assert any(i in pipeline_server.special for i in ids), ids  # the case under test
        assert text == tok.decode(ids, skip_special_tokens=skip is not False), (skip, ids)
        assert streamed == text
    status, err = post(pipeline_server.url + "/v1/completions", {"prompt": [1, 2], "skip_special_tokens": "yes"})
    assert status == 400 and err["error"]["param"] == "skip_special_tokens", err


def test_generate_cli_text_skips_special_tokens(pipeline_server, tmp_path):
    lines = tmp_path / "in.jsonl"
    lines.write_text(json.dumps({"id": "a", "token_ids": [11, 12, 13, 14]}) + "\n")
    outs = {}
    for flag in ([], ["--no-skip-special-tokens"]):
        run = subprocess.run([HSX, "generate", "--model", str(pipeline_server.model_dir), "--load-format", "dummy",
                              "--input", str(lines), "--max-tokens", "24", "--ignore-eos", *flag],
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        outs[bool(flag)] = json.loads(run.stdout)
    ids = outs[False]["token_ids"]
    assert any(i in pipeline_server.special for i in ids), ids
    assert outs[False]["text"] == pipeline_server.tokenizer.decode(ids, skip_special_tokens=True)
    assert outs[True]["text"] == pipeline_server.tokenizer.decode(ids, skip_special_tokens=False)


def test_extract_messages_lines_carry_the_render_boundary_loss_mask(pipeline_server, tmp_path):
    """`hsx extract` on messages lines writes loss_mask [T]: 1 exactly on the tokens
    prepare-data supervises for each assistant turn (the tokens past the boundary between
    speculators' two renders of that turn, through render_conversation against the
    server), 0 elsewhere; a token_ids line gets none."""
    render = load_speculators("data_generation/render_client.py", "speculators_render_client")
    conversations = {"multi": CONVERSATION, "single": MESSAGES + [{"role": "assistant", "content": "Hello."}],
                     "trailing_user": CONVERSATION[:4]}
    lines = tmp_path / "in.jsonl"
    lines.write_text("".join(json.dumps({"id": k, "messages": v}) + "\n" for k, v in conversations.items()) +
                     json.dumps({"id": "ids", "token_ids": [11, 12, 13]}) + "\n")
    out = tmp_path / "out"
    run = subprocess.run([HSX, "extract", "--model", str(pipeline_server.model_dir), "--load-format", "dummy",
                          "--layers", ",".join(map(str, LAYERS)), "--input", str(lines), "--output", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    for name, conversation in conversations.items():
        states = read_safetensors(out / f"{name}.safetensors")
        full = render.render_conversation(pipeline_server.url, conversation, add_generation_prompt=False)
        assert states["token_ids"].tolist() == full
        expected = [0] * len(full)
        for j, turn in enumerate(conversation):
            if turn["role"] != "assistant" or j == 0:
                continue
            prompt_ids = render.render_conversation(pipeline_server.url, conversation[:j], add_generation_prompt=True)
            turn_ids = render.render_conversation(pipeline_server.url, conversation[:j + 1], add_generation_prompt=False)
            assert turn_ids[:len(prompt_ids)] == prompt_ids and full[:len(turn_ids)] == turn_ids
            expected[len(prompt_ids):len(turn_ids)] = [1] * (len(turn_ids) - len(prompt_ids))
        assert states["loss_mask"].tolist() == expected, name
        supervised = [t for t, m in zip(full, expected) if m]
        text = pipeline_server.tokenizer.decode(supervised, skip_special_tokens=False)
        assert text == "".join(t["content"] + "<|im_end|>\n" for t in conversation[1:] if t["role"] == "assistant")
    assert "loss_mask" not in read_safetensors(out / "ids.safetensors")
