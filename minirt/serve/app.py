"""OpenAI's audio API over HTTP (Starlette): POST /v1/audio/transcriptions and /v1/audio/translations, GET /v1/models,
/health and /metrics. A request's audio is read here (in a worker thread) and handed to the Scheduler as a Job; the
answer is rendered in the asked response_format. Errors are OpenAI's JSON body {"error": {"message", "type", "param",
"code"}}.

An upload is copied into a file this server names (mkstemp in its own temporary folder), decoded, and removed before
the transcription starts; the name the client gives is only used in messages. A client that goes away while its
audio is being transcribed has its job dropped at the scheduler's next turn.
"""
from __future__ import annotations

import asyncio
import hmac
import logging
import math
import os
import shutil
import tempfile
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Optional

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from ..errors import InputError
from ..whisper.audio_input import load_audio
from ..whisper.features import LogMel
from ..whisper.output import full_text, to_srt, to_vtt
from .metrics import Metrics
from .scheduler import CancelledJob, Job, Scheduler, WordTimestampsUnavailable, transcribe_options

log = logging.getLogger("minirt.serve")

RESPONSE_FORMATS = ("json", "text", "srt", "verbose_json", "vtt")
GRANULARITIES = ("segment", "word")
FORM_SLACK = 1 << 20            # a request body may exceed the upload limit by this much: the form's other fields
CLIENT_GONE = 499               # the status counted for a request whose client went away (nginx's code)
AUDIO_ROUTES = ("/v1/audio/transcriptions", "/v1/audio/translations")


@dataclass
class ServeConfig:
    """model_id: the name GET /v1/models reports; max_queue: transcription requests in the server at once (more are
    answered 429); max_upload_bytes: the largest audio file (413 above it); api_key: the Bearer token every request
    must carry (None: none); options: WhisperModel.transcribe() options for every request (scheduler's
    transcribe_options names), which a request's language, prompt and temperature override."""
    model_id: str
    max_queue: int = 64
    max_upload_bytes: int = 25 << 20
    api_key: Optional[str] = None
    options: dict = field(default_factory=dict)


class ApiError(Exception):
    """An answer in OpenAI's error format."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param=None, code=None,
                 headers=None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def response(self) -> JSONResponse:
        return JSONResponse({"error": {"message": self.message, "type": self.type, "param": self.param,
                                       "code": self.code}}, status_code=self.status, headers=self.headers)


class _BodyTooLarge(Exception):
    pass


def _counting(receive, limit: int):
    """receive(), raising _BodyTooLarge once the body passes `limit` bytes."""
    seen = 0

    async def wrapped():
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise _BodyTooLarge()
        return message
    return wrapped


async def _disconnected(receive):
    """Returns when the client has gone away (the request body has been read already)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


class Server:
    def __init__(self, model, config: ServeConfig, scheduler: Scheduler, metrics: Metrics):
        self.model, self.config, self.scheduler, self.metrics = model, config, scheduler, metrics
        self.created = int(time.time())
        self.tmpdir = tempfile.mkdtemp(prefix="minirt-serve-")

    def close(self):
        self.scheduler.stop()
        shutil.rmtree(self.tmpdir, ignore_errors=True)

    # -- routes ---------------------------------------------------------------------------------------------------

    async def transcriptions(self, request: Request):
        return await self._audio(request, "transcribe")

    async def translations(self, request: Request):
        return await self._audio(request, "translate")

    async def models(self, request: Request):
        return JSONResponse({"object": "list", "data": [self._model_card()]})

    async def one_model(self, request: Request):
        if request.path_params["model"] != self.config.model_id:
            raise ApiError(404, f"The model {request.path_params['model']!r} does not exist; this server has "
                                f"{self.config.model_id!r}", param="model", code="model_not_found")
        return JSONResponse(self._model_card())

    async def health(self, request: Request):
        return JSONResponse({"status": "ok"})

    async def metrics_text(self, request: Request):
        return PlainTextResponse(self.metrics.text(), media_type="text/plain; version=0.0.4")

    def _model_card(self) -> dict:
        return {"id": self.config.model_id, "object": "model", "created": self.created, "owned_by": "minirt"}

    # -- transcription ----------------------------------------------------------------------------------------

    async def _audio(self, request: Request, task: str):
        cfg, metrics = self.config, self.metrics
        if metrics.in_server >= cfg.max_queue:
            raise ApiError(429, f"The server is busy ({cfg.max_queue} requests in progress); try again later",
                           type="rate_limit_error", code="queue_full",
                           headers={"Retry-After": str(max(1, math.ceil(metrics.mean_latency())))})
        limit = cfg.max_upload_bytes + FORM_SLACK
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise self._too_large()
        metrics.in_server += 1
        try:
            form_request = Request(request.scope, _counting(request.receive, limit))
            try:
                form = await form_request.form(max_files=1, max_fields=64)
            except _BodyTooLarge:
                raise self._too_large() from None
            try:
                params, fmt, granularities = self._params(form, task)
                upload = form.get("file")
                samples, mel = await run_in_threadpool(self._read_audio, upload)
            finally:
                await form.close()
            segments, info = await self._transcribe(request, samples, mel, params)
        finally:
            metrics.in_server -= 1
        metrics.audio(info.duration)
        return _render(fmt, task, segments, info, granularities)

    def _too_large(self) -> ApiError:
        mb = self.config.max_upload_bytes / (1 << 20)
        return ApiError(413, f"The upload is larger than this server's limit of {mb:g} MB", param="file",
                        code="file_too_large")

    def _params(self, form, task: str):
        """(transcribe() options, response_format, timestamp granularities) of the form; ApiError for a bad field."""
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise ApiError(400, "The 'file' field must be an audio file upload (multipart/form-data)", param="file")
        fmt = _text(form, "response_format") or "json"
        if fmt not in RESPONSE_FORMATS:
            raise ApiError(400, f"response_format must be one of {', '.join(RESPONSE_FORMATS)}; got {fmt!r}",
                           param="response_format")
        granularities = [_text(form, k, v) for k in ("timestamp_granularities[]", "timestamp_granularities")
                         for v in form.getlist(k)]
        bad = [g for g in granularities if g not in GRANULARITIES]
        if bad:
            raise ApiError(400, f"timestamp_granularities must be segment and/or word; got {bad[0]!r}",
                           param="timestamp_granularities[]")
        if granularities and fmt != "verbose_json":
            raise ApiError(400, "timestamp_granularities needs response_format verbose_json",
                           param="timestamp_granularities[]")
        options = dict(self.config.options, task=task, word_timestamps="word" in granularities)
        temperature = _text(form, "temperature")
        if temperature:
            try:
                t = float(temperature)
            except ValueError:
                t = float("nan")
            if not 0 <= t <= 1:
                raise ApiError(400, f"temperature must be a number from 0 to 1; got {temperature!r}",
                               param="temperature")
            if t > 0:       # 0: the server's temperatures (by default faster-whisper's fallback from 0 up to 1)
                options["temperature"] = t
        language = _text(form, "language")
        if language:
            model = self.model
            if model.is_multilingual and language not in model.supported_languages:
                raise ApiError(400, f"language {language!r} is not one of this model's (ISO-639-1 codes: "
                                    f"{', '.join(model.supported_languages)})", param="language")
            options["language"] = language
        prompt = _text(form, "prompt")
        if prompt:
            options["initial_prompt"] = prompt
        return options, fmt, granularities

    def _read_audio(self, upload: UploadFile):
        """(float32 16 kHz samples, LogMel) of the upload (in a worker thread): copied into a file of our own,
        decoded, the file removed."""
        name = upload.filename or "the upload"
        fd, path = tempfile.mkstemp(prefix="upload-", dir=self.tmpdir)
        try:
            with os.fdopen(fd, "wb") as out:
                upload.file.seek(0)
                shutil.copyfileobj(upload.file, out, 1 << 20)
            samples = load_audio(path)
        except InputError as e:
            raise ApiError(400, f"Could not read the audio: {str(e).replace(path, repr(name))}", param="file",
                           code="invalid_audio") from None
        finally:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        return samples, LogMel(samples, self.model.n_mels)

    async def _transcribe(self, request: Request, samples, mel, options: dict):
        loop = asyncio.get_running_loop()
        answer = loop.create_future()

        def settle(result, error):
            if not answer.done():
                if error is not None:
                    answer.set_exception(error)
                else:
                    answer.set_result(result)

        job = Job(samples, mel, transcribe_options(**options), lambda result, error: loop.call_soon_threadsafe(settle, result, error))
        try:
            self.scheduler.submit(job)
        except RuntimeError:
            raise ApiError(503, "The server is shutting down", type="server_error", code="shutting_down") from None
        gone = asyncio.ensure_future(_disconnected(request.receive))
        try:
            await asyncio.wait({answer, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if not answer.done():
            self.scheduler.cancel(job)
            raise _ClientGone()
        try:
            return answer.result()
        except WordTimestampsUnavailable as e:
            raise ApiError(400, f"Word timestamps are not available with this server's model ({e})",
                           param="timestamp_granularities[]", code="unsupported") from None
        except CancelledJob:
            raise _ClientGone() from None
        except (ValueError, InputError) as e:
            raise ApiError(400, str(e)) from None


class _ClientGone(Exception):
    pass


def _text(form, key: str, value=None) -> str:
    value = form.get(key) if value is None else value
    if isinstance(value, UploadFile):
        raise ApiError(400, f"The {key!r} field must be text, not a file", param=key)
    return (value or "").strip()


def _render(fmt: str, task: str, segments, info, granularities) -> Response:
    text = full_text(segments)
    usage = {"type": "duration", "seconds": math.ceil(info.duration)}
    if fmt == "json":
        return JSONResponse({"text": text, "usage": usage})
    if fmt == "text":
        return PlainTextResponse(text + "\n")
    if fmt == "srt":
        return PlainTextResponse(to_srt(segments))
    if fmt == "vtt":
        return PlainTextResponse(to_vtt(segments), media_type="text/vtt")
    doc = {"task": task, "language": info.language, "duration": info.duration, "text": text}
    if not granularities or "segment" in granularities:
        doc["segments"] = [
            {"id": s.id, "seek": s.seek, "start": s.start, "end": s.end, "text": s.text,
             "tokens": [int(t) for t in s.tokens], "temperature": s.temperature, "avg_logprob": s.avg_logprob,
             "compression_ratio": s.compression_ratio, "no_speech_prob": s.no_speech_prob} for s in segments]
    if "word" in granularities:
        doc["words"] = [{"word": w.word.strip(), "start": w.start, "end": w.end}
                        for s in segments for w in (s.words or ())]
    doc["usage"] = usage
    return JSONResponse(doc)


# -- the ASGI stack -------------------------------------------------------------------------------------------

class _Metered:
    """Counts every answer by route and status, and times the transcription routes."""

    def __init__(self, app, metrics: Metrics, routes):
        self.app, self.metrics, self.routes = app, metrics, set(routes)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, status = time.monotonic(), [500]

        async def sending(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)
        try:
            await self.app(scope, receive, sending)
        finally:
            route = scope["path"] if scope["path"] in self.routes else "other"
            self.metrics.request(route, status[0], time.monotonic() - start, route in AUDIO_ROUTES)


class _Authorized:
    """Every request must carry `Authorization: Bearer <key>` (401 otherwise)."""

    def __init__(self, app, key: str):
        self.app, self.key = app, key.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            auth = dict(scope.get("headers") or ()).get(b"authorization", b"")
            scheme, _, token = auth.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), self.key):
                error = ApiError(401, "Incorrect API key provided" if auth else
                                 "Missing API key: send 'Authorization: Bearer <key>'", code="invalid_api_key",
                                 headers={"WWW-Authenticate": "Bearer"})
                return await error.response()(scope, receive, send)
        return await self.app(scope, receive, send)


def make_app(model, config: ServeConfig, max_batch: int) -> Starlette:
    """The ASGI application serving `model` (a WhisperModel) with a Scheduler of batches up to max_batch windows."""
    metrics = Metrics(max_batch)
    scheduler = Scheduler(model, max_batch, metrics)
    metrics.scheduler_depth = lambda: scheduler.depth
    server = Server(model, config, scheduler, metrics)

    @asynccontextmanager
    async def lifespan(app):
        try:
            yield
        finally:
            await run_in_threadpool(server.close)

    routes = [Route("/v1/audio/transcriptions", server.transcriptions, methods=["POST"]),
              Route("/v1/audio/translations", server.translations, methods=["POST"]),
              Route("/v1/models", server.models, methods=["GET"]),
              Route("/v1/models/{model:path}", server.one_model, methods=["GET"]),
              Route("/health", server.health, methods=["GET"]),
              Route("/metrics", server.metrics_text, methods=["GET"])]

    async def api_error(request, exc: ApiError):
        return exc.response()

    async def http_error(request, exc: HTTPException):
        return ApiError(exc.status_code, str(exc.detail), headers=dict(exc.headers or {})).response()

    async def client_gone(request, exc):
        return Response(status_code=CLIENT_GONE)

    async def internal(request, exc):
        log.error("request failed", exc_info=exc)
        return ApiError(500, f"Internal error: {type(exc).__name__}: {exc}", type="server_error").response()

    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={
        ApiError: api_error, HTTPException: http_error, _ClientGone: client_gone, Exception: internal})
    app.state.server = server
    known = [r.path for r in routes if "{" not in r.path]
    stack = _Authorized(app, config.api_key) if config.api_key else app
    return _Metered(stack, metrics, known)
