"""A tiny random-initialised Qwen2 and a tokenizer built in code: the real code path, no hub.

The tokenizer is a byte-level BPE trained (in milliseconds, deterministically) on a small
built-in corpus of Python / CUDA / chat text, wrapped as ``PreTrainedTokenizerFast`` with a
Qwen-style chat template (``<|im_start|>role\\n...<|im_end|>``). Any byte string round-trips, so
the environments' prompts and feedback tokenise like they would for a real model.
"""
from __future__ import annotations

from typing import Any

import torch

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, IM_END, "<think>", "</think>"]

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Enough structure for merges that look like code tokens; the model is random anyway.
_CORPUS = [
    "import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n",
    "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n\n"
    "    def forward(self, a, b):\n        return a + b\n",
    "class ModelNew(nn.Module):\n    def forward(self, x):\n        return self.op.forward(x)\n",
    "def get_inputs():\n    return [torch.randn(1024, 1024), torch.randn(1024, 1024)]\n",
    "def get_init_inputs():\n    return []\n",
    "__global__ void add_kernel(const float* a, const float* b, float* out, int n) {\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i < n) out[i] = a[i] + b[i];\n}\n",
    "torch::Tensor add_cuda(torch::Tensor a, torch::Tensor b) {\n"
    "    auto out = torch::empty_like(a);\n    int threads = 256;\n"
    "    int blocks = (a.numel() + threads - 1) / threads;\n    return out;\n}\n",
    "#pragma omp parallel for\nfor (int64_t i = 0; i < n; ++i) { out[i] = std::max(x[i], 0.0f); }\n",
    "<think>\nOkay, let me think about how to write a faster kernel for this operator.\n</think>\n",
    "Summary: fused the elementwise ops into one kernel and used shared memory tiling.\n",
    "```python\nsource = '''\n#include <torch/extension.h>\n'''\n```\n",
    "Your kernel compiled and is correct. Speedup: 1.25x. Try to make it faster.\n",
    "Your previous answer failed to compile: error: identifier is undefined.\n",
    "The output does not match the reference (max abs error 0.5). Fix the kernel.\n",
    "You are an expert in writing fast CUDA kernels. Write ModelNew.\n",
    "score 0.30 previous reward target letter a a a a aaaa the quick brown fox\n",
]


def kernel_texts(backend: str) -> list[str]:
    """Texts a warm-started tiny model reads and writes on ``backend``: the kernel environment's
    system prompt and task sources, and the answer corpus's code. Merges learnt from them make a
    C++ kernel answer a few hundred tokens instead of about a thousand."""
    from rewards.corpus import corpus_answers
    from rewards.prompts import system_prompt
    from rewards.rules import RULES
    from rewards.tasks import load_builtin

    texts = [system_prompt(backend, list(RULES))]
    texts += [t.source for t in load_builtin([1, 2], profile="cpu" if backend == "cpu" else "full")]
    texts += [a.code for a in corpus_answers(backend)]
    return texts


def build_tiny_tokenizer(vocab_size: int = 512, corpus: str | None = None) -> Any:
    """A byte-level BPE tokenizer (``PreTrainedTokenizerFast``) with Qwen-style chat tokens;
    ``corpus`` (a kernel backend) adds :func:`kernel_texts` to what the merges are learnt from."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + len(SPECIAL_TOKENS):
        raise ValueError(f"model.tiny.vocab_size={vocab_size}: a byte-level tokenizer needs at least "
                         f"{len(alphabet) + len(SPECIAL_TOKENS)} (256 bytes + special tokens)")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=alphabet, min_frequency=1, show_progress=False)
    tok.train_from_iterator(_CORPUS * 4 + (kernel_texts(corpus) if corpus else []), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=IM_END, pad_token=PAD_TOKEN,
                                   additional_special_tokens=SPECIAL_TOKENS[1:],
                                   padding_side="left", chat_template=CHAT_TEMPLATE)
    return fast


def build_tiny_model(arch: Any, tokenizer: Any) -> Any:
    """A random ``Qwen2ForCausalLM`` whose weights are a pure function of ``arch.seed``."""
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    vocab = len(tokenizer)
    if vocab > arch.vocab_size:
        raise ValueError(f"model.tiny.vocab_size={arch.vocab_size} is smaller than the tokenizer "
                         f"({vocab} tokens)")
    config = Qwen2Config(
        vocab_size=arch.vocab_size, hidden_size=arch.hidden_size,
        intermediate_size=arch.intermediate_size, num_hidden_layers=arch.num_hidden_layers,
        num_attention_heads=arch.num_attention_heads, num_key_value_heads=arch.num_key_value_heads,
        max_position_embeddings=arch.max_position_embeddings,
        tie_word_embeddings=arch.tie_word_embeddings,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None, architectures=["Qwen2ForCausalLM"], dtype="float32",
    )
    # the global RNG is restored afterwards: building a model must not perturb the caller's sampling
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(arch.seed)
        model = Qwen2ForCausalLM(config)
    finally:
        torch.random.set_rng_state(state)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    model.eval()
    return model


def build_tiny(arch: Any) -> tuple[Any, Any]:
    tokenizer = build_tiny_tokenizer(arch.vocab_size, arch.tokenizer_corpus)
    return build_tiny_model(arch, tokenizer), tokenizer


def default_tiny_arch() -> Any:
    """``conf/model/tiny.yaml``'s ``tiny`` block, validated by the schema."""
    from pipeline.models.load import load_model_config

    return load_model_config("tiny").tiny
