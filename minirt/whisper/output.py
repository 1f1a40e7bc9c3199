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
    """[{"id", "start", "end", "text", "tokens"}] of each segment, as the json format and minirt.ray write them, and
    "words": [{"start", "end", "word", "probability"}] where the segment has word timestamps."""
    out = []
    for s in segments:
        d = {"id": s.id, "start": float(s.start), "end": float(s.end), "text": s.text,
             "tokens": [int(t) for t in s.tokens]}
        if getattr(s, "words", None) is not None:
            d["words"] = [{"start": float(w.start), "end": float(w.end), "word": w.word,
                           "probability": float(w.probability)} for w in s.words]
        out.append(d)
    return out


def to_json(segments, info, max_words=None) -> str:
    """{"text", "language", "duration", "segments": [{"id", "start", "end", "text", "tokens"}]} (and "words" in each
    segment with word timestamps)."""
    doc = {"text": full_text(segments), "language": info.language, "duration": info.duration,
           "segments": segment_dicts(segments)}
    return json.dumps(doc, ensure_ascii=False, indent=2) + "\n"


def cue_text(text: str) -> str:
    """A segment's text as subtitle lines: each line stripped, the empty ones dropped (in SRT and WebVTT a blank
    line ends the cue, so a blank line inside the text would cut it and make the rest a malformed cue)."""
    return "\n".join(line.strip() for line in text.splitlines() if line.strip())


def vtt_escape(text: str) -> str:
    """What WebVTT cue text must escape: "&", "<" and ">" as character references (a "<" starts a tag, and "-->"
    may not appear in cue text)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def cues(segments, max_words=None) -> list:
    """[(start, end, text)] of the subtitles: a cue per segment, or with max_words (segments with word timestamps)
    a cue per max_words words of a segment, from its first word's start to its last word's end; text as cue_text
    makes it."""
    out = []
    for s in segments:
        if max_words and s.words:
            for k in range(0, len(s.words), max_words):
                group = s.words[k:k + max_words]
                out.append((group[0].start, group[-1].end, cue_text("".join(w.word for w in group))))
        else:
            out.append((s.start, s.end, cue_text(s.text)))
    return out


def to_srt(segments, info=None, max_words=None) -> str:
    return "".join(f"{i}\n{_timestamp(a, ',')} --> {_timestamp(b, ',')}\n{text}\n\n"
                   for i, (a, b, text) in enumerate(cues(segments, max_words), 1))


def to_vtt(segments, info=None, max_words=None) -> str:
    return "WEBVTT\n\n" + "".join(f"{_timestamp(a, '.')} --> {_timestamp(b, '.')}\n{vtt_escape(text)}\n\n"
                                  for a, b, text in cues(segments, max_words))


def render(fmt: str, segments, info, max_words=None) -> str:
    """The transcript in format fmt; max_words: srt and vtt cut a cue per that many words (word timestamps)."""
    if fmt == "txt":
        return to_txt(list(segments), info)
    return {"json": to_json, "srt": to_srt, "vtt": to_vtt}[fmt](list(segments), info, max_words)
