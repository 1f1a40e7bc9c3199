"""`minirt serve`: an OpenAI-compatible transcription server (POST /v1/audio/transcriptions and /translations) for one
Whisper model on one GPU, on Starlette and uvicorn (the 'serve' extra: pip install 'minirt[serve]').

One scheduler thread owns the model and decodes the windows of every request in flight, those that wait at the same
time together in one batch (scheduler.py); the HTTP side (app.py) reads uploads, applies the limits and renders the
answers in OpenAI's formats.

    from minirt.serve import ServeConfig, serve
    serve(WhisperModel("whisper-small", max_batch_items=16), ServeConfig("whisper-small"), port=8000)
"""
from __future__ import annotations

import signal
import socket

from .app import ServeConfig, make_app
from .scheduler import transcribe_options

__all__ = ["ServeConfig", "make_app", "serve", "listen", "transcribe_options"]


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0: a free one); OSError where it cannot be had."""
    info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = info[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(address)
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def serve(model, config: ServeConfig, sock: socket.socket, max_batch: int, log_level: str = "info") -> bool:
    """Serve until SIGTERM or SIGINT: then stop accepting connections, finish the requests in progress, and return
    True (False: the server did not start). model: a WhisperModel (max_batch_items >= max_batch); sock: a listening
    socket (listen())."""
    import uvicorn
    app = make_app(model, config, max_batch)
    server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, lifespan="on", timeout_graceful_shutdown=None))
    # uvicorn raises the signal that stopped it again once it has shut down, to end the process as that signal
    # would; the graceful shutdown is done by then, so these handlers let the command exit 0 instead
    before = {s: signal.signal(s, _ignore) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.run(sockets=[sock])
    finally:
        for s, h in before.items():
            signal.signal(s, h)
    return bool(server.started)


def _ignore(signum, frame):
    pass
