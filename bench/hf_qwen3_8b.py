"""The Qwen3-8B shape both HF baselines (extraction and decode) run, with random bf16 weights."""
import torch
from transformers import AutoModelForCausalLM, Qwen3Config

CONFIG = Qwen3Config(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128, intermediate_size=12288, vocab_size=151936, max_position_embeddings=40960,
                     rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=False)


def random_model():
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(CONFIG, dtype=torch.bfloat16, attn_implementation="sdpa")
    return model.eval()
