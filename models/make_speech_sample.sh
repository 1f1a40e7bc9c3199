#!/usr/bin/env bash
# Makes models/speech-sample.wav: a few seconds of synthetic English speech, 16 kHz mono 16-bit PCM,
# the real-speech input of the Whisper tests (minirt.audio turns it into Whisper's log-mel).
#
# Made with espeak-ng 1.51 (Debian 12: apt-get install espeak-ng sox), which writes 22050 Hz, then
# resampled by sox 14.4.2 (its default high-quality `rate`, no dither so reruns give the same bytes
# on the same versions). Other versions may give slightly different audio; the tests do not depend
# on exact bytes, only on the file being committed.
set -euo pipefail
cd "$(dirname "$0")"
TEXT="Hello, this is a short test of speech recognition."
tmp=$(mktemp --suffix=.wav)
trap 'rm -f "$tmp"' EXIT
espeak-ng -v en -s 150 -w "$tmp" "$TEXT"
sox -D "$tmp" -r 16000 -c 1 -b 16 -e signed-integer speech-sample.wav
echo "wrote models/speech-sample.wav: $(soxi -D speech-sample.wav) s, $(soxi -r speech-sample.wav) Hz: \"$TEXT\""
