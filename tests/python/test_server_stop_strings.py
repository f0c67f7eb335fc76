"""Stop strings matched off the engine thread (issue 31, item 6). The engine thread only
hands each token id over; a handler thread decodes them and, at a stop string, has the
engine finish the request at that token, which it may have run past by then (or ended
first). Whatever the timing, a stopped choice must be exactly the same request ended at
that token by max_tokens, except for its finish reason: its text, token ids, logprobs and
usage, and, with include_output_tokens, its hidden-state file's token ids and rows, value
for value. Several requests run at once (batch > 1), streamed and not."""
import fcntl
import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from conftest import Server, read_safetensors, text_model

PROMPTS = ["Once upon a time", "The quick brown fox", "In the beginning"]
MAX_TOKENS = 40


def post(server, path, body):
    req = urllib.request.Request(server.url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def stream(server, body):
    """The data events of a streamed completion, parsed."""
    req = urllib.request.Request(server.url + "/v1/completions", data=json.dumps({**body, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    events = []
    with urllib.request.urlopen(req, timeout=120) as r:
        for line in r:
            line = line.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    return events


def states(path):
    with open(path + ".lock") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)  # the writer holds it until the file is whole
        data = read_safetensors(path)
        fcntl.flock(lock, fcntl.LOCK_UN)
    return data


BASE = {"temperature": 0, "ignore_eos": True, "return_token_ids": True, "logprobs": 1,
        "kv_transfer_params": {"include_output_tokens": True}}


@pytest.fixture(scope="module")
def text_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stop-serve")
    # Batch-invariant: rows compare bit for bit whatever ran beside them.
    s = Server(tmp, "--load-format", "dummy", "--batch-invariant", model=text_model(tmp))
    yield s
    s.stop()


class Greedy:
    """A prompt's greedy continuation, and the text of each prefix of its tokens."""

    def __init__(self, server, prompt):
        choice = post(server, "/v1/completions", {**BASE, "prompt": prompt, "max_tokens": MAX_TOKENS})["choices"][0]
        self.prompt, self.text, self.tokens = prompt, choice["text"], choice["token_ids"]
        self.prompt_ids = prompt_ids = post(server, "/tokenize", {"prompt": prompt})["tokens"]
        # Each prefix decoded with the prompt before it, as the server decodes (a leading space survives).
        whole = post(server, "/detokenize", {"tokens": prompt_ids})["prompt"]
        self.prefix = [post(server, "/detokenize", {"tokens": prompt_ids + self.tokens[:k]})["prompt"][len(whole):]
                       for k in range(len(self.tokens) + 1)]
        assert self.prefix[-1] == self.text

    def boundaries(self):
        """(k, where the text of the first k tokens ends), for clean boundaries past the first few tokens."""
        for k in range(4, len(self.tokens) - 6):
            b = len(self.prefix[k])
            if self.text.startswith(self.prefix[k]) and "\ufffd" not in self.text[b - 2:b + 3] and 2 < b < len(self.text) - 3:
                yield k, b

    def stopped_at(self, stops):
        """Where stop strings end this text: (its text, the tokens kept: through the one that completed it)."""
        found = [(self.text.find(s), s) for s in stops if s in self.text]
        if not found:
            return self.text, len(self.tokens)
        # CompletionText's rule: the first token whose text completes any stop string; the
        # text ends before the first stop string in it.
        k = next(k for k in range(1, len(self.tokens) + 1) if any(s in self.prefix[k] for s in stops))
        start = min(self.prefix[k].find(s) for s in stops if s in self.prefix[k])
        return self.text[:start], k


def spanning_stop(g):
    """A stop string that starts inside one token's text and ends inside the next one's,
    first occurring there, and the tokens it keeps."""
    for k, b in g.boundaries():
        if len(g.prefix[k]) - len(g.prefix[k - 1]) < 2 or len(g.prefix[k + 1]) - b < 2:
            continue  # both tokens give the stop string at least one character and keep one
        stop = g.text[b - 1:b + 1]
        if stop.strip() == stop and g.text.find(stop) == b - 1:
            return stop, k + 1
    pytest.skip("no stop string spanning two tokens in " + repr(g.text))


def reference(server, prompt, n):
    """The same request ended at n tokens by max_tokens."""
    body = post(server, "/v1/completions", {**BASE, "prompt": prompt, "max_tokens": n})
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == n
    return choice, states(choice["kv_transfer_params"]["hidden_states_path"])


def assert_same_as_reference(server, g, got, n, text):
    """got: {text, token_ids, token_logprobs, completion_tokens, finish_reason, path}."""
    want, want_states = reference(server, g.prompt, n)
    assert got["finish_reason"] == "stop"
    assert got["text"] == text == want["text"][:len(text)]
    assert got["token_ids"] == want["token_ids"] == g.tokens[:n]
    assert got["completion_tokens"] == n
    assert got["token_logprobs"] == want["logprobs"]["token_logprobs"]
    data = states(got["path"])
    # The prompt's rows and the generated tokens' but the last kept one, which never ran.
    assert data["token_ids"].tolist() == g.prompt_ids + g.tokens[:n - 1] == want_states["token_ids"].tolist()
    assert data["hidden_states"].shape == want_states["hidden_states"].shape
    assert data["hidden_states"].shape[0] == len(g.prompt_ids) + n - 1
    np.testing.assert_array_equal(data["hidden_states"], want_states["hidden_states"])


@pytest.fixture(scope="module")
def greedy(text_server):
    return [Greedy(text_server, p) for p in PROMPTS]


def test_a_stop_string_spanning_two_tokens_ends_at_the_token_that_completes_it(text_server, greedy):
    g = greedy[0]
    stop, n = spanning_stop(g)
    text, kept = g.stopped_at([stop])
    assert kept == n and n < MAX_TOKENS - 3  # room for the engine to run on past it
    body = post(text_server, "/v1/completions", {**BASE, "prompt": g.prompt, "max_tokens": MAX_TOKENS, "stop": stop})
    choice = body["choices"][0]
    # It starts within the text of the first n - 1 tokens and ends in the n-th's.
    assert len(text) < len(g.prefix[n - 1]) and stop not in g.prefix[n - 1] and stop in g.prefix[n]
    assert_same_as_reference(text_server, g, {
        "text": choice["text"], "token_ids": choice["token_ids"], "token_logprobs": choice["logprobs"]["token_logprobs"],
        "completion_tokens": body["usage"]["completion_tokens"], "finish_reason": choice["finish_reason"],
        "path": choice["kv_transfer_params"]["hidden_states_path"]}, n, text)


def stops_for(greedy):
    """One stop string from each prompt's text (each applies to every prompt), at a clean
    token boundary well before max_tokens."""
    stops = []
    for g in greedy:
        for k, b in g.boundaries():
            s = g.text[b:b + 3]
            if 10 <= k < MAX_TOKENS - 8 and s.strip() == s and g.text.find(s) == b:
                stops.append(s)
                break
        else:
            pytest.skip("no stop string in " + repr(g.text))
    return stops


def test_stop_strings_in_a_batch_cut_answers_and_files_to_the_stop(text_server, greedy):
    stops = stops_for(greedy)
    body = post(text_server, "/v1/completions", {**BASE, "prompt": PROMPTS, "max_tokens": MAX_TOKENS, "stop": stops})
    assert len(body["choices"]) == len(PROMPTS)
    total = 0
    for g, choice in zip(greedy, sorted(body["choices"], key=lambda c: c["index"])):
        text, n = g.stopped_at(stops)
        assert n < MAX_TOKENS
        assert_same_as_reference(text_server, g, {
            "text": choice["text"], "token_ids": choice["token_ids"],
            "token_logprobs": choice["logprobs"]["token_logprobs"], "completion_tokens": len(choice["token_ids"]),
            "finish_reason": choice["finish_reason"], "path": choice["kv_transfer_params"]["hidden_states_path"]},
            n, text)
        total += n
    assert body["usage"]["completion_tokens"] == total


def streamed(events):
    choices = [e["choices"][0] for e in events if e.get("choices")]
    return {"text": "".join(c["text"] for c in choices),
            "token_ids": [t for c in choices for t in c.get("token_ids") or []],
            "token_logprobs": [p for c in choices if c.get("logprobs") for p in c["logprobs"]["token_logprobs"]],
            "completion_tokens": [e for e in events if e.get("usage")][-1]["usage"]["completion_tokens"],
            "finish_reason": choices[-1]["finish_reason"],
            "path": [e for e in events if "kv_transfer_params" in e][-1]["kv_transfer_params"]["hidden_states_path"]}


@pytest.mark.parametrize("logprobs", [True, False])
def test_concurrent_streams_with_stop_strings_match_their_cut_requests(text_server, greedy, logprobs):
    stops = stops_for(greedy)
    body = {**BASE, "max_tokens": MAX_TOKENS, "stop": stops, "stream_options": {"include_usage": True}}
    if not logprobs:
        del body["logprobs"]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        results = list(pool.map(lambda p: stream(text_server, {**body, "prompt": p}), PROMPTS))
    for g, events in zip(greedy, results):
        text, n = g.stopped_at(stops)
        got = streamed(events)
        if not logprobs:
            assert got["token_logprobs"] == []
            got["token_logprobs"] = reference(text_server, g.prompt, n)[0]["logprobs"]["token_logprobs"]
        assert_same_as_reference(text_server, g, got, n, text)


@pytest.mark.parametrize("extra", [0, 1])
@pytest.mark.parametrize("streaming", [False, True])
def test_a_stop_string_at_or_just_before_max_tokens(text_server, greedy, extra, streaming):
    """The request may end by max_tokens before the handler's finish arrives: the answer
    still ends at the stop string, as "stop", and so does the file."""
    g = greedy[1]
    stop = stops_for(greedy)[1]
    text, n = g.stopped_at([stop])
    body = {**BASE, "prompt": g.prompt, "max_tokens": n + extra, "stop": stop}
    if streaming:
        got = streamed(stream(text_server, {**body, "stream_options": {"include_usage": True}}))
    else:
        out = post(text_server, "/v1/completions", body)
        choice = out["choices"][0]
        got = {"text": choice["text"], "token_ids": choice["token_ids"],
               "token_logprobs": choice["logprobs"]["token_logprobs"],
               "completion_tokens": out["usage"]["completion_tokens"], "finish_reason": choice["finish_reason"],
               "path": choice["kv_transfer_params"]["hidden_states_path"]}
    assert_same_as_reference(text_server, g, got, n, text)
