"""The TGI dialect and the HuggingFace Inference API, which streams like TGI.

``TgiGenerate`` serves ``/generate``, ``/generate_stream`` and TGI's
``POST /``; ``HfModels`` serves ``POST /models/{model_id}``. Both read TGI's
``inputs`` and ``parameters`` and stream TGI's token events (errors too); a
cold HuggingFace model is a 503 with an ``estimated_time``, as the Hub answers.

``parameters.details`` adds TGI's ``details`` (``finish_reason``: ``length``,
``eos_token`` or ``stop_sequence``; ``generated_tokens``; ``seed``;
``prefill``, filled when ``decoder_input_details`` asks; ``tokens``), and a
stream's last event always carries its ``details`` (with ``input_length``).
Tokens are the served tokenizer's, UTF-8 bytes (see ``_http_dialect_base``).

A stream has one event per streamed piece: one token from the harness, a
run of characters from the simulated echo (the event's id is its last
token's). As in TGI, the last event carries the last piece with the whole
``generated_text``; a stream with no piece marked last (an empty answer)
ends with an empty special token instead.

``parameters``: ``max_new_tokens``, ``stop``, ``seed`` and ``temperature``
go to the backend; ``do_sample`` samples (at ``temperature`` 1 unless one is
given; without it a ``temperature`` of 1 is greedy, as in TGI);
``return_full_text`` puts the prompt before the generated text. A parameter
no backend here honours (``top_k``, ``typical_p``, the
penalties, ``truncate``, ``best_of``, ``watermark``, ``top_n_tokens``,
``grammar``, ``adapter_id``) is refused as a validation error unless its
value asks for nothing; so is ``decoder_input_details`` in a stream, as TGI
refuses it. Each generated token's ``logprob`` is the backend's where it computes
them (the harness: the log-probability of the distribution it was drawn from),
``null`` otherwise; the prompt's tokens (``prefill``) have ``null``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from yieldgate._headers import ESTIMATED_TIME_FIELD, LOADING_MESSAGE
from yieldgate.protocol import ErrorCode, YieldReason
from yieldgate.server._http_dialect_base import (
    BadRequest,
    Dialect,
    Generated,
    Job,
    backend_params,
    bool_field,
    chunk_text,
    chunk_token_ids,
    int_field,
    number_field,
    object_field,
    refuse_unsupported,
    seed_field,
    sse,
    stop_field,
    text_token_ids,
    tokens_of,
    top_p_field,
)
from yieldgate.server._http_logprobs import TokenLogprob, read_logprobs
from yieldgate.server.governor import Yield

__all__ = ["HfModels", "TgiGenerate"]


# TGI's parameters that no backend here honours, each with the values that ask
# for nothing (text-generation's client sends watermark false on every call).
_UNSUPPORTED: tuple[tuple[str, tuple[Any, ...]], ...] = (
    ("top_k", ()),
    ("typical_p", (1,)),
    ("repetition_penalty", (1,)),
    ("frequency_penalty", (0,)),
    ("truncate", ()),
    ("best_of", (1,)),
    ("watermark", (False,)),
    ("top_n_tokens", (0,)),
    ("grammar", ()),
    ("adapter_id", ()),
)


def _tgi_job(body: dict[str, Any], model: str, stream: bool) -> Job:
    inputs = body.get("inputs")
    if not isinstance(inputs, str):
        raise BadRequest("'inputs' must be a string")
    parameters = object_field(body, "parameters")
    where = "parameters."
    refuse_unsupported(parameters, _UNSUPPORTED, where)
    temperature = number_field(parameters, "temperature", where)
    if bool_field(parameters, "do_sample", where):
        temperature = 1.0 if temperature is None else temperature
    elif temperature == 1:
        temperature = None  # TGI samples only when asked or when the logits are changed
    params = backend_params(
        int_field(parameters, "max_new_tokens", where),
        temperature,
        seed_field(parameters, "seed", where),
        object_field(parameters, "backend_params", where),
        stop_field(parameters, "stop", where),
    )
    top_p = top_p_field(parameters, where)
    if top_p is not None:  # a backend without the feature refuses it before admission
        params["top_p"] = top_p
    details = bool_field(parameters, "details", where)
    prefill_details = bool_field(parameters, "decoder_input_details", where)
    if stream and prefill_details:
        raise BadRequest(
            "'parameters.decoder_input_details' is not supported when streaming tokens",
            "parameters.decoder_input_details",
        )
    return Job(
        prompt=inputs,
        params=params,
        stream=stream,
        model=model,
        details=details,
        prefill_details=details and prefill_details,
        return_full_text=bool_field(parameters, "return_full_text", where),
        logprobs_where_honoured=True,
    )


_TGI_FINISH = {"length": "length", "stop_sequence": "stop_sequence", "eos": "eos_token"}


def _token(
    token_id: int, text: str, *, special: bool = False, logprob: float | None = None
) -> dict[str, Any]:
    return {"id": token_id, "text": text, "logprob": logprob, "special": special}


def _logprob_of(logprobs: Sequence[TokenLogprob] | None, token_id: int) -> float | None:
    """The last of ``logprobs`` if it is ``token_id``'s (a piece's token is its last)."""
    if not logprobs or logprobs[-1].token_id != token_id:
        return None
    return logprobs[-1].logprob


def _details(job: Job, done: Generated) -> dict[str, Any]:
    """TGI's ``details`` of a whole answer."""
    prefill = []
    if job.prefill_details:
        prefill = [
            {"id": i, "text": text, "logprob": None}
            for i, text in tokens_of(job.prompt, done.prompt_token_ids)
        ]
    return {
        "finish_reason": _TGI_FINISH[done.finish_reason],
        "generated_tokens": done.usage["completion_tokens"],
        "seed": job.params.get("seed"),
        "prefill": prefill,
        "tokens": _generated_tokens(done),
    }


def _generated_tokens(done: Generated) -> list[dict[str, Any]]:
    """The generated tokens, each with the backend's log-probability where it sent them."""
    tokens = tokens_of(done.text, done.token_ids)
    logprobs = done.logprobs
    if logprobs is None or len(logprobs) != len(tokens):
        return [_token(i, text) for i, text in tokens]
    return [
        _token(i, text, logprob=lp.logprob if lp.token_id == i else None)
        for (i, text), lp in zip(tokens, logprobs, strict=True)
    ]


def _generated_text(job: Job, done: Generated) -> str:
    return job.prompt + done.text if job.return_full_text else done.text


def _with_details(job: Job, done: Generated) -> dict[str, Any]:
    answer: dict[str, Any] = {"generated_text": _generated_text(job, done)}
    if job.details:
        answer["details"] = _details(job, done)
    return answer


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


def _tgi_piece(index: int, token: dict[str, Any]) -> dict[str, Any]:
    return {"index": index, "token": token, "generated_text": None, "details": None}


# The token of an event with none of its own: an empty answer's end.
_NO_TOKEN = _token(0, "", special=True)


def _piece_token(
    text: str, token_ids: tuple[int, ...] | None, logprobs: Sequence[TokenLogprob] | None = None
) -> dict[str, Any]:
    ids = token_ids or text_token_ids(text)
    if not ids:
        return _NO_TOKEN
    return _token(ids[-1], text, logprob=_logprob_of(logprobs, ids[-1]))


class _TgiStream(Dialect):
    """TGI's server-sent events (errors too), also used by the HF route."""

    last_piece_ends = True

    def piece(self, job: Job, index: int, text: str, token_ids: tuple[int, ...] | None) -> bytes:
        return sse(_tgi_piece(index, _piece_token(text, token_ids)))

    def piece_of(self, job: Job, index: int, data: Any) -> bytes:
        token = _piece_token(chunk_text(data), chunk_token_ids(data), read_logprobs(data))
        return sse(_tgi_piece(index, token))

    def end(self, job: Job, index: int, done: Generated) -> bytes:
        return self._last(job, index, _NO_TOKEN, done)

    def end_with(
        self, job: Job, index: int, text: str, token_ids: tuple[int, ...] | None, done: Generated
    ) -> bytes:
        # The held piece is the stream's last: its token's log-probability is the answer's last.
        return self._last(job, index, _piece_token(text, token_ids, done.logprobs), done)

    def _last(self, job: Job, index: int, token: dict[str, Any], done: Generated) -> bytes:
        # Like TGI's last event: the last token, the full text and the details.
        last = _tgi_piece(index, token)
        last["generated_text"] = _generated_text(job, done)
        last["details"] = {
            "finish_reason": _TGI_FINISH[done.finish_reason],
            "generated_tokens": done.usage["completion_tokens"],
            "seed": job.params.get("seed"),
            "input_length": done.usage["prompt_tokens"],
        }
        return sse(last)

    def stream_error(self, status: int, code: str, message: str) -> bytes:
        return sse(_tgi_error(status, code, message))


class HfModels(_TgiStream):
    """``POST /models/{model_id}``: the HuggingFace Inference API."""

    family = "huggingface"

    def parse(self, body: dict[str, Any], model_id: str | None, default_model: str) -> Job:
        return _tgi_job(body, model_id or default_model, bool_field(body, "stream"))

    def ok(self, job: Job, done: Generated) -> Any:
        return [_with_details(job, done)]

    def error(
        self, status: int, code: str, message: str, param: str | None = None
    ) -> dict[str, Any]:
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

    def ok(self, job: Job, done: Generated) -> Any:
        answer = _with_details(job, done)
        return [answer] if self.stream is None else answer

    def error(
        self, status: int, code: str, message: str, param: str | None = None
    ) -> dict[str, Any]:
        return _tgi_error(status, code, message)

    def yield_fields(self, refusal: Yield) -> dict[str, Any]:
        return {"error": "Model is overloaded", "error_type": "overloaded"}
