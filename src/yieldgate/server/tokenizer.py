"""The served model's tokenizer, written out for tools that count tokens themselves.

Both backends are byte-level: a token is one byte of the text's UTF-8 and
its id is the byte's value (256 ids, no special token, no end-of-sequence
token). ``write_tokenizer`` writes that tokenizer as HuggingFace's files,
which ``tokenizers.Tokenizer.from_file`` and
``transformers.AutoTokenizer.from_pretrained`` load from the directory,
offline: benchmark tools (vLLM's ``bench serve --tokenizer DIR``,
inference-perf's ``tokenizer.pretrained_model_name_or_path``) then count
what the server's ``usage`` counts.

- ``tokenizer.json``: a BPE model without merges over the 256 byte-level
  characters (GPT-2's byte-to-character table), each one's id its byte, and
  the ``ByteLevel`` pre-tokenizer and decoder: ``encode(text).ids`` is
  ``list(text.encode())`` and ``decode`` gives the text back.
- ``tokenizer_config.json``: ``PreTrainedTokenizerFast`` (no clean-up of
  spaces, which would change the text), ``model_max_length`` where given,
  and a chat template that renders messages as the chat route builds its
  prompt (a ``role: content`` line per message), so that
  ``apply_chat_template`` counts the prompt the server counts.

Written by hand as JSON: nothing here needs ``tokenizers`` at run time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["write_tokenizer"]

# The chat route's prompt (_http_openai._message_line): "role: content" lines,
# a content given as parts is their texts joined.
_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if not loop.first %}{{ '\\n' }}{% endif %}"
    "{{ message['role'] + ': ' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% elif message['content'] %}"
    "{% for part in message['content'] %}{{ part['text'] }}{% endfor %}"
    "{% endif %}"
    "{% endfor %}"
)


def _byte_characters() -> list[str]:
    """The printable character that stands for each byte in a byte-level vocabulary.

    GPT-2's table: a byte that is a visible Latin-1 character stands for
    itself; the others (controls, space, soft hyphen) take the characters from
    U+0100 on, in byte order.
    """
    visible = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    shown = set(visible)
    chars: list[str] = []
    extra = 0
    for byte in range(256):
        if byte in shown:
            chars.append(chr(byte))
        else:
            chars.append(chr(0x100 + extra))
            extra += 1
    return chars


def _byte_level() -> dict[str, Any]:
    # Regex splitting would not change a single id (there are no merges): off.
    return {
        "type": "ByteLevel",
        "add_prefix_space": False,
        "trim_offsets": False,
        "use_regex": False,
    }


def _tokenizer_json() -> dict[str, Any]:
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": _byte_level(),
        "post_processor": None,
        "decoder": _byte_level(),
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {char: byte for byte, char in enumerate(_byte_characters())},
            "merges": [],
        },
    }


def write_tokenizer(
    directory: str | Path,
    *,
    model_name: str = "yieldgate-sim",
    model_max_length: int | None = None,
) -> list[Path]:
    """Write the served model's tokenizer into ``directory`` (made if missing); return the files.

    ``model_name`` (the name the server serves, ``--model-name``) is recorded
    as the tokenizer's ``name_or_path``; ``model_max_length`` is the longest
    sequence tools should send (the harness's model: its ``max_seq_len``,
    2048 by default; ``None``, the simulated backend, has no limit). Files
    already there are replaced.
    """
    if model_max_length is not None and model_max_length < 1:
        raise ValueError("model_max_length must be >= 1")
    if not model_name:
        raise ValueError("model_name must be a non-empty string")
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "name_or_path": model_name,
        "clean_up_tokenization_spaces": False,
        "chat_template": _CHAT_TEMPLATE,
    }
    if model_max_length is not None:
        config["model_max_length"] = model_max_length
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, content in (("tokenizer.json", _tokenizer_json()), ("tokenizer_config.json", config)):
        path = folder / name
        path.write_text(json.dumps(content, indent=2) + "\n", encoding="utf-8")
        written.append(path)
    return written
