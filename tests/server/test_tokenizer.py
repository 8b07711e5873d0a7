"""The exported tokenizer: HuggingFace's libraries load it offline, and it counts what the server
counts (``usage``, TGI's token ids) for the same text, through a real HTTP front."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from yieldgate.server import ServerProcess
from yieldgate.server.tokenizer import write_tokenizer

tokenizers = pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")

TEXTS = ["hello world", "", " a  b\n\tc ", "héllo 日本 🙂", "\x00\x7f\x80ÿ", "a , b . c ?"]


@pytest.fixture(scope="module")
def directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tokenizer") / "yieldgate-sim"
    write_tokenizer(folder)
    return folder


@pytest.fixture(scope="module")
def fast(directory: Path) -> Any:
    return tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))


@pytest.fixture(scope="module")
def auto(directory: Path) -> Any:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        return transformers.AutoTokenizer.from_pretrained(str(directory))


def test_the_files_written(tmp_path: Path) -> None:
    written = write_tokenizer(tmp_path / "new" / "dir", model_name="tiny", model_max_length=2048)
    assert [p.name for p in written] == ["tokenizer.json", "tokenizer_config.json"]
    config = json.loads(written[1].read_text())
    assert (config["name_or_path"], config["model_max_length"]) == ("tiny", 2048)
    vocab = json.loads(written[0].read_text())["model"]["vocab"]
    assert sorted(vocab.values()) == list(range(256))
    with pytest.raises(ValueError, match="model_max_length"):
        write_tokenizer(tmp_path, model_max_length=0)


@pytest.mark.parametrize("text", TEXTS)
def test_ids_are_the_utf8_bytes(fast: Any, auto: Any, text: str) -> None:
    ids = list(text.encode())
    assert fast.encode(text).ids == ids
    assert fast.decode(ids) == text
    assert auto.encode(text) == ids  # no special tokens added
    assert auto.decode(ids) == text  # no clean-up of spaces


@given(st.text())
def test_any_text_round_trips(fast: Any, auto: Any, text: str) -> None:
    ids = list(text.encode())
    assert fast.encode(text).ids == ids
    assert auto.encode(text) == ids
    assert fast.decode(ids) == auto.decode(ids) == text


def test_what_transformers_sees(auto: Any) -> None:
    assert (auto.vocab_size, len(auto), auto.all_special_ids) == (256, 256, [])
    # Without --max-length, no limit (transformers' "very large" default).
    assert auto.model_max_length > 2**60


# -- against the server's own counts --------------------------------------------------------


@pytest.fixture
def server(serve: Any) -> ServerProcess:
    process: ServerProcess = serve("--http-port", "0", "--exec-ms", "0")
    return process


@pytest.mark.e2e
def test_counts_match_the_simulated_backends_usage(server: ServerProcess, auto: Any) -> None:
    prompt = "Ünïcode, spaces  and\nnewlines: 日本 🙂"
    with httpx.Client(base_url=server.http_url or "") as http:
        for max_tokens in (None, 9):
            body = {"model": "m", "prompt": prompt, "max_tokens": max_tokens}
            reply = http.post("/v1/completions", json=body).json()
            text, usage = reply["choices"][0]["text"], reply["usage"]
            assert usage["prompt_tokens"] == len(auto.encode(prompt))
            assert usage["completion_tokens"] == len(auto.encode(text))
        assert (text, reply["choices"][0]["finish_reason"]) == ("Ünïcode", "length")
        # The chat template builds the prompt the chat route builds.
        messages = [
            {"role": "system", "content": "be brief"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "é "}, {"type": "text", "text": "ü"}],
            },
        ]
        chat = http.post("/v1/chat/completions", json={"model": "m", "messages": messages}).json()
        rendered = auto.apply_chat_template(messages, tokenize=False)
        assert chat["choices"][0]["message"]["content"] == rendered
        counted = auto.apply_chat_template(messages, tokenize=True)["input_ids"]
        assert chat["usage"]["prompt_tokens"] == len(counted)
        # TGI's token ids are the tokenizer's.
        parameters = {"details": True, "decoder_input_details": True, "max_new_tokens": 12}
        tgi = http.post("/generate", json={"inputs": prompt, "parameters": parameters}).json()
        details = tgi["details"]
        assert [t["id"] for t in details["prefill"]] == auto.encode(prompt)
        assert [t["id"] for t in details["tokens"]] == auto.encode(tgi["generated_text"])
        assert details["generated_tokens"] == len(details["tokens"])
