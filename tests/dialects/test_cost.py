"""What a Gemini request costs before it is sent, and what its answer says it used.

Bodies as the Gemini API documents them (``GenerateContentRequest``: ``contents``
of ``role`` and ``parts``, ``systemInstruction``, ``generationConfig``) in their
JSON names, as google-genai sends them, and in the proto names the REST API
takes too; answers with ``usageMetadata``, whole and streamed.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from yieldgate.dialects._cost import estimate_cost, prompt_text, usage_of
from yieldgate.gate import Cost, QuotaPolicy

MODEL = "gemini-2.0-flash"
GENERATE = f"/v1beta/models/{MODEL}:generateContent"
POLICY = QuotaPolicy()


def cost(body: Any, path: str = GENERATE, policy: QuotaPolicy = POLICY) -> Cost | None:
    return estimate_cost(json.dumps(body).encode(), policy, path=path)


def tokens(text: str) -> int:
    return math.ceil(len(text) / 4)


# -- the request ------------------------------------------------------------------------

# What google-genai 3.6.1 sends for generate_content(contents=["hi", <image>],
# config=GenerateContentConfig(system_instruction="be brief", max_output_tokens=50,
# thinking_config=...)): JSON names, bar a few it leaves in snake_case.
SDK_BODY = {
    "contents": [
        {
            "parts": [{"text": "hi"}, {"inlineData": {"data": "YWJj", "mime_type": "image/png"}}],
            "role": "user",
        }
    ],
    "systemInstruction": {"parts": [{"text": "be brief"}], "role": "user"},
    "generationConfig": {"maxOutputTokens": 50, "thinkingConfig": {"thinking_budget": 10}},
}
SNAKE_BODY = {
    "contents": [{"parts": [{"text": "hi"}], "role": "user"}],
    "system_instruction": {"parts": [{"text": "be brief"}]},
    "generation_config": {"max_output_tokens": 50},
}


def test_the_prompt_is_the_text_of_the_system_instruction_and_of_each_content() -> None:
    assert prompt_text(SDK_BODY) == "system: be brief\nuser: hi"
    assert prompt_text(SNAKE_BODY) == "system: be brief\nuser: hi"


@pytest.mark.parametrize("body", [SDK_BODY, SNAKE_BODY], ids=["camelCase", "snake_case"])
def test_a_generate_content_request_costs_its_prompt_and_its_output_bound(
    body: dict[str, Any],
) -> None:
    expected = Cost.of(tokens("system: be brief\nuser: hi"), 50, MODEL)
    assert cost(body) == expected
    assert cost(body, f"/v1/models/{MODEL}:streamGenerateContent") == expected


def test_a_conversation_counts_every_turn_and_only_text_parts() -> None:
    body = {
        "contents": [
            {"role": "user", "parts": [{"text": "look at "}, {"text": "this"}]},
            {"role": "model", "parts": [{"functionCall": {"name": "f", "args": {"x": 1}}}]},
            {"role": "user", "parts": [{"fileData": {"fileUri": "gs://b/o", "mimeType": "a/b"}}]},
            {"role": "model", "parts": [{"text": "a cat", "thought": True}]},
            {"parts": [{"text": "no role"}]},
        ],
        "generationConfig": {"maxOutputTokens": 7},
    }
    text = "user: look at this\nmodel: \nuser: \nmodel: a cat\nno role"
    assert prompt_text(body) == text
    assert cost(body) == Cost.of(tokens(text), 7, MODEL)


def test_the_output_bound_is_per_candidate() -> None:
    body = {"contents": [{"parts": [{"text": "abcd"}]}], "generationConfig": {}}
    body["generationConfig"] = {"maxOutputTokens": 100, "candidateCount": 3}
    assert cost(body) == Cost.of(1, 300, MODEL)
    body["generationConfig"] = {"candidate_count": 2}  # no bound: the default, twice
    assert cost(body) == Cost.of(1, 2 * POLICY.default_output_tokens, MODEL)
    body["generationConfig"] = {"maxOutputTokens": "40"}  # an int32 in proto JSON, as a string
    assert cost(body) == Cost.of(1, 40, MODEL)


@pytest.mark.parametrize(
    "config",
    [
        None,
        {},
        {"temperature": 0.5},
        {"maxOutputTokens": -1},
        {"maxOutputTokens": 1.5},
        {"maxOutputTokens": True},
        {"maxOutputTokens": "12a"},
        {"maxOutputTokens": "\u0661\u0662"},  # digits, not ASCII ones
        {"maxOutputTokens": [50]},
        {"maxOutputTokens": None, "candidateCount": 0},
        {"candidateCount": "many"},
        "max 50",
        [50],
    ],
)
def test_an_unreadable_or_missing_output_bound_is_the_default(config: Any) -> None:
    body: dict[str, Any] = {"contents": [{"role": "user", "parts": [{"text": "abc"}]}]}
    if config is not None:
        body["generationConfig"] = config
    policy = QuotaPolicy(default_output_tokens=9)
    assert cost(body, policy=policy) == Cost.of(tokens("user: abc"), 9, MODEL)


@pytest.mark.parametrize(
    ("body", "text"),
    [
        ({"contents": []}, ""),
        ({"contents": [1, None, "x", ["y"]]}, ""),
        ({"contents": [{"parts": 3}, {"parts": [1, {"text": 5}, {"text": None}]}]}, "\n"),
        ({"contents": [{"role": 7, "parts": [{"text": "a"}]}]}, "a"),
        ({"contents": [{"role": "user"}], "systemInstruction": 5}, "user: "),
        ({"contents": [], "systemInstruction": {"parts": "?"}}, ""),
        ({"contents": [], "system_instruction": "plain"}, "system: plain"),
        ({"contents": [], "systemInstruction": {"parts": [{"inlineData": {}}]}}, ""),
    ],
)
def test_malformed_contents_count_what_text_they_hold(body: dict[str, Any], text: str) -> None:
    assert prompt_text(body) == text
    assert cost(body) == Cost.of(tokens(text), POLICY.default_output_tokens, MODEL)


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(
                st.sampled_from(
                    [
                        "contents",
                        "parts",
                        "text",
                        "role",
                        "systemInstruction",
                        "system_instruction",
                        "generationConfig",
                        "generation_config",
                        "maxOutputTokens",
                        "max_output_tokens",
                        "candidateCount",
                    ]
                ),
                inner,
                max_size=4,
            )
        ),
        max_leaves=12,
    )
)
def test_no_body_makes_the_reader_raise(body: Any) -> None:
    for path in (GENERATE, "", "/v1beta/models/m:countTokens"):
        found = estimate_cost(json.dumps(body).encode(), POLICY, path=path)
        assert found is None or all(type(v) is int and v >= 0 for v in found[:4])


@pytest.mark.parametrize(
    "path",
    [
        f"/v1beta/models/{MODEL}:generateContent",
        f"/v1beta/models/{MODEL}:streamGenerateContent",
        f"/v1/models/{MODEL}:generateContent",
        f"/v1beta1/projects/p/locations/us-central1/publishers/google/models/{MODEL}"
        ":streamGenerateContent",
        f"/v1/projects/p/locations/global/publishers/google/models/{MODEL}:generateContent",
    ],
)
def test_the_scope_is_the_model_the_path_names(path: str) -> None:
    found = cost(SDK_BODY, path)
    assert found is not None
    assert found.scope == MODEL
    assert cost(SDK_BODY, path, QuotaPolicy(per_model=False)) == found._replace(scope="")


def test_counting_tokens_generates_nothing_and_costs_no_tokens() -> None:
    for method in ("countTokens", "computeTokens"):
        assert cost(SDK_BODY, f"/v1beta/models/{MODEL}:{method}") == Cost(scope=MODEL)
        path = f"/v1beta/models/{MODEL}:{method}"
        assert cost(SDK_BODY, path, QuotaPolicy(per_model=False)) is None


def test_a_tokenizer_counts_the_gemini_prompt() -> None:
    policy = QuotaPolicy(count_tokens=lambda text: len(text.split()))
    # "system: be brief\nuser: hi": five words.
    assert cost(SDK_BODY, policy=policy) == Cost.of(5, 50, MODEL)


# -- the answer --------------------------------------------------------------------------

# A whole answer, as the Gemini API writes it (indented), with a thinking model's counts.
WHOLE = b"""{
  "candidates": [
    {
      "content": {"parts": [{"text": "Blue light scatters more."}], "role": "model"},
      "finishReason": "STOP",
      "index": 0
    }
  ],
  "usageMetadata": {
    "promptTokenCount": 9,
    "candidatesTokenCount": 6,
    "totalTokenCount": 45,
    "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 9}],
    "thoughtsTokenCount": 30
  },
  "modelVersion": "gemini-2.5-flash",
  "responseId": "abc"
}
"""


def chunk(text: str, usage: dict[str, Any]) -> dict[str, Any]:
    return {
        "candidates": [{"content": {"parts": [{"text": text}], "role": "model"}, "index": 0}],
        "usageMetadata": usage,
        "modelVersion": MODEL,
    }


def test_a_whole_answers_usage_metadata_is_what_it_used() -> None:
    # The thoughts are output too: Gemini counts them apart from the candidates.
    assert usage_of(WHOLE) == Cost.of(9, 36)


def test_a_streams_last_chunk_has_the_final_counts() -> None:
    chunks = [
        chunk("Blue", {"promptTokenCount": 9, "totalTokenCount": 9}),
        chunk(" light", {"promptTokenCount": 9, "candidatesTokenCount": 2, "totalTokenCount": 11}),
        chunk(".", {"promptTokenCount": 9, "candidatesTokenCount": 6, "totalTokenCount": 15}),
    ]
    sse = b"".join(b"data: " + json.dumps(c).encode() + b"\r\n\r\n" for c in chunks)
    assert usage_of(sse) == Cost.of(9, 6)
    # streamGenerateContent without ?alt=sse: one JSON array of the same responses.
    assert usage_of(json.dumps(chunks, indent=2).encode()) == Cost.of(9, 6)


@pytest.mark.parametrize(
    ("usage", "used"),
    [
        # A prompt blocked by safety: no candidates, the prompt alone.
        ({"promptTokenCount": 12, "totalTokenCount": 12}, Cost.of(12, 0)),
        ({"promptTokenCount": 12}, Cost.of(12, 0)),
        # What tools added to the prompt is input; the total says the rest.
        (
            {
                "promptTokenCount": 5,
                "toolUsePromptTokenCount": 20,
                "candidatesTokenCount": 3,
                "totalTokenCount": 28,
            },
            Cost.of(25, 3),
        ),
        # Cached content is part of the prompt already.
        (
            {"promptTokenCount": 50, "cachedContentTokenCount": 40, "candidatesTokenCount": 1},
            Cost.of(50, 1),
        ),
        # A total larger than its parts: the rest is output (a kind this reader does not name).
        ({"promptTokenCount": 4, "candidatesTokenCount": 1, "totalTokenCount": 10}, Cost.of(4, 6)),
        ({"totalTokenCount": 7}, Cost.of(0, 7)),
    ],
)
def test_what_usage_metadata_counts(usage: dict[str, Any], used: Cost) -> None:
    assert usage_of(json.dumps({"candidates": [], "usageMetadata": usage}).encode()) == used


@pytest.mark.parametrize(
    "tail",
    [
        b'{"usageMetadata": {}}',
        b'{"usageMetadata": {"promptTokenCount": "12", "totalTokenCount": -3}}',
        b'{"usageMetadata": {"thoughtsTokenCount": 4}}',
        b'{"usageMetadata": null, "promptTokenCount": 3}',
        b'{"text": "a \\"usageMetadata\\": {\\"promptTokenCount\\": 3}"}',
        b'{"usageMetadata": {"promptTokenCount": 99999999999999999999}}',
        b"\xff\xfe usageMetadata",
    ],
)
def test_usage_metadata_that_says_nothing_readable_is_no_usage(tail: bytes) -> None:
    assert usage_of(tail) is None
