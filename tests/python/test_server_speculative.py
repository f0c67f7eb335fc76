"""Speculative decoding behind `hsx serve`: the openai client, streaming greedy requests,
gets the same tokens with EAGLE-3 or n-gram drafts as without (--batch-invariant makes a
row's logits independent of how many tokens its step verifies, so equality is exact), and
/metrics counts drafts under vLLM's names."""
import concurrent.futures
import json
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request

import openai
import pytest

from conftest import HSX, ROOT, free_port, read_safetensors, wait_for_server

MODEL = ROOT / "tests" / "data" / "models" / "llama"
DRAFT = ROOT / "tests" / "data" / "eagle3" / "llama_copy"


class PlainServer:
    def __init__(self, tmp, *extra, model=MODEL):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        log_path = tmp / f"server-{self.port}.log"
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen([HSX, "serve", str(model), "--port", str(self.port), "--served-model-name", "m",
                                      "--batch-invariant", *extra], stdout=self.log, stderr=subprocess.STDOUT)
        wait_for_server(self.url, self.proc, log_path, timeout=30)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


def streamed_tokens(url, prompt):
    client = openai.OpenAI(base_url=url + "/v1", api_key="none")
    tokens = []
    for chunk in client.completions.create(model="m", prompt=prompt, max_tokens=24, temperature=0, stream=True,
                                           extra_body={"return_token_ids": True, "ignore_eos": True}):
        for choice in chunk.choices:
            tokens += (choice.model_extra or {}).get("token_ids") or []
    return tokens


@pytest.mark.parametrize("spec", [
    {"method": "eagle3", "model": str(DRAFT), "num_speculative_tokens": 3},
    {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2},
], ids=["eagle3", "ngram"])
def test_streamed_greedy_tokens_are_the_plain_servers(tmp_path, spec):
    golden = read_safetensors(MODEL / "golden.safetensors")
    prompts = [[int(t) for t in golden[f"prompt_{k}"]] for k in range(3)]
    plain = PlainServer(tmp_path)
    speculative = PlainServer(tmp_path, "--speculative-config", json.dumps(spec))
    try:
        for prompt in prompts:
            want = streamed_tokens(plain.url, prompt)
            assert len(want) == 24
            assert streamed_tokens(speculative.url, prompt) == want
        metrics = urllib.request.urlopen(speculative.url + "/metrics").read().decode()
        drafts = float(re.search(r"^vllm:spec_decode_num_draft_tokens_total (\S+)$", metrics, re.M).group(1))
        accepted = float(re.search(r"^vllm:spec_decode_num_accepted_tokens_total (\S+)$", metrics, re.M).group(1))
        assert drafts > 0
        assert 0 <= accepted <= drafts
        if spec["method"] == "eagle3":
            assert accepted > 0  # llama_copy's drafts of repeated tokens get accepted
            assert re.search(r'^vllm:spec_decode_num_accepted_tokens_per_pos_total\{position="0"\} [1-9]', metrics, re.M)
        plain_metrics = urllib.request.urlopen(plain.url + "/metrics").read().decode()
        assert re.search(r"^vllm:spec_decode_num_draft_tokens_total 0$", plain_metrics, re.M)
    finally:
        plain.stop()
        speculative.stop()


GPT_OSS = ROOT / "tests" / "data" / "models" / "gpt_oss"


def completion_tokens(url, prompt, n):
    """Non-streamed greedy completion through the openai client: its token ids."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="none")
    r = client.completions.create(model="m", prompt=prompt, max_tokens=n, temperature=0,
                                  extra_body={"return_token_ids": True, "ignore_eos": True})
    return (r.choices[0].model_extra or {}).get("token_ids")


@pytest.mark.parametrize("draft,extra", [
    ("gpt_oss_default", {}),
    ("gpt_oss_lookup", {}),
    ("gpt_oss_lookup", {"draft_length": "adaptive"}),
], ids=["random-draft", "lookup-draft", "lookup-draft-adaptive"])
def test_gpt_oss_eagle3_completions_are_the_plain_servers(tmp_path, draft, extra):
    """A gpt-oss target (MoE, attention sinks, yarn) served with an EAGLE-3 draft in the format
    speculators writes for it: streamed and non-streamed greedy completions are the plain
    server's, and the lookup draft's drafts get accepted."""
    golden = read_safetensors(GPT_OSS / "golden.safetensors")
    prompts = [[int(t) for t in golden[f"prompt_{k}"]] for k in range(3)]
    prompts.append([prompts[1][i % 7] for i in range(40)])  # repeats itself: repeated tokens follow
    spec = {"method": "eagle3", "model": str(ROOT / "tests" / "data" / "eagle3" / draft), "num_speculative_tokens": 3,
            **extra}
    plain = PlainServer(tmp_path, model=GPT_OSS)
    speculative = PlainServer(tmp_path, "--speculative-config", json.dumps(spec), model=GPT_OSS)
    try:
        for prompt in prompts:
            want = completion_tokens(plain.url, prompt, 24)
            assert len(want) == 24
            assert completion_tokens(speculative.url, prompt, 24) == want
            assert streamed_tokens(speculative.url, prompt) == want
        metrics = urllib.request.urlopen(speculative.url + "/metrics").read().decode()
        drafts = float(re.search(r"^vllm:spec_decode_num_draft_tokens_total (\S+)$", metrics, re.M).group(1))
        accepted = float(re.search(r"^vllm:spec_decode_num_accepted_tokens_total (\S+)$", metrics, re.M).group(1))
        assert drafts > 0
        assert 0 <= accepted <= drafts
        if draft == "gpt_oss_lookup" and not extra:
            assert accepted > 0
    finally:
        plain.stop()
        speculative.stop()


QWEN3 = ROOT / "tests" / "data" / "models" / "qwen3"
QWEN3_DRAFT = ROOT / "tests" / "data" / "eagle3" / "qwen3_default"  # random weights: never accepted


def post_completion(url, body):
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_sigterm_drain_lets_eagle3_generations_finish(tmp_path):
    """SIGTERM with 16 EAGLE-3 generations in flight on the CPU (a draft never accepted, so each
    token costs a whole round): the drain lets every one finish with its whole answer, and the
    server exits 0. The deadline is generous: this checks the drain's behaviour under speculative
    decoding, not its speed (DecodeCopiesNoContextOutOfTheKvCache guards the cost per round that
    once made such a drain run out)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    spec = {"method": "eagle3", "model": str(QWEN3_DRAFT), "num_speculative_tokens": 3}
    with open(tmp_path / "server.log", "w") as log:
        proc = subprocess.Popen([HSX, "serve", str(QWEN3), "--port", str(port), "--served-model-name", "m",
                                 "--speculative-config", json.dumps(spec), "--drain-timeout", "120"],
                                stdout=log, stderr=subprocess.STDOUT)
        try:
            for _ in range(300):
                try:
                    urllib.request.urlopen(url + "/health", timeout=1)
                    break
                except OSError:
                    time.sleep(0.1)
            n, prompt_len, max_tokens = 16, 1000, 120
            prompts = [[3 + (k * 31 + i * 17) % 500 for i in range(prompt_len)] for k in range(n)]
            with concurrent.futures.ThreadPoolExecutor(n) as pool:
                answers = [pool.submit(post_completion, url, {"model": "m", "prompt": p, "max_tokens": max_tokens,
                                                              "temperature": 0, "ignore_eos": True,
                                                              "return_token_ids": True}) for p in prompts]
                deadline = time.time() + 120
                while time.time() < deadline:  # until every prompt has been taken in
                    metrics = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
                    taken = re.search(r"^hsx_prompt_tokens_total (\S+)$", metrics, re.M)
                    if taken and float(taken.group(1)) >= n * prompt_len:
                        break
                    time.sleep(0.05)
                started = time.time()
                proc.send_signal(signal.SIGTERM)
                results = [a.result(timeout=300) for a in answers]
            code = proc.wait(timeout=300)
            print(f"drained {n} EAGLE-3 generations in {time.time() - started:.1f} s")
            for status, body in results:
                assert status == 200, body
                choice = body["choices"][0]
                assert choice["finish_reason"] == "length", choice
                assert len(choice["token_ids"]) == max_tokens
            assert code == 0, (tmp_path / "server.log").read_text()[-2000:]
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
