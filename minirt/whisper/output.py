"""Transcripts as text: plain lines, JSON, SubRip (.srt) and WebVTT (.vtt)."""
from __future__ import annotations

import json

FORMATS = ("txt", "json", "srt", "vtt")


def _timestamp(seconds: float, sep: str) -> str:
    ms = max(0, int(round(seconds * 1000)))
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def to_txt(segments, info=None) -> str:
    """One line per segment, its text without the leading space."""
    return "".join(f"{s.text.strip()}\n" for s in segments)


def full_text(segments) -> str:
    """The transcript's text: the segments' texts joined, without the leading space."""
    return "".join(s.text for s in segments).strip()


def segment_dicts(segments) -> list:
    """[{"id", "start", "end", "text", "tokens"}] of each segment, as the json format and minirt.ray write them."""
    return [{"id": s.id, "start": s.start, "end": s.end, "text": s.text, "tokens": [int(t) for t in s.tokens]}
            for s in segments]


def to_json(segments, info) -> str:
    """{"text", "language", "duration", "segments": [{"id", "start", "end", "text", "tokens"}]}."""
    doc = {"text": full_text(segments), "language": info.language, "duration": info.duration,
           "segments": segment_dicts(segments)}
    return json.dumps(doc, ensure_ascii=False, indent=2) + "\n"


def cue_text(text: str) -> str:
    """A segment's text as subtitle lines: each line stripped, the empty ones dropped (in SRT and WebVTT a blank
    line ends the cue, so a blank line inside the text would cut it and make the rest a malformed cue)."""
    return "\n".join(line.strip() for line in text.splitlines() if line.strip())


def vtt_text(text: str) -> str:
    """cue_text with what WebVTT cue text must escape: "&", "<" and ">" as character references (a "<" starts a
    tag, and "-->" may not appear in cue text)."""
    return cue_text(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def to_srt(segments, info=None) -> str:
    return "".join(f"{i}\n{_timestamp(s.start, ',')} --> {_timestamp(s.end, ',')}\n{cue_text(s.text)}\n\n"
                   for i, s in enumerate(segments, 1))


def to_vtt(segments, info=None) -> str:
    return "WEBVTT\n\n" + "".join(f"{_timestamp(s.start, '.')} --> {_timestamp(s.end, '.')}\n{vtt_text(s.text)}\n\n"
                                  for s in segments)


def render(fmt: str, segments, info) -> str:
    return {"txt": to_txt, "json": to_json, "srt": to_srt, "vtt": to_vtt}[fmt](list(segments), info)
