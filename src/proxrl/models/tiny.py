"""Build a tiny Llama-type causal LM and a byte-level BPE tokenizer trained locally, saved as
an ordinary Hugging Face directory. Nothing is downloaded: tests and the CPU demo use this.

Llama-type because transformers 5.x loads a custom tokenizer saved beside a Llama config
faithfully (beside a Qwen2 config it may load one that encodes text to nothing).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<|pad|>", "<|bos|>", "<|eos|>")
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tiny_tokenizer(corpus: Iterable[str], vocab_size: int = 320) -> PreTrainedTokenizerFast:
    """A byte-level BPE (round-trips any text) with pad, BOS and EOS, and a small chat template."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(list(corpus), trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, pad_token="<|pad|>", bos_token="<|bos|>", eos_token="<|eos|>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_lm(
    output_dir: str | Path,
    corpus: Iterable[str],
    *,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 4,
    vocab_size: int = 320,
    max_positions: int = 256,
    seed: int = 0,
) -> Path:
    """Train the tokenizer on ``corpus``, build a random-init Llama, save both to ``output_dir``
    (safetensors). Returns the directory, loadable by ``AutoModelForCausalLM.from_pretrained``."""
    output_dir = Path(output_dir)
    tokenizer = build_tiny_tokenizer(corpus, vocab_size)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_positions,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    return output_dir
