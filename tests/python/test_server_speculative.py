"""Speculative decoding behind `hsx serve`: the openai client, streaming greedy requests,
gets the same tokens with EAGLE-3 or n-gram drafts as without (--batch-invariant makes a
row's logits independent of how many tokens its step verifies, so equality is exact), and
/metrics counts drafts under vLLM's names."""
import json
import re
import subprocess
import time
import urllib.request

import openai
import pytest

from conftest import HSX, ROOT, free_port, read_safetensors

MODEL = ROOT / "tests" / "data" / "models" / "llama"
DRAFT = ROOT / "tests" / "data" / "eagle3" / "llama_copy"


class PlainServer:
    def __init__(self, tmp, *extra):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(tmp / f"server-{self.port}.log", "w")
        self.proc = subprocess.Popen([HSX, "serve", str(MODEL), "--port", str(self.port), "--served-model-name", "m",
                                      "--batch-invariant", *extra], stdout=self.log, stderr=subprocess.STDOUT)
        for _ in range(300):
            try:
                urllib.request.urlopen(self.url + "/health", timeout=1)
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("hsx serve did not come up")

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
