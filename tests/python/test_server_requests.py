"""hsx serve against hostile and careless requests (issue 9: request validation). Each
request is refused alone with an OpenAI-style error that names the field, nothing runs or
is written for a refused request, and the server stays up; what hsx implements of OpenAI's
completion parameters (stop, stop_token_ids, min_tokens, n, echo) behaves as vLLM's."""
import fcntl
import json
import os
import socket
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import openai
import pytest

from conftest import TEXT_MODEL_LEN, Server, read_safetensors, text_model


def post(url, body, headers=None, timeout=60):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw or b"null")
        except ValueError:
            return e.code, raw


def complete(server, body):
    return post(server.url + "/v1/completions", body)


def assert_up(server):
    status, body = complete(server, {"prompt": [1, 2], "max_tokens": 1})
    assert status == 200, body
    assert server.proc.poll() is None


def assert_400(server, body, param, status=400):
    code, err = complete(server, body)
    assert code == status, err
    assert err["error"]["code"] == status and err["error"]["param"] == param, err
    return err["error"]["message"]


@pytest.fixture(scope="module")
def text_server(tmp_path_factory):
    """Text prompts, stop strings and echo need a tokenizer."""
    tmp = tmp_path_factory.mktemp("text-serve")
    s = Server(tmp, "--load-format", "dummy", model=text_model(tmp))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def bos_server(tmp_path_factory):
    """text_server's model with a tokenizer that adds a BOS to every encoding."""
    tmp = tmp_path_factory.mktemp("bos-serve")
    s = Server(tmp, "--load-format", "dummy", model=text_model(tmp, bos=True))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def custom_server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("custom-serve"), "--allow-custom-save-path", "--max-body-bytes", "100000")
    yield s
    s.stop()


def greedy(server, prompt, n_tokens):
    status, body = complete(server, {"prompt": prompt, "max_tokens": n_tokens, "ignore_eos": True, "temperature": 0,
                                     "return_token_ids": True})
    assert status == 200, body
    return body["choices"][0]


# 1. max_tokens: checked in 64 bits against max_model_len, in vLLM's words.

@pytest.mark.parametrize("include_output_tokens", [True, False])
def test_max_tokens_near_int32_max_is_400_not_a_crash(server, include_output_tokens):
    message = assert_400(server, {"prompt": [1, 2], "max_tokens": 2147483647, "ignore_eos": True,
                                  "kv_transfer_params": {"include_output_tokens": include_output_tokens}},
                         "max_tokens")
    assert message == ("'max_tokens' is too large: 2147483647. This model's maximum context length is 4096 tokens "
                       "and your request has 2 input tokens (2147483647 > 4096 - 2).")
    assert_up(server)


def test_max_tokens_beyond_int64_and_prompt_plus_max_tokens_over_the_model(server):
    assert "'max_tokens' must be an integer >= 0" in assert_400(
        server, {"prompt": [1], "max_tokens": 2 ** 64 - 1}, "max_tokens")
    assert "(200 > 4096 - 4000)" in assert_400(server, {"prompt": [1] * 4000, "max_tokens": 200}, "max_tokens")
    # Absent max_tokens is OpenAI's 16, which must fit too.
    assert "(16 > 4096 - 4090)" in assert_400(server, {"prompt": [1] * 4090}, "max_tokens")
    assert "However, your request has 4097 input tokens" in assert_400(server, {"prompt": [1] * 4097}, "prompt")


def test_null_max_tokens_fills_the_rest_of_the_model_length(server):
    status, body = complete(server, {"prompt": [1] * 4090, "max_tokens": None, "ignore_eos": True,
                                     "return_token_ids": True})
    assert status == 200, body
    assert len(body["choices"][0]["token_ids"]) == 6
    assert body["choices"][0]["finish_reason"] == "length"


# 2. Deep nesting anywhere is a 400 at parse time; no message echoes unbounded input.

@pytest.mark.parametrize("field", ["model", "prompt", "some_extension"])
def test_deeply_nested_json_is_400(server, field):
    deep = "[" * 100000 + "]" * 100000
    code, err = complete(server, ('{"prompt": [1], "%s": %s}' % (field, deep)).encode())
    assert code == 400 and "nested deeper than 64" in err["error"]["message"], err
    assert_up(server)


def test_a_huge_unknown_model_name_is_not_echoed(server):
    code, err = complete(server, {"model": "m" * 200000, "prompt": [1]})
    assert code == 404 and err["error"]["param"] == "model"
    assert len(err["error"]["message"]) < 300, len(err["error"]["message"])
    code, err = complete(server, b'{"prompt": [1], "x": "' + b"y" * 200000 + b'\x01"}')
    assert code == 400 and len(err["error"]["message"]) < 400, len(err["error"]["message"])


# 8. The whole request is checked before anything runs: no orphaned file.

def files(server):
    return {p.name for p in server.storage.iterdir()}


@pytest.mark.parametrize("prompt", [[[1, 2], []], [[1, 2], [3, 512]], [[1, 2], "text without a tokenizer"],
                                    [[1, 2], [1] * 4096]])
def test_a_batch_with_one_bad_prompt_writes_nothing(server, prompt):
    before = files(server)
    message = assert_400(server, {"prompt": prompt, "max_tokens": 1}, "prompt" if len(prompt[1]) < 4096 else "max_tokens")
    assert "prompt[1]" in message, message
    time.sleep(0.5)  # a file of the first prompt would have been written by now
    assert files(server) == before


def test_a_batch_with_an_empty_text_prompt_writes_nothing(text_server):
    before = files(text_server)
    assert "prompt[1]: empty prompt" in assert_400(text_server, {"prompt": ["hello", ""], "max_tokens": 1}, "prompt")
    time.sleep(0.5)
    assert files(text_server) == before


# 9. Every field the server reads is typed: a 400 that names it, never a 500.

@pytest.mark.parametrize("field,value", [
    ("return_token_ids", "yes"), ("ignore_eos", 1), ("echo", "no"), ("n", "two"), ("n", 0), ("n", 1.5),
    ("min_tokens", "3"), ("min_tokens", -1), ("stop", 5), ("stop", ["a", 1]), ("stop_token_ids", "2"),
    ("stop_token_ids", [1, "2"]), ("include_stop_str_in_output", "yes"), ("user", 5), ("seed", 1.5),
    ("seed", "1"), ("top_k", "1"), ("top_p", "0.5"), ("temperature", []), ("kv_transfer_params", "x"),
    ("stream_options", 1), ("best_of", "2"), ("model", 5),
])
def test_wrongly_typed_fields_are_400s_that_name_them(server, field, value):
    message = assert_400(server, {"prompt": [1, 2], "max_tokens": 1, field: value}, field)
    assert field in message, message
    assert_up(server)


def test_stop_token_ids_out_of_the_vocabulary_is_400(server):
    assert "1099511627776" in assert_400(server, {"prompt": [1], "stop_token_ids": [2 ** 40]}, "stop_token_ids")


def test_stops_are_bounded_because_the_engine_checks_them_every_token(server, text_server):
    assert "at most 1024 ids" in assert_400(server, {"prompt": [1], "stop_token_ids": [1] * 1025}, "stop_token_ids")
    assert "at most 64 strings" in assert_400(text_server, {"prompt": "a", "stop": ["x"] * 65}, "stop")
    assert "at most 1024 bytes" in assert_400(text_server, {"prompt": "a", "stop": "x" * 1025}, "stop")


# 10. A custom hidden_states_path is one plain file name inside the storage directory.

@pytest.mark.parametrize("name", ["", ".", "./", "..", "a/b", "../x", "/etc/passwd", "x\x00y", "x\ny", "x\x7f",
                                  "n" * 300,
                                  # the directory's own bookkeeping: locks, writers' temp files, manifests
                                  "x.safetensors.lock", "x.lock", "x.safetensors.tmp.123.0", "a.tmp.b",
                                  "manifest.jsonl", "manifest.shard-00001-of-00004.jsonl"])
def test_bad_custom_paths_are_400_without_leaking_the_storage_path(custom_server, name):
    parent = set(os.listdir(custom_server.storage.parent))
    code, err = complete(custom_server, {"prompt": [1], "max_tokens": 1,
                                         "kv_transfer_params": {"hidden_states_path": name}})
    assert code == 400 and err["error"]["param"] == "kv_transfer_params", err
    assert str(custom_server.storage) not in err["error"]["message"]
    assert "hidden_states_path" in err["error"]["message"]
    assert set(os.listdir(custom_server.storage.parent)) == parent  # no <storage>.lock beside it
    assert_up(custom_server)


def test_a_plain_custom_name_is_written_in_the_storage_directory(custom_server):
    status, body = complete(custom_server, {"prompt": [1, 2], "max_tokens": 1,
                                            "kv_transfer_params": {"hidden_states_path": "mine.v1.safetensors"}})
    assert status == 200, body
    assert body["kv_transfer_params"]["hidden_states_path"] == str(custom_server.storage / "mine.v1.safetensors")
    assert "a custom hidden_states_path names one file" in assert_400(
        custom_server, {"prompt": [1], "n": 2, "kv_transfer_params": {"hidden_states_path": "two"}},
        "kv_transfer_params")


def test_concurrent_requests_for_one_custom_name_get_one_file(custom_server):
    """Exactly one of 16 requests naming one file wins; the others get 409, and the file
    holds the winner's prompt (all 16 used to get 200, 15 of them with another's file)."""
    prompts = [[10 + k, 2, 3] for k in range(16)]

    def send(prompt):
        return complete(custom_server, {"prompt": prompt, "max_tokens": 1,
                                        "kv_transfer_params": {"hidden_states_path": "same"}})

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(send, prompts))
    winners = [p for p, (code, _) in zip(prompts, results) if code == 200]
    assert len(winners) == 1, [code for code, _ in results]
    for code, err in results:
        if code != 200:
            assert code == 409 and err["error"]["param"] == "kv_transfer_params", err
            assert "'same'" in err["error"]["message"] and str(custom_server.storage) not in err["error"]["message"]
    path = str(custom_server.storage / "same")
    assert read_file_when_complete(path)["token_ids"].tolist() == winners[0]


def test_a_custom_name_of_an_existing_file_is_409_and_the_file_stays(custom_server):
    status, body = complete(custom_server, {"prompt": [1, 2], "max_tokens": 1})
    assert status == 200, body
    earlier = body["kv_transfer_params"]["hidden_states_path"]  # cmpl-<uuid>-0.safetensors
    before = read_file_when_complete(earlier)["token_ids"].tolist()
    code, err = complete(custom_server, {"prompt": [3, 4, 5], "max_tokens": 1,
                                         "kv_transfer_params": {"hidden_states_path": os.path.basename(earlier)}})
    assert code == 409 and err["error"]["param"] == "kv_transfer_params", err
    assert "existing file" in err["error"]["message"], err
    assert read_file_when_complete(earlier)["token_ids"].tolist() == before == [1, 2]
    assert_up(custom_server)


# 11. Token ids outside [0, vocab) are a 400 that names the id.

@pytest.mark.parametrize("ids", [[2 ** 40], [-1], [2 ** 31], [3000], [1.5], ["a"]])
def test_detokenize_refuses_ids_outside_the_vocabulary(text_server, ids):
    code, err = post(text_server.url + "/detokenize", {"tokens": [5] + ids})
    assert code == 400 and err["error"]["param"] == "tokens", err
    assert json.dumps(ids[0]) in err["error"]["message"], err


def test_detokenize_still_decodes(text_server):
    code, body = post(text_server.url + "/tokenize", {"prompt": "hello world"})
    assert code == 200
    code, body = post(text_server.url + "/detokenize", {"tokens": body["tokens"]})
    assert code == 200 and body["prompt"] == "hello world"


@pytest.mark.parametrize("ids", [[1, 2 ** 40], [1, 2 ** 64 - 1], [1, -5]])
def test_token_id_prompts_outside_the_vocabulary_name_the_id(server, ids):
    assert str(ids[1]) in assert_400(server, {"prompt": ids, "max_tokens": 1}, "prompt")


# 12. stop, stop_token_ids, min_tokens, n, echo; refusals of what hsx does not implement.

def stop_candidate(text):
    """A 3-character piece of `text` that first occurs in its second half."""
    for start in range(len(text) // 2, len(text) - 3):
        piece = text[start:start + 3]
        if text.find(piece) == start and piece.strip():
            return start, piece
    pytest.skip("no usable stop string in " + repr(text))


def test_stop_strings_cut_the_text_and_end_generation(text_server):
    base = greedy(text_server, "Once upon a time", 40)
    start, stop = stop_candidate(base["text"])
    status, body = complete(text_server, {"prompt": "Once upon a time", "max_tokens": 40, "ignore_eos": True,
                                          "temperature": 0, "stop": ["never-there", stop], "return_token_ids": True})
    assert status == 200, body
    choice = body["choices"][0]
    assert choice["text"] == base["text"][:start]
    assert choice["finish_reason"] == "stop"
    assert len(choice["token_ids"]) < 40  # generation ended there, not at max_tokens
    assert choice["token_ids"] == base["token_ids"][:len(choice["token_ids"])]
    # include_stop_str_in_output keeps the stop string.
    status, body = complete(text_server, {"prompt": "Once upon a time", "max_tokens": 40, "ignore_eos": True,
                                          "temperature": 0, "stop": stop, "include_stop_str_in_output": True})
    assert body["choices"][0]["text"] == base["text"][:start + len(stop)]


def test_streaming_never_sends_text_past_a_stop_string(text_server):
    base = greedy(text_server, "Once upon a time", 40)
    start, stop = stop_candidate(base["text"])
    client = openai.Client(base_url=text_server.url + "/v1", api_key="unused")
    chunks = list(client.completions.create(model="qwen3-fixture", prompt="Once upon a time", max_tokens=40,
                                            stream=True, stop=stop, temperature=0, extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in chunks) == base["text"][:start]
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_streamed_text_with_echo_equals_the_whole_text(text_server):
    base = greedy(text_server, "Once upon a time", 40)
    client = openai.Client(base_url=text_server.url + "/v1", api_key="unused")
    chunks = list(client.completions.create(model="qwen3-fixture", prompt="Once upon a time", max_tokens=40,
                                            stream=True, echo=True, temperature=0, extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in chunks) == "Once upon a time" + base["text"]
    assert chunks[-1].choices[0].finish_reason == "length"


def test_stop_token_ids_and_min_tokens(server, golden):
    prompt = golden["prompt_1"].tolist()
    tokens = golden["greedy_1"].tolist()
    status, body = complete(server, {"prompt": prompt, "max_tokens": 8, "stop_token_ids": [tokens[3]],
                                     "temperature": 0, "return_token_ids": True})
    assert status == 200, body
    assert body["choices"][0]["token_ids"] == tokens[:tokens.index(tokens[3]) + 1]
    assert body["choices"][0]["finish_reason"] == "stop"
    # min_tokens: the stop token cannot come before 3 tokens are out.
    status, body = complete(server, {"prompt": prompt, "max_tokens": 8, "stop_token_ids": [tokens[0]],
                                     "min_tokens": 3, "return_token_ids": True})
    out = body["choices"][0]["token_ids"]
    assert len(out) >= 3 and tokens[0] not in out[:3], out
    assert "min_tokens must be less than or equal to max_tokens=2" in assert_400(
        server, {"prompt": prompt, "max_tokens": 2, "min_tokens": 3}, "min_tokens")


def test_n_gives_n_choices_with_their_own_seeds_and_files(server, golden):
    body = {"prompt": [golden["prompt_0"].tolist(), golden["prompt_1"].tolist()], "max_tokens": 6, "n": 3,
            "temperature": 1.5, "seed": 7, "return_token_ids": True, "ignore_eos": True}
    status, first = complete(server, body)
    assert status == 200, first
    choices = first["choices"]
    assert [c["index"] for c in choices] == list(range(6))
    assert choices[0]["prompt_token_ids"] == body["prompt"][0] and choices[3]["prompt_token_ids"] == body["prompt"][1]
    assert len({tuple(c["token_ids"]) for c in choices[:3]}) > 1  # different seeds, different samples
    paths = [c["kv_transfer_params"]["hidden_states_path"] for c in choices]
    assert len(set(paths)) == 6
    assert first["usage"]["completion_tokens"] == 36
    assert first["usage"]["prompt_tokens"] == len(body["prompt"][0]) + len(body["prompt"][1])
    status, again = complete(server, body)
    assert [c["token_ids"] for c in again["choices"]] == [c["token_ids"] for c in choices]  # seeded: reproducible


def test_n_times_prompts_beyond_the_queue_is_400(server):
    assert "choices" in assert_400(server, {"prompt": [1], "n": 100000, "max_tokens": 1}, "n")
    assert "2000 choices" in assert_400(server, {"prompt": [[1]] * 1000, "n": 2, "max_tokens": 1}, "n")


def test_echo_prepends_the_prompt(text_server):
    base = greedy(text_server, "Hello there", 5)
    status, body = complete(text_server, {"prompt": "Hello there", "max_tokens": 5, "ignore_eos": True, "echo": True,
                                          "temperature": 0})
    assert status == 200
    assert body["choices"][0]["text"] == "Hello there" + base["text"]
    ids = post(text_server.url + "/tokenize", {"prompt": "Hello there"})[1]["tokens"]
    status, body = complete(text_server, {"prompt": ids, "max_tokens": 0, "echo": True})
    assert body["choices"][0]["text"] == "Hello there"


@pytest.mark.parametrize("field,value", [
    ("suffix", "x"), ("logit_bias", {"1": 5}), ("best_of", 3), ("logprobs", 21), ("logprobs", -1), ("logprobs", "2"),
    ("use_beam_search", True), ("guided_json", {}), ("response_format", {"type": "json_object"}),
])
def test_unsupported_parameters_are_refused_by_name(server, field, value):
    assert field in assert_400(server, {"prompt": [1, 2], "max_tokens": 1, field: value}, field)


def test_neutral_values_and_unknown_fields_are_accepted(server):
    status, body = complete(server, {"prompt": [1, 2], "max_tokens": 1, "presence_penalty": 0, "logit_bias": {},
                                     "best_of": 1, "user": "me", "min_p": 0, "some_unknown_extension": [1]})
    assert status == 200, body


@pytest.mark.parametrize("field,value", [
    ("min_p", 1.5), ("min_p", -0.1), ("presence_penalty", 2.5), ("frequency_penalty", -3), ("repetition_penalty", 0),
    ("min_p", "0.1"),
])
def test_penalties_and_min_p_out_of_range_are_refused_by_name(server, field, value):
    assert field in assert_400(server, {"prompt": [1, 2], "max_tokens": 1, field: value}, field)


def test_penalties_change_greedy_tokens_and_neutral_values_do_not(server, golden):
    prompt = golden["prompt_0"].tolist()
    def tokens(**extra):
        status, body = complete(server, {"prompt": prompt, "max_tokens": 12, "ignore_eos": True, "temperature": 0,
                                         "return_token_ids": True, **extra})
        assert status == 200, body
        return body["choices"][0]["token_ids"]
    base = tokens()
    assert tokens(presence_penalty=0, frequency_penalty=0, repetition_penalty=1, min_p=0) == base
    assert tokens(repetition_penalty=100.0) != base
    assert tokens(frequency_penalty=2.0, presence_penalty=2.0) != base


def test_logprobs_are_hugging_faces_log_softmax(server, golden):
    # The first generated token's logprobs against HF's f32 logits at the prompt's last position.
    logits = golden["logits_0"][-1].astype(np.float64)
    log_softmax = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
    status, body = complete(server, {"prompt": golden["prompt_0"].tolist(), "max_tokens": 3, "temperature": 0,
                                     "ignore_eos": True, "logprobs": 5, "return_token_ids": True})
    assert status == 200, body
    choice = body["choices"][0]
    lp = choice["logprobs"]
    assert choice["token_ids"] == golden["greedy_0"][:3].tolist()
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == 3
    first = int(golden["greedy_0"][0])
    assert lp["tokens"][0] == f"token_id:{first}"
    assert abs(lp["token_logprobs"][0] - log_softmax[first]) < 1e-4
    top5 = np.argsort(-log_softmax, kind="stable")[:5]
    assert set(lp["top_logprobs"][0]) == {f"token_id:{t}" for t in top5}
    for t in top5:
        assert abs(lp["top_logprobs"][0][f"token_id:{t}"] - log_softmax[t]) < 1e-4
    # Without the parameter there are none; with echo (which needs the prompt's) it is
    # refused by name.
    status, body = complete(server, {"prompt": [1, 2], "max_tokens": 1})
    assert body["choices"][0]["logprobs"] is None
    for stream in (False, True):
        assert "prompt's logprobs" in assert_400(
            server, {"prompt": [1, 2], "max_tokens": 1, "logprobs": 1, "echo": True, "stream": stream}, "logprobs")


def joined_stream_logprobs(chunks):
    """A stream's logprobs joined over its chunks. Each chunk carries those of its own
    tokens, its text_offsets by vLLM's rule: the first at the characters of text sent
    before the chunk, each next one after the text of the token before."""
    joined = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    sent = 0
    for chunk in chunks:
        choice = chunk.choices[0]
        lp = choice.logprobs
        if lp is None:
            assert not getattr(choice, "token_ids", None), "a chunk with tokens but no logprobs"
        else:
            assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == \
                len(choice.token_ids or [])
            offset = sent
            for token, at in zip(lp.tokens, lp.text_offset):
                assert at == offset, (lp.tokens, lp.text_offset, sent)
                offset += len(token)
            for key in joined:
                joined[key] += getattr(lp, key)
        sent += len(choice.text)
    return joined


@pytest.mark.parametrize("which,prompt", [("server", list(range(1, 13))), ("text_server", "Once upon a time")])
def test_streamed_logprobs_equal_the_non_streamed_ones(request, which, prompt):
    # Prompts shorter than a KV block, so neither request reuses the other's cached prefix
    # and both compute the same logits bit for bit.
    s = request.getfixturevalue(which)
    client = openai.Client(base_url=s.url + "/v1", api_key="unused")
    args = dict(model="qwen3-fixture", prompt=prompt, max_tokens=10, logprobs=3, seed=11,
                extra_body={"ignore_eos": True, "return_token_ids": True})
    whole = client.completions.create(**args).choices[0]
    chunks = list(client.completions.create(stream=True, **args))
    assert [t for c in chunks for t in (getattr(c.choices[0], "token_ids", None) or [])] == whole.token_ids
    assert len(whole.token_ids) == 10
    assert "".join(c.choices[0].text for c in chunks) == whole.text
    assert chunks[-1].choices[0].finish_reason == "length"
    joined = joined_stream_logprobs(chunks)
    for key in ("tokens", "token_logprobs", "top_logprobs"):
        assert joined[key] == getattr(whole.logprobs, key), key
    assert whole.logprobs.text_offset[0] == 0
    if which == "server":  # token_id:<id> texts never collide: the drawn token and 3 others
        assert all(3 <= len(top) <= 4 for top in joined["top_logprobs"])
        assert whole.logprobs.tokens == [f"token_id:{t}" for t in whole.token_ids]


def test_stream_options_include_usage(server, golden):
    client = openai.Client(base_url=server.url + "/v1", api_key="unused")
    chunks = list(client.completions.create(model="qwen3-fixture", prompt=golden["prompt_0"].tolist(), max_tokens=4,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4
    assert "needs stream: true" in assert_400(server, {"prompt": [1], "stream_options": {"include_usage": True}},
                                              "stream_options")


# 13. Body size: 413 beyond --max-body-bytes (chunked bodies too); text too long to fit
# the model is refused before it is tokenized.

def test_a_body_over_the_default_cap_is_413(server):
    body = b'{"prompt": [' + b"1," * (17 << 20) + b"1]}"  # 34 MiB
    code, err = complete(server, body)
    assert code == 413, err
    assert_up(server)


def test_a_chunked_body_over_the_cap_is_413(custom_server):
    with socket.create_connection(("127.0.0.1", custom_server.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        chunk = b"1," * 10000
        try:
            for _ in range(20):  # 400 KB against a 100 KB cap
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        except OSError:
            pass  # the server may close before all is sent
        reply = sock.recv(4096)
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    assert_up(custom_server)


def test_tokenize_and_detokenize_are_capped_as_completions_are(text_server):
    """/tokenize took any text (a 30 MB prompt: 8 s and 1.27 GB); now the completions' bound."""
    limit = 4 * 64 * TEXT_MODEL_LEN  # 4 x the longest vocabulary string (64 bytes) x max_model_len
    code, err = post(text_server.url + "/tokenize", {"prompt": "w" * (limit + 1)})
    assert code == 400 and err["error"]["param"] == "prompt", err
    assert f"{limit + 1} bytes, more than {limit} bytes" in err["error"]["message"], err
    code, err = post(text_server.url + "/detokenize", {"tokens": [5] * (TEXT_MODEL_LEN + 1)})
    assert code == 400 and err["error"]["param"] == "tokens", err
    assert str(TEXT_MODEL_LEN) in err["error"]["message"], err
    # Within the bounds both still answer.
    code, body = post(text_server.url + "/tokenize", {"prompt": "word " * 1000})
    assert code == 200 and body["count"] > 256, body
    code, body = post(text_server.url + "/detokenize", {"tokens": body["tokens"][:TEXT_MODEL_LEN]})
    assert code == 200 and body["prompt"].startswith("word word"), body


def test_text_that_cannot_fit_is_refused_before_tokenizing(text_server):
    message = assert_400(text_server, {"prompt": "word " * 2000000, "max_tokens": 1}, "prompt")
    assert "bytes" in message and "10000000" in message, message
    # Text that passes the byte bound is still measured in tokens, in vLLM's words.
    message = assert_400(text_server, {"prompt": "word " * 1000, "max_tokens": 1}, "prompt")
    assert "maximum context length is 256 tokens" in message, message


# 14. add_special_tokens (vLLM's extra parameter, true by default): false encodes text
# prompts without the tokenizer's post-processor tokens.

def read_file_when_complete(path):
    with open(path + ".lock") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        return read_safetensors(path)


def test_add_special_tokens_false_leaves_out_the_bos(bos_server):
    text = "Once upon a time"
    choices = {}
    for add in (None, True, False):
        body = {"prompt": text, "max_tokens": 1, "return_token_ids": True}
        if add is not None:
            body["add_special_tokens"] = add
        status, res = complete(bos_server, body)
        assert status == 200, res
        choice = res["choices"][0]
        assert res["usage"]["prompt_tokens"] == len(choice["prompt_token_ids"])
        file = read_file_when_complete(choice["kv_transfer_params"]["hidden_states_path"])
        assert file["token_ids"].tolist() == choice["prompt_token_ids"]
        choices[add] = choice["prompt_token_ids"]
    assert choices[None] == choices[True] == [0] + choices[False]
    # HF's tokenizers, which vLLM calls, agrees.
    tokenizers = pytest.importorskip("tokenizers")
    hf = tokenizers.Tokenizer.from_file(str(bos_server.storage.parent / "model" / "tokenizer.json"))
    assert choices[True] == hf.encode(text).ids and choices[False] == hf.encode(text, add_special_tokens=False).ids
    # /tokenize takes the same field; token-id prompts are taken as they are either way.
    assert post(bos_server.url + "/tokenize", {"prompt": text})[1]["tokens"] == choices[True]
    assert post(bos_server.url + "/tokenize", {"prompt": text, "add_special_tokens": False})[1]["tokens"] == \
        choices[False]
    for add in (True, False):
        status, res = complete(bos_server, {"prompt": [5, 6], "max_tokens": 1, "return_token_ids": True,
                                            "add_special_tokens": add})
        assert res["choices"][0]["prompt_token_ids"] == [5, 6]
    assert "add_special_tokens" in assert_400(bos_server, {"prompt": text, "add_special_tokens": "no"},
                                              "add_special_tokens")
    code, err = post(bos_server.url + "/tokenize", {"prompt": text, "add_special_tokens": 0})
    assert code == 400 and err["error"]["param"] == "add_special_tokens", err


# 15. One request cannot take the server: n is capped (--max-n), and its choices share
# the sequence slots with later requests instead of holding them all until they finish.

@pytest.fixture(scope="module")
def fair_server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("fair-serve"), "--max-num-seqs", "4", "--max-n", "64")
    yield s
    s.stop()


def metric(server, name):
    with urllib.request.urlopen(server.url + "/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
    raise KeyError(name)


def test_n_beyond_max_n_is_400(server, fair_server):
    message = assert_400(server, {"prompt": [1], "n": 129, "max_tokens": 1}, "n")
    assert "at most 128" in message and "--max-n" in message, message
    assert "at most 64" in assert_400(fair_server, {"prompt": [1], "n": 65, "max_tokens": 1}, "n")


def test_a_large_n_request_does_not_starve_a_later_one(fair_server):
    """32 choices x 100 tokens on 4 slots: a 1-token request sent after it used to wait
    until all of them had finished; now it runs within a few steps."""
    big = {"prompt": [1, 2, 3], "n": 32, "max_tokens": 100, "ignore_eos": True, "temperature": 0}
    finished = 'hsx_requests_total{status="finished"}'
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(post, fair_server.url + "/v1/completions", big, None, 600)
        deadline = time.time() + 60
        while metric(fair_server, "hsx_running_requests") < 32 and not future.done() and time.time() < deadline:
            time.sleep(0.01)
        before = metric(fair_server, finished)
        start = time.time()
        status, body = complete(fair_server, {"prompt": [4, 5], "max_tokens": 1})
        waited = time.time() - start
        big_done_first = metric(fair_server, finished) - before - 1
        status_big, body_big = future.result(timeout=600)
    assert status == 200 and status_big == 200, (body, body_big)
    assert len(body_big["choices"]) == 32
    assert big_done_first < 16, f"{big_done_first:.0f} of the 32 choices finished before the small request"
    assert waited < 60  # anti-hang only
