"""The server's figures in Prometheus' text exposition format (GET /metrics): requests by route and status, request
latency, requests in the server, audio seconds transcribed, transcriptions dropped, windows a decode batch."""
from __future__ import annotations

import threading

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class Histogram:
    def __init__(self, buckets):
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)      # the last: above every bucket
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float):
        i = next((k for k, b in enumerate(self.buckets) if value <= b), len(self.buckets))
        self.counts[i] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str, labels: str = "") -> list:
        sep = "," if labels else ""
        out, total = [], 0
        for b, c in zip(self.buckets + ("+Inf",), self.counts):
            total += c
            out.append(f'{name}_bucket{{{labels}{sep}le="{b}"}} {total}')
        lab = f"{{{labels}}}" if labels else ""
        out += [f"{name}_sum{lab} {self.sum:.6f}", f"{name}_count{lab} {self.count}"]
        return out


class Metrics:
    """Counters of the server; updated from the event loop and the scheduler thread (a lock keeps them whole)."""

    def __init__(self, max_batch: int):
        self._lock = threading.Lock()
        self.requests: dict = {}            # (route, status) -> count
        self.latency: dict = {}             # route -> Histogram (transcription routes)
        self.audio_seconds = 0.0
        self.batches = Histogram(range(1, max_batch + 1))
        self.dropped_jobs = 0
        self.in_server = 0                  # admitted requests not yet answered
        self.scheduler_depth = lambda: 0

    def request(self, route: str, status: int, seconds: float, timed: bool):
        with self._lock:
            key = (route, int(status))
            self.requests[key] = self.requests.get(key, 0) + 1
            if timed:
                self.latency.setdefault(route, Histogram(LATENCY_BUCKETS)).observe(seconds)

    def audio(self, seconds: float):
        with self._lock:
            self.audio_seconds += seconds

    def dropped(self):
        with self._lock:
            self.dropped_jobs += 1

    def batch(self, windows: int):
        with self._lock:
            self.batches.observe(windows)

    def mean_latency(self) -> float:
        with self._lock:
            n = sum(h.count for h in self.latency.values())
            return sum(h.sum for h in self.latency.values()) / n if n else 0.0

    def text(self) -> str:
        with self._lock:
            out = ["# HELP minirt_serve_requests_total HTTP requests answered, by route and status code.",
                   "# TYPE minirt_serve_requests_total counter"]
            out += [f'minirt_serve_requests_total{{route="{r}",status="{s}"}} {n}'
                    for (r, s), n in sorted(self.requests.items())]
            out += ["# HELP minirt_serve_request_duration_seconds Time from a transcription request's arrival to "
                    "its answer.", "# TYPE minirt_serve_request_duration_seconds histogram"]
            for r, h in sorted(self.latency.items()):
                out += h.lines("minirt_serve_request_duration_seconds", f'route="{r}"')
            out += ["# HELP minirt_serve_requests_in_progress Transcription requests admitted and not yet answered "
                    "(the queue --max-queue bounds).", "# TYPE minirt_serve_requests_in_progress gauge",
                    f"minirt_serve_requests_in_progress {self.in_server}",
                    "# HELP minirt_serve_queue_depth Requests whose audio is with the scheduler (waiting or "
                    "decoding).", "# TYPE minirt_serve_queue_depth gauge",
                    f"minirt_serve_queue_depth {self.scheduler_depth()}",
                    "# HELP minirt_serve_audio_seconds_total Seconds of audio transcribed.",
                    "# TYPE minirt_serve_audio_seconds_total counter",
                    f"minirt_serve_audio_seconds_total {self.audio_seconds:.3f}",
                    "# HELP minirt_serve_dropped_total Transcriptions dropped unfinished because their client went "
                    "away.", "# TYPE minirt_serve_dropped_total counter",
                    f"minirt_serve_dropped_total {self.dropped_jobs}",
                    "# HELP minirt_serve_batch_windows Windows decoded together in one batch.",
                    "# TYPE minirt_serve_batch_windows histogram"]
            out += self.batches.lines("minirt_serve_batch_windows")
        return "\n".join(out) + "\n"
