"""The log-mel input of a Whisper encoder run by a Session, as openai-whisper computes it:

    from minirt.audio import whisper_features
    x = whisper_features("speech.wav")        # [1, 80, 3000] float32

whisper_features is minirt.whisper.features.whisper_features, re-exported here: Whisper's audio front end has one
home, minirt/whisper/features.py (log-mel) and minirt/whisper/audio_input.py (reading and resampling files)."""
from .whisper.features import whisper_features

__all__ = ["whisper_features"]
