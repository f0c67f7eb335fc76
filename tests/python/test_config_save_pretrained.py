"""Configs as transformers writes them: every supported architecture's config built by
transformers (no torch needed) and written with save_pretrained, loaded by `hsx inspect`;
Hugging Face's bookkeeping keys (a leading underscore, such as the _model_name_or_path a GGUF
conversion leaves) are passed over; other unknown fields are refused unless named with
--allow-unknown-config-field, which proceeds with a warning."""
import json
import pathlib
import subprocess

import pytest

from conftest import HSX, ROOT

transformers = pytest.importorskip("transformers")

MODELS = ROOT / "tests" / "data" / "models"
# (architecture, the fixture whose (text) config it is built from, the multimodal config class)
ARCHITECTURES = [
    ("LlamaForCausalLM", "llama", None),
    ("Qwen2ForCausalLM", "qwen2", None),
    ("Qwen3ForCausalLM", "qwen3", None),
    ("Qwen3MoeForCausalLM", "qwen3_moe", None),
    ("Gemma3ForCausalLM", "gemma3", None),
    ("Gemma3ForConditionalGeneration", "gemma3", "Gemma3Config"),
    ("Gemma4ForCausalLM", "gemma4", None),
    ("Gemma4ForConditionalGeneration", "gemma4", "Gemma4Config"),
]


def saved_config(directory, fixture, multimodal, extra=None):
    config = transformers.AutoConfig.from_pretrained(MODELS / fixture)
    if multimodal:
        config = getattr(transformers, multimodal)(text_config=config.to_dict())
        config.architectures = [multimodal.replace("Config", "ForConditionalGeneration")]
    config.save_pretrained(directory)
    if extra:
        path = pathlib.Path(directory) / "config.json"
        document = json.loads(path.read_text())
        document.update(extra)
        path.write_text(json.dumps(document))
    return directory


def inspect(directory, *flags):
    return subprocess.run([HSX, "inspect", "--model", str(directory), "--load-format", "dummy", *flags],
                          capture_output=True, text=True, timeout=120)


# transformers' GGUF conversion writes the file it came from under this key.
BOOKKEEPING = {"_model_name_or_path": "/models/model.gguf", "_commit_hash": None}


@pytest.mark.parametrize("architecture, fixture, multimodal", ARCHITECTURES)
def test_save_pretrained_config_loads(tmp_path, architecture, fixture, multimodal):
    directory = saved_config(tmp_path / architecture, fixture, multimodal, extra=BOOKKEEPING)
    assert json.loads((directory / "config.json").read_text())["architectures"] == [architecture]
    run = inspect(directory)
    assert run.returncode == 0, run.stderr


def test_unknown_field_is_refused_unless_allowed_by_name(tmp_path):
    directory = saved_config(tmp_path / "qwen3", "qwen3", None, extra={"fancy_new_norm": True, "other_knob": 3})
    refused = inspect(directory)
    assert refused.returncode != 0
    assert "field 'fancy_new_norm': not supported" in refused.stderr, refused.stderr
    assert "--allow-unknown-config-field fancy_new_norm" in refused.stderr, refused.stderr
    one = inspect(directory, "--allow-unknown-config-field", "fancy_new_norm")
    assert one.returncode != 0 and "field 'other_knob': not supported" in one.stderr, one.stderr
    both = inspect(directory, "--allow-unknown-config-field", "fancy_new_norm",
                   "--allow-unknown-config-field", "other_knob")
    assert both.returncode == 0, both.stderr
    for name in ("fancy_new_norm", "other_knob"):
        assert f"field '{name}' is not implemented by hsx" in both.stderr, both.stderr
