"""One-pass regenerate-and-extract (`hsx extract --regenerate`, and `hsx serve`'s chat
completions with "regenerate": true): the target answers each assistant turn of a
conversation anew, in one sequence, and the file holds the states of the whole regenerated
conversation, captured while decoding, with loss_mask 1 on the answers. Checked against
references outside the feature: each answer is what `hsx generate` gives for that turn's
prompt rendered by transformers' apply_chat_template, the known tokens between answers are
the template's own text, and under --batch-invariant the file is bit-identical to plain
`hsx extract` run on the final token ids. The server's file is the CLI's, bit for bit, and
a request it cannot honour is a 400 naming the field while the others go on."""
import json
import subprocess
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from conftest import HSX, Server, free_port, read_safetensors, text_model, wait_for_server
from test_server_requests import post

# With chat_template_kwargs {"hide_earlier_answers": true} the template rewrites every
# assistant turn but the last (as Qwen3's strips earlier reasoning): such a conversation
# cannot be regenerated in one sequence.
TEMPLATE = ("{% for message in messages %}"
            "{% if hide_earlier_answers is defined and hide_earlier_answers and message['role'] == 'assistant' "
            "and not loop.last %}{{ '<|im_start|>assistant\\n(hidden)<|im_end|>\\n' }}{% else %}"
            "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endif %}"
            "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
CONVERSATION = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi."},
                {"role": "assistant", "content": "(old answer)"}, {"role": "user", "content": "Again?"},
                {"role": "assistant", "content": "(old answer 2)"}, {"role": "user", "content": "dropped"}]
MAX_TOKENS = 12
LAYERS = "0,2,4"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return text_model(tmp_path_factory.mktemp("regen"), files={
        "tokenizer_config.json": json.dumps({"eos_token": "<|im_end|>"}), "chat_template.jinja": TEMPLATE})


def hsx(*args):
    r = subprocess.run([HSX, *map(str, args)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r


def hf_chat_ids(model, messages, add_generation_prompt):
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(model / "tokenizer.json"), eos_token="<|im_end|>")
    tokenizer.chat_template = TEMPLATE
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_regenerated_conversation_states_match_a_plain_extract_of_its_tokens(model, tmp_path):
    lines = tmp_path / "in.jsonl"
    lines.write_text(json.dumps({"id": "c", "messages": CONVERSATION}) + "\n")
    out = tmp_path / "regen"
    hsx("extract", "--model", model, "--load-format", "dummy", "--layers", LAYERS, "--input", lines, "--output", out,
        "--regenerate", "--temperature", "0", "--max-tokens", MAX_TOKENS, "--batch-invariant")
    states = read_safetensors(out / "c.safetensors")
    tokens = states["token_ids"].tolist()
    mask = states["loss_mask"].tolist()
    assert states["hidden_states"].shape[0] == len(tokens) == len(mask)

    # Turn by turn: each answer (a run of ones in the mask) is greedy generate's answer to the
    # tokens before it, and the known tokens before each answer are the end of the turn's
    # prompt as transformers renders it with the earlier answers' text filled in.
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    eos = tok.token_to_id("<|im_end|>")
    spans = loss_mask_runs(mask)
    assert len(spans) == 2, spans
    messages = [dict(m) for m in CONVERSATION[:5]]
    previous_end = 0
    for turn, (begin, end) in zip((2, 4), spans):
        prompt = hf_chat_ids(model, messages[:turn], True)
        known = tokens[previous_end:begin]
        assert prompt[len(prompt) - len(known):] == known, f"turn {turn}: the known tokens are not the template's"
        prompts = tmp_path / f"p{turn}.jsonl"
        prompts.write_text(json.dumps({"id": "p", "token_ids": tokens[:begin]}) + "\n")
        answer = json.loads(hsx("generate", "--model", model, "--load-format", "dummy", "--input", prompts,
                                "--max-tokens", MAX_TOKENS, "--batch-invariant").stdout)["token_ids"]
        assert tokens[begin:end] == answer, f"turn {turn}"
        messages[turn]["content"] = tok.decode(answer[:-1] if answer[-1] == eos else answer, skip_special_tokens=True)
        previous_end = end
    final = hf_chat_ids(model, messages, False)
    tail = tokens[previous_end:]
    assert tail and final[len(final) - len(tail):] == tail, "the conversation's end is the template's"

    # The same token ids through plain extract: bit-identical states.
    plain_in = tmp_path / "final.jsonl"
    plain_in.write_text(json.dumps({"id": "c", "token_ids": tokens}) + "\n")
    plain = tmp_path / "plain"
    hsx("extract", "--model", model, "--load-format", "dummy", "--layers", LAYERS, "--input", plain_in,
        "--output", plain, "--batch-invariant")
    reference = read_safetensors(plain / "c.safetensors")
    assert reference["token_ids"].tolist() == tokens
    np.testing.assert_array_equal(states["hidden_states"], reference["hidden_states"])


def test_lines_without_assistant_turns_or_messages_fail_alone(model, tmp_path):
    lines = tmp_path / "in.jsonl"
    lines.write_text(json.dumps({"id": "none", "messages": CONVERSATION[:2]}) + "\n" +
                     json.dumps({"id": "ids", "token_ids": [1, 2, 3]}) + "\n" +
                     json.dumps({"id": "ok", "messages": CONVERSATION[:3]}) + "\n")
    out = tmp_path / "out"
    r = subprocess.run([HSX, "extract", "--model", model, "--load-format", "dummy", "--layers", LAYERS, "--input", lines,
                        "--output", out, "--regenerate", "--max-tokens", "4", "--seed", "7"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1
    assert "in.jsonl:1: 'messages' has no assistant turn after the first message" in r.stderr, r.stderr
    assert "in.jsonl:2: --regenerate answers 'messages' lines" in r.stderr, r.stderr
    states = read_safetensors(out / "ok.safetensors")
    assert 1 <= int(states["loss_mask"].sum()) <= 4


# hsx serve: chat completions with "regenerate": true.

@pytest.fixture(scope="module")
def regen_server(model, tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("regen-serve"), "--load-format", "dummy", "--batch-invariant", model=model)
    yield s
    s.stop()


def chat(server, body):
    return post(server.url + "/v1/chat/completions", {"model": "qwen3-fixture", "messages": CONVERSATION, **body})


def loss_mask_runs(mask):
    """[begin, end) of each run of ones."""
    runs, i = [], 0
    while i < len(mask):
        if mask[i]:
            j = i
            while j < len(mask) and mask[j]:
                j += 1
            runs.append((i, j))
            i = j
        else:
            i += 1
    return runs


def assert_response_is_the_file(model, reply, states):
    """The response's conversation is the file's: each answer's ids are a run of ones in its
    loss_mask, in order; the last answer is the choice, vLLM-shaped (its prompt: everything
    before it); each answer's text is its ids decoded (without the end-of-turn token)."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    eos = tok.token_to_id("<|im_end|>")
    tokens, mask = states["token_ids"].tolist(), states["loss_mask"].tolist()
    assert states["hidden_states"].shape[0] == len(tokens) == len(mask)
    assert states["loss_mask"].dtype == np.int64 and set(mask) <= {0, 1}
    regen = reply["regeneration"]
    assert regen["token_ids"] == tokens
    runs = loss_mask_runs(mask)
    answers = regen["answers"]
    assert [a["message_index"] for a in answers] == [2, 4]
    assert [a["token_ids"] for a in answers] == [tokens[b:e] for b, e in runs]
    messages = regen["messages"]
    assert len(messages) == 5
    assert [m["role"] for m in messages] == [m["role"] for m in CONVERSATION[:5]]
    for i in (0, 1, 3):
        assert messages[i] == CONVERSATION[i]
    for a in answers:
        ids = a["token_ids"]
        assert a["finish_reason"] == ("stop" if ids[-1] == eos else "length")
        assert messages[a["message_index"]]["content"] == tok.decode(ids[:-1] if ids[-1] == eos else ids,
                                                                     skip_special_tokens=True)
    begin, end = runs[-1]
    choice = reply["choices"][0]
    assert reply["prompt_token_ids"] == tokens[:begin] and choice["token_ids"] == tokens[begin:end]
    assert choice["message"] == {"role": "assistant", "content": messages[4]["content"]}
    assert choice["finish_reason"] == answers[-1]["finish_reason"]
    assert reply["usage"] == {"prompt_tokens": len(tokens) - sum(mask), "completion_tokens": sum(mask),
                              "total_tokens": len(tokens)}
    assert reply["kv_transfer_params"] == choice["kv_transfer_params"]


def test_served_regeneration_stores_the_file_extract_regenerate_writes(model, regen_server, tmp_path):
    status, reply = chat(regen_server, {"regenerate": True, "temperature": 0, "max_tokens": MAX_TOKENS,
                                        "return_token_ids": True})
    assert status == 200, reply
    served = read_safetensors(reply["kv_transfer_params"]["hidden_states_path"])
    assert_response_is_the_file(model, reply, served)

    lines = tmp_path / "in.jsonl"
    lines.write_text(json.dumps({"id": "c", "messages": CONVERSATION}) + "\n")
    out = tmp_path / "cli"
    hsx("extract", "--model", model, "--load-format", "dummy", "--layers", LAYERS, "--input", lines, "--output", out,
        "--regenerate", "--temperature", "0", "--max-tokens", MAX_TOKENS, "--batch-invariant")
    cli = read_safetensors(out / "c.safetensors")
    assert set(served) == set(cli) == {"hidden_states", "token_ids", "loss_mask"}
    for name in ("token_ids", "loss_mask", "hidden_states"):
        assert served[name].dtype == cli[name].dtype, name
        np.testing.assert_array_equal(served[name], cli[name], err_msg=name)


def test_served_sampled_regeneration_reproduces_and_is_a_plain_extract_of_its_tokens(model, regen_server, tmp_path):
    body = {"regenerate": True, "temperature": 0.9, "top_p": 0.95, "seed": 11, "max_completion_tokens": 6,
            "return_token_ids": True}
    (status, first), (status2, again) = chat(regen_server, body), chat(regen_server, body)
    assert status == status2 == 200, (first, again)
    states = read_safetensors(first["kv_transfer_params"]["hidden_states_path"])
    assert_response_is_the_file(model, first, states)
    assert all(len(a["token_ids"]) <= 6 for a in first["regeneration"]["answers"])
    assert again["regeneration"] == first["regeneration"]  # the seed reproduces every answer
    other = chat(regen_server, {**body, "seed": 12})[1]
    assert other["regeneration"]["token_ids"] != first["regeneration"]["token_ids"]

    plain_in = tmp_path / "final.jsonl"
    plain_in.write_text(json.dumps({"id": "c", "token_ids": states["token_ids"].tolist()}) + "\n")
    plain = tmp_path / "plain"
    hsx("extract", "--model", model, "--load-format", "dummy", "--layers", LAYERS, "--input", plain_in,
        "--output", plain, "--batch-invariant")
    np.testing.assert_array_equal(states["hidden_states"], read_safetensors(plain / "c.safetensors")["hidden_states"])


def test_each_answer_is_the_answer_a_request_for_that_turn_gets_penalties_included(regen_server):
    """Greedy with penalties: each regenerated answer is what /v1/completions answers for the
    tokens before it, whose output is that answer alone (earlier answers are its prompt)."""
    sampling = {"temperature": 0, "presence_penalty": 2.0, "frequency_penalty": 2.0,
                "max_tokens": MAX_TOKENS}
    status, reply = chat(regen_server, {"regenerate": True, "return_token_ids": True, **sampling})
    assert status == 200, reply
    mask = read_safetensors(reply["kv_transfer_params"]["hidden_states_path"])["loss_mask"].tolist()
    tokens = reply["regeneration"]["token_ids"]
    runs = loss_mask_runs(mask)
    assert len(runs) == 2
    for begin, end in runs:
        status, one = post(regen_server.url + "/v1/completions",
                           {"prompt": tokens[:begin], "return_token_ids": True, **sampling})
        assert status == 200, one
        assert one["choices"][0]["token_ids"] == tokens[begin:end], (begin, end)


def test_served_regeneration_through_the_fp8_sink_is_extracts_fp8_file(model, tmp_path):
    """The record goes through whichever sink --kv-transfer-config names: hs-connectors' FP8
    file (codes, scales) with loss_mask, as extract --regenerate writes it with that config."""
    fp8 = {"kv_connector": "FP8HiddenStatesConnector", "kv_role": "kv_producer"}
    server = Server(tmp_path, "--load-format", "dummy", "--batch-invariant", model=model, connector=fp8)
    try:
        status, reply = chat(server, {"regenerate": True, "temperature": 0, "max_tokens": MAX_TOKENS})
    finally:
        server.stop()
    assert status == 200, reply
    served = read_safetensors(reply["kv_transfer_params"]["hidden_states_path"])
    lines = tmp_path / "in.jsonl"
    lines.write_text(json.dumps({"id": "c", "messages": CONVERSATION}) + "\n")
    hsx("extract", "--model", model, "--load-format", "dummy", "--layers", LAYERS, "--input", lines, "--output",
        tmp_path / "cli", "--regenerate", "--temperature", "0", "--max-tokens", MAX_TOKENS, "--batch-invariant",
        "--kv-transfer-config", json.dumps(fp8))
    cli = read_safetensors(tmp_path / "cli" / "c.safetensors")
    assert set(served) == set(cli) == {"hidden_states", "hidden_states_scales", "token_ids", "loss_mask"}
    for name in cli:
        np.testing.assert_array_equal(served[name], cli[name], err_msg=name)
    assert 0 < served["loss_mask"].sum() < len(served["token_ids"])


@pytest.mark.parametrize("body,param,words", [
    ({"regenerate": "yes"}, "regenerate", "must be true or false"),
    ({"regenerate": True, "messages": CONVERSATION[:2]}, "messages", "no assistant turn"),
    ({"regenerate": True, "messages": "hi"}, "messages", "must be a list"),
    ({"regenerate": True, "n": 2}, "n", "'n' must be 1"),
    ({"regenerate": True, "stream": True}, "stream", "does not stream"),
    ({"regenerate": True, "stop": ["x"]}, "stop", "use stop_token_ids"),
    ({"regenerate": True, "ignore_eos": True}, "ignore_eos", "end of turn"),
    ({"regenerate": True, "skip_special_tokens": False}, "skip_special_tokens", "must be true"),
    ({"regenerate": True, "max_tokens": 0}, "max_tokens", "needs room for an answer"),
    ({"regenerate": True, "max_tokens": 10**6}, "max_tokens", "maximum context length"),
])
def test_bad_regenerate_requests_get_400_naming_the_field(regen_server, body, param, words):
    before = sorted(regen_server.storage.iterdir())
    status, err = chat(regen_server, {"max_tokens": 2, **body})
    assert status == 400, err
    assert err["error"]["param"] == param and words in err["error"]["message"], err
    assert sorted(regen_server.storage.iterdir()) == before  # nothing ran or was written


def test_completions_refuse_regenerate(regen_server):
    status, err = post(regen_server.url + "/v1/completions", {"prompt": "hi", "max_tokens": 1, "regenerate": True})
    assert status == 400 and err["error"]["param"] == "regenerate", err
    assert "/v1/chat/completions" in err["error"]["message"]


def test_a_conversation_the_template_rewrites_fails_alone(regen_server):
    """A template that rewrites earlier answers fails its request after it ran (400 naming the
    turn, no file), while a regeneration running beside it gets its answer and file."""
    good = {"regenerate": True, "temperature": 0, "max_tokens": MAX_TOKENS}
    bad = {**good, "chat_template_kwargs": {"hide_earlier_answers": True}}
    before = set(regen_server.storage.iterdir())
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda b: chat(regen_server, b), [bad, good, bad, good]))
    for status, err in results[0::2]:
        assert status == 400 and err["error"]["param"] == "messages", err
        assert err["error"]["message"].startswith("messages[2]: the template does not render"), err
    paths = set()
    for status, reply in results[1::2]:
        assert status == 200, reply
        paths.add(reply["kv_transfer_params"]["hidden_states_path"])
        assert len(reply["regeneration"]["answers"]) == 2
    new = {str(p) for p in set(regen_server.storage.iterdir()) - before if p.suffix == ".safetensors"}
    assert new == paths  # the failed requests left no file


def test_regenerate_without_extraction_is_a_400(model, tmp_path):
    port = free_port()
    with open(tmp_path / "server.log", "w") as log:
        proc = subprocess.Popen([HSX, "serve", str(model), "--port", str(port), "--load-format", "dummy",
                                 "--served-model-name", "qwen3-fixture"], stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for_server(url, proc, tmp_path / "server.log")
        status, err = post(url + "/v1/chat/completions", {"messages": CONVERSATION, "regenerate": True, "max_tokens": 2})
        assert status == 400 and err["error"]["param"] == "regenerate", err
        assert "--kv-transfer-config" in err["error"]["message"]
        status, ok = post(url + "/v1/chat/completions", {"messages": CONVERSATION, "max_tokens": 2})
        assert status == 200, ok
    finally:
        proc.terminate()
        proc.wait(timeout=30)
