"""One-pass regenerate-and-extract (`hsx extract --regenerate`): the target answers each
assistant turn of a messages line anew, in one sequence, and the file holds the states of
the whole regenerated conversation, captured while decoding, with loss_mask 1 on the
answers. Checked against references outside the feature: each answer is what `hsx
generate` gives for that turn's prompt rendered by transformers' apply_chat_template, the
known tokens between answers are the template's own text, and under --batch-invariant the
file is bit-identical to plain `hsx extract` run on the final token ids."""
import json
import subprocess

import numpy as np
import pytest

from conftest import HSX, read_safetensors, text_model

TEMPLATE = ("{% for message in messages %}"
            "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
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
    spans, i = [], 0
    while i < len(mask):
        if mask[i]:
            j = i
            while j < len(mask) and mask[j]:
                j += 1
            spans.append((i, j))
            i = j
        else:
            i += 1
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
