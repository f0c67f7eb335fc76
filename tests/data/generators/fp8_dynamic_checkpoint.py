"""Writes tests/data/fp8/qwen3_fp8_dynamic: the qwen3 fixture model quantized the way
FP8 checkpoints for vLLM are made, with llm-compressor's FP8_DYNAMIC scheme (E4M3
weights, one scale per output channel, activations quantized per token at run time; the
lm_head left in bf16) and saved in compressed-tensors' format, as the RedHatAI
*-FP8-dynamic checkpoints are. tests/test_fp8_checkpoint.cpp loads it.

Run (torch, transformers and llmcompressor from PyPI; CPU is enough):
  python3 fp8_dynamic_checkpoint.py tests/data/models/qwen3 tests/data/fp8/qwen3_fp8_dynamic
  python3 fp8_dynamic_checkpoint.py tests/data/models/qwen3_moe tests/data/fp8/qwen3_moe_fp8_dynamic
The MoE router (mlp.gate) stays bf16, as in RedHatAI's Qwen3-30B-A3B-FP8-dynamic; the
experts are quantized like every other Linear.
"""
import shutil
import sys

import torch
from llmcompressor import oneshot
from llmcompressor.modifiers.quantization import QuantizationModifier
from transformers import AutoModelForCausalLM


def main():
    src, out = sys.argv[1], sys.argv[2]
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    oneshot(model=model, recipe=QuantizationModifier(targets="Linear", scheme="FP8_DYNAMIC", ignore=["lm_head", "re:.*mlp.gate$"]))
    model.save_pretrained(out, save_compressed=True)
    shutil.copy(f"{src}/generation_config.json", out)


if __name__ == "__main__":
    main()
