"""Build the tiny random Llama model and its tokenizer that the real vLLM serves in tests.

Everything is made locally (no hub download) and seeded, so two machines build the same
files: a byte-level BPE tokenizer trained on the Python standard library's sources and a
2-layer Llama with random bfloat16 weights. Its text is noise; what the tests need is a
real vLLM engine with real tokenization, prefix caching, usage and metrics.

Usage: build_model.py OUTPUT_DIR  (runs in the vLLM virtualenv: torch, transformers, tokenizers)
"""

from __future__ import annotations

import random
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

VOCAB_SIZE = 4096
SEED = 0
# head_dim 32: the CPU attention backend rejects head sizes below 32.
LLAMA = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}
PAD, BOS, EOS = "<|pad|>", "<|bos|>", "<|eos|>"
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
# Enough text for a stable 4,096-token vocabulary in a few seconds.
MAX_TRAINING_FILES = 400


def stdlib_texts() -> Iterator[str]:
    """The stdlib's top-level modules in sorted order: local, always present, deterministic."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:MAX_TRAINING_FILES]
    for path in files:
        yield path.read_text(encoding="utf-8", errors="replace")


def build_tokenizer(out: Path) -> object:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[PAD, BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(stdlib_texts(), trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        model_max_length=LLAMA["max_position_embeddings"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def build_model(out: Path, tokenizer: object) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),  # type: ignore[arg-type]
        bos_token_id=tokenizer.bos_token_id,  # type: ignore[attr-defined]
        eos_token_id=tokenizer.eos_token_id,  # type: ignore[attr-defined]
        pad_token_id=tokenizer.pad_token_id,  # type: ignore[attr-defined]
        **LLAMA,
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        sys.stderr.write(__doc__ or "")
        return 2
    import torch

    random.seed(SEED)
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out)
    build_model(out, tokenizer)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
