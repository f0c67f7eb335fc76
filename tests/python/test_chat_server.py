"""/v1/chat/completions against the real `openai` client: the prompt is the model's chat
template rendered as transformers' apply_chat_template renders it and tokenized as transformers
tokenizes chat (no special tokens added: the template writes BOS itself); the answer is the
completions endpoint's for that prompt, in OpenAI's chat shape (message / delta with the role
first, finish_reason, usage, logprobs.content); hidden states are extracted as for completions;
bad requests get a 400 naming the field and the server stays up."""
import json
import pathlib

import openai
import pytest

from conftest import Server, text_model
from test_server_requests import post

# A Llama-style template: BOS first, raise_exception on a role it does not know.
TEMPLATE = ("{{ bos_token }}{% for message in messages %}"
            "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
            "{{ raise_exception('Unknown role: ' + message['role']) }}{% endif %}"
            "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] | trim + '<|im_end|>\\n' }}"
            "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi to the world 🌍."}]


@pytest.fixture(scope="module")
def chat_server(tmp_path_factory):
    """The qwen3 fixture's shapes with dummy weights, the bpe_qwen2 tokenizer with a BOS
    post-processor (<|endoftext|>, id 0: it must not be added to chat prompts a second time),
    and TEMPLATE as chat_template.jinja."""
    tmp = tmp_path_factory.mktemp("chat-serve")
    model = text_model(tmp, bos=True, files={
        "tokenizer_config.json": json.dumps({"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}),
        "chat_template.jinja": TEMPLATE})
    s = Server(tmp, "--load-format", "dummy", model=model)
    s.model_dir = model
    yield s
    s.stop()


def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def hf_prompt_ids(model_dir, messages):
    """transformers' apply_chat_template(tokenize=True): the ids vLLM would run."""
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(model_dir / "tokenizer.json"),
                                                     bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    tokenizer.chat_template = TEMPLATE
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


def test_chat_prompt_is_transformers_apply_chat_template(chat_server):
    reply = client(chat_server).chat.completions.create(
        model="qwen3-fixture", messages=MESSAGES, max_tokens=4, temperature=0, extra_body={"return_token_ids": True})
    expected = hf_prompt_ids(chat_server.model_dir, MESSAGES)
    assert expected[0] == 0 and expected[1] != 0  # one BOS, from the template
    choice = reply.choices[0]
    assert reply.model_extra["prompt_token_ids"] == expected  # at the top level, as vLLM puts it
    assert "prompt_token_ids" not in choice.model_extra
    assert reply.usage.prompt_tokens == len(expected)
    assert reply.object == "chat.completion" and reply.id.startswith("chatcmpl-")
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
    assert reply.usage.completion_tokens == len(choice.model_extra["token_ids"])
    # The same prompt through /v1/completions gives the same greedy text.
    status, completion = post(chat_server.url + "/v1/completions",
                              {"prompt": expected, "max_tokens": 4, "temperature": 0})
    assert status == 200, completion
    assert choice.message.content == completion["choices"][0]["text"]
    # Extraction: the chat request's hidden states are stored as a completion's are.
    path = pathlib.Path(reply.model_extra["kv_transfer_params"]["hidden_states_path"])
    assert path.exists() and path.name.startswith("chatcmpl-")


def test_chat_stream_matches_the_whole_answer(chat_server):
    c = client(chat_server)
    whole = c.chat.completions.create(model="qwen3-fixture", messages=MESSAGES, max_completion_tokens=6, temperature=0)
    chunks = list(c.chat.completions.create(model="qwen3-fixture", messages=MESSAGES, max_completion_tokens=6,
                                            temperature=0, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].object == "chat.completion.chunk" and chunks[0].choices[0].delta.role == "assistant"
    assert all(ch.choices[0].delta.role is None for ch in chunks[1:] if ch.choices)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == whole.choices[0].message.content
    finals = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finals == [whole.choices[0].finish_reason]
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_chat_logprobs_and_sampling(chat_server):
    c = client(chat_server)
    reply = c.chat.completions.create(model="qwen3-fixture", messages=MESSAGES, max_tokens=3, temperature=0.8,
                                      seed=7, n=2, logprobs=True, top_logprobs=2, frequency_penalty=0.5, stop=["\n\n"])
    again = c.chat.completions.create(model="qwen3-fixture", messages=MESSAGES, max_tokens=3, temperature=0.8,
                                      seed=7, n=2, logprobs=True, top_logprobs=2, frequency_penalty=0.5, stop=["\n\n"])
    assert len(reply.choices) == 2
    for ours, theirs in zip(reply.choices, again.choices):
        assert ours.message.content == theirs.message.content  # seeded: reproducible
        tokens = ours.logprobs.content
        assert 1 <= len(tokens) <= 3
        for t in tokens:
            assert t.logprob <= 0 and len(t.top_logprobs) == 2
            assert bytes(t.bytes) == t.token.encode()
    streamed = list(c.chat.completions.create(model="qwen3-fixture", messages=MESSAGES, max_tokens=3, temperature=0,
                                              logprobs=True, top_logprobs=1, stream=True))
    content = [t for ch in streamed if ch.choices and ch.choices[0].logprobs for t in ch.choices[0].logprobs.content]
    assert 1 <= len(content) <= 3


@pytest.mark.parametrize("body, param, words", [
    ({}, "messages", "missing field 'messages'"),
    ({"messages": "hi"}, "messages", "messages: expected an array"),
    ({"messages": []}, "messages", "at least one message"),
    ({"messages": [{"role": 1, "content": "x"}]}, "messages", "messages[0].role: expected a string"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages", "messages[0].content: expected a string"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "messages", "only \"text\""),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages", "line 1: Unknown role: wizard"),
    ({"messages": MESSAGES, "prompt": "x"}, "prompt", "not a chat completions field"),
    ({"messages": MESSAGES, "max_tokens": 2, "max_completion_tokens": 2}, "max_completion_tokens", "not both"),
    ({"messages": MESSAGES, "max_completion_tokens": -1}, "max_completion_tokens", "max_tokens"),
    ({"messages": MESSAGES, "logprobs": 3}, "logprobs", "true or false"),
    ({"messages": MESSAGES, "top_logprobs": 2}, "top_logprobs", "needs 'logprobs': true"),
    ({"messages": MESSAGES, "logprobs": True, "top_logprobs": 99}, "top_logprobs", "logprobs"),
    ({"messages": MESSAGES, "tools": "x"}, "tools", "tools: expected an array"),
    ({"messages": MESSAGES, "chat_template_kwargs": []}, "chat_template_kwargs", "expected an object"),
    ({"messages": MESSAGES, "temperature": "hot"}, "temperature", "temperature"),
])
def test_bad_chat_requests_get_400_naming_the_field(chat_server, body, param, words):
    status, err = post(chat_server.url + "/v1/chat/completions", body)
    assert status == 400, err
    assert err["error"]["param"] == param and words in err["error"]["message"], err
    status, ok = post(chat_server.url + "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 1})
    assert status == 200, ok  # the server stays up


def test_model_without_chat_template_is_a_clear_400(server):
    status, err = post(server.url + "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 1})
    assert status == 400 and err["error"]["param"] == "messages"
    assert "no chat template" in err["error"]["message"]


def test_extract_renders_messages_lines(chat_server, tmp_path):
    """`hsx extract` {"id", "messages"} lines: the file's token ids are transformers'
    apply_chat_template ids (add_generation_prompt false: whole conversations); bad lines fail
    alone, naming their line and field."""
    import subprocess

    from conftest import HSX, read_safetensors
    conversation = MESSAGES + [{"role": "assistant", "content": "Hi, world."}]
    lines = [{"id": "conv", "messages": conversation},
             {"id": "gen", "messages": MESSAGES, "add_generation_prompt": True},
             {"id": "badrole", "messages": [{"role": ["user"], "content": "x"}]},
             {"id": "raises", "messages": [{"role": "wizard", "content": "x"}]},
             {"id": "badopt", "messages": MESSAGES, "add_generation_prompt": "yes"}]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "out"
    run = subprocess.run([HSX, "extract", "--model", str(chat_server.model_dir), "--load-format", "dummy",
                          "--layers", "0,2", "--input", str(prompts), "--output", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode != 0, run.stderr  # three lines failed
    assert "prompts.jsonl:3: messages[0].role: expected a string" in run.stderr, run.stderr
    assert "prompts.jsonl:4: chat template: line 1: Unknown role: wizard" in run.stderr, run.stderr
    assert "prompts.jsonl:5: add_generation_prompt: expected true or false" in run.stderr, run.stderr
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(chat_server.model_dir / "tokenizer.json"),
                                                     bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    tokenizer.chat_template = TEMPLATE
    for pid, messages, gen in [("conv", conversation, False), ("gen", MESSAGES, True)]:
        ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=gen)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        assert read_safetensors(out / f"{pid}.safetensors")["token_ids"].tolist() == ids
    assert sorted(p.name for p in out.iterdir()) == ["conv.safetensors", "gen.safetensors", "manifest.jsonl"]
