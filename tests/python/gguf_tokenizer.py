"""A GGUF file's tokenizer as a Hugging Face directory (tokenizer.json, tokenizer_config.json),
converted by transformers' own GGUF support, as a user of transformers gets it.

    python3 tests/python/gguf_tokenizer.py MODEL.gguf OUT_DIR

transformers' GGUF reader imports torch only to name dtypes of tensors it is not asked for,
so without torch a placeholder module stands in for it.
"""
import os
import sys
import types


def convert(gguf_path, out_dir):
    from transformers import PreTrainedTokenizerFast
    placeholder = None
    try:
        import torch  # noqa: F401
    except ImportError:
        class _Placeholder(types.ModuleType):
            def __getattr__(self, name):
                return name
        placeholder = sys.modules["torch"] = _Placeholder("torch")
    try:
        directory, name = os.path.split(os.path.abspath(gguf_path))
        tokenizer = PreTrainedTokenizerFast.from_pretrained(directory, gguf_file=name)
        tokenizer.save_pretrained(out_dir)
    finally:
        # Called in-process by tests: a placeholder left behind would be every later
        # `import torch` (hs_connectors' reader would build on it).
        if placeholder is not None and sys.modules.get("torch") is placeholder:
            del sys.modules["torch"]
    return tokenizer


if __name__ == "__main__":
    convert(sys.argv[1], sys.argv[2])
