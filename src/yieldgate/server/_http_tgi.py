"""The TGI dialect and the HuggingFace Inference API, which streams like TGI.

``TgiGenerate`` serves ``/generate``, ``/generate_stream`` and TGI's
``POST /``; ``HfModels`` serves ``POST /models/{model_id}``. Both read TGI's
``inputs`` and ``parameters`` and stream TGI's token events (errors too); a
cold HuggingFace model is a 503 with an ``estimated_time``, as the Hub answers.
"""

from __future__ import annotations

from typing import Any

from yieldgate._headers import ESTIMATED_TIME_FIELD, LOADING_MESSAGE
from yieldgate.protocol import ErrorCode, YieldReason
from yieldgate.server._http_dialect_base import (
    BadRequest,
    Dialect,
    Job,
    backend_params,
    bool_field,
    int_field,
    number_field,
    object_field,
    seed_field,
    sse,
)
from yieldgate.server.governor import Yield

__all__ = ["HfModels", "TgiGenerate"]


def _tgi_job(body: dict[str, Any], model: str, stream: bool) -> Job:
    inputs = body.get("inputs")
    if not isinstance(inputs, str):
        raise BadRequest("'inputs' must be a string")
    parameters = object_field(body, "parameters")
    params = backend_params(
        int_field(parameters, "max_new_tokens", "parameters."),
        number_field(parameters, "temperature", "parameters."),
        seed_field(parameters, "seed", "parameters."),
        object_field(parameters, "backend_params", "parameters."),
    )
    return Job(prompt=inputs, params=params, stream=stream, model=model)


def _tgi_error(status: int, code: str, message: str) -> dict[str, Any]:
    # TGI's error types where one fits (a request refused as it stands is
    # "validation"), the protocol's code otherwise.
    if status < 500:
        kind = "validation"
    elif code == ErrorCode.BACKEND_ERROR:
        kind = "generation"
    else:
        kind = code
    return {"error": message, "error_type": kind, "code": code}


def _tgi_piece(index: int, text: str, *, special: bool = False) -> dict[str, Any]:
    return {
        "index": index,
        "token": {"id": index, "text": text, "logprob": 0.0, "special": special},
        "generated_text": None,
        "details": None,
    }


class _TgiStream(Dialect):
    """TGI's server-sent events (errors too), also used by the HF route."""

    def piece(self, job: Job, index: int, text: str) -> bytes:
        return sse(_tgi_piece(index, text))

    def end(self, job: Job, index: int, text: str, usage: dict[str, int]) -> bytes:
        # Like TGI's end-of-sequence token: special, and the one with the full text.
        last = _tgi_piece(index, "", special=True)
        last["generated_text"] = text
        return sse(last)

    def stream_error(self, status: int, code: str, message: str) -> bytes:
        return sse(_tgi_error(status, code, message))


class HfModels(_TgiStream):
    """``POST /models/{model_id}``: the HuggingFace Inference API."""

    family = "huggingface"

    def parse(self, body: dict[str, Any], model_id: str | None, default_model: str) -> Job:
        return _tgi_job(body, model_id or default_model, bool_field(body, "stream"))

    def ok(self, job: Job, text: str, usage: dict[str, int]) -> Any:
        return [{"generated_text": text}]

    def error(self, status: int, code: str, message: str) -> dict[str, Any]:
        return {"error": message, "code": code}

    def yield_fields(self, refusal: Yield) -> dict[str, Any]:
        return {
            "error": f"Model is overloaded ({refusal.reason}): retry in about "
            f"{refusal.retry_hint_ms} ms"
        }

    def cold_start(self, job: Job, refusal: Yield) -> dict[str, Any] | None:
        if refusal.reason != YieldReason.COLD_START:
            return None
        return {
            "error": f"Model {job.model} is {LOADING_MESSAGE}",
            ESTIMATED_TIME_FIELD: refusal.retry_hint_ms / 1000,
        }


class TgiGenerate(_TgiStream):
    """TGI's ``/generate`` (``stream`` false), ``/generate_stream`` (true) and ``POST /``
    (``stream`` None: the body says; a non-streamed answer is a one-element list)."""

    family = "tgi"
    invalid_status = 422

    def __init__(self, stream: bool | None) -> None:
        self.stream = stream

    def parse(self, body: dict[str, Any], model_id: str | None, default_model: str) -> Job:
        stream = bool_field(body, "stream") if self.stream is None else self.stream
        return _tgi_job(body, default_model, stream)

    def ok(self, job: Job, text: str, usage: dict[str, int]) -> Any:
        answer = {"generated_text": text}
        return [answer] if self.stream is None else answer

    def error(self, status: int, code: str, message: str) -> dict[str, Any]:
        return _tgi_error(status, code, message)

    def yield_fields(self, refusal: Yield) -> dict[str, Any]:
        return {"error": "Model is overloaded", "error_type": "overloaded"}
