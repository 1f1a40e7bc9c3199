"""Whisper models by name, as faster-whisper takes them: a size name (tiny.en, large-v3, turbo, ...) or a Hugging Face
repo id (ORG/NAME, a CTranslate2 or Transformers Whisper checkpoint) becomes a folder in huggingface_hub's cache,
downloaded when it is not there yet. huggingface_hub does the work, so its cache, its environment variables
(HF_HUB_CACHE, HF_HOME, HF_HUB_OFFLINE, HF_TOKEN, HF_ENDPOINT) and its offline mode apply; of a repo only the files
load_checkpoint reads are fetched. A path that exists is used as it is.

    folder = model_folder("tiny.en")                        # Systran/faster-whisper-tiny.en, cached after the first
    folder = model_folder("openai/whisper-base", revision="main", local_files_only=True)
"""
from __future__ import annotations

import json
import os
import re

from ..errors import ModelError
from .checkpoint import CHECKPOINT_FILES, checkpoint_files

# faster-whisper's names and the repos it downloads for them (faster_whisper/utils.py, _MODELS): the same name gives
# the same checkpoint, and both share the cache
MODELS = {
    "tiny.en": "Systran/faster-whisper-tiny.en",
    "tiny": "Systran/faster-whisper-tiny",
    "base.en": "Systran/faster-whisper-base.en",
    "base": "Systran/faster-whisper-base",
    "small.en": "Systran/faster-whisper-small.en",
    "small": "Systran/faster-whisper-small",
    "medium.en": "Systran/faster-whisper-medium.en",
    "medium": "Systran/faster-whisper-medium",
    "large-v1": "Systran/faster-whisper-large-v1",
    "large-v2": "Systran/faster-whisper-large-v2",
    "large-v3": "Systran/faster-whisper-large-v3",
    "large": "Systran/faster-whisper-large-v3",
    "distil-large-v2": "Systran/faster-distil-whisper-large-v2",
    "distil-medium.en": "Systran/faster-distil-whisper-medium.en",
    "distil-small.en": "Systran/faster-distil-whisper-small.en",
    "distil-large-v3": "Systran/faster-distil-whisper-large-v3",
    "distil-large-v3.5": "distil-whisper/distil-large-v3.5-ct2",
    "large-v3-turbo": "mobiuslabsgmbh/faster-whisper-large-v3-turbo",
    "turbo": "mobiuslabsgmbh/faster-whisper-large-v3-turbo",
}

# What load_checkpoint reads, and preprocessor_config.json (unread here, a few hundred bytes) so that a snapshot
# minirt fetched is complete for faster-whisper too, which asks for it
ALLOW_PATTERNS = [*CHECKPOINT_FILES, "preprocessor_config.json"]

# huggingface_hub's repo id form (validate_repo_id), with the ORG/ that faster-whisper requires of an id
_REPO_ID = re.compile(r"[\w.-]+/[\w.-]+")


# a path to a model file, never a repo id
_FILE_SUFFIXES = (".safetensors", ".bin", ".onnx", ".pt", ".npy", ".npz")


def is_model_name(name) -> bool:
    """Whether `name` (no path that exists) is a size name or has a Hugging Face repo id's form, not a file's."""
    name = os.fspath(name)
    return not os.path.exists(name) and (name in MODELS or (
        _REPO_ID.fullmatch(name) is not None and ".." not in name and "--" not in name
        and not name.startswith(".") and not name.endswith(_FILE_SUFFIXES)))


def repo_for(name: str) -> str:
    """The Hugging Face repo id that `name` stands for: a size name's repo (MODELS), or `name` itself when it has
    the ORG/NAME form. ModelError otherwise, naming the known names."""
    if name in MODELS:
        return MODELS[name]
    if is_model_name(name):
        return name
    if os.sep in name or name.startswith((".", "~")) or name.endswith(_FILE_SUFFIXES):
        raise ModelError(f"{name}: no such model folder")
    raise ModelError(f"{name}: no such model folder, and not a model name ({', '.join(MODELS)}) or a Hugging Face "
                     f"repo id (ORG/NAME); `minirt models` lists the names and the cached models")


def _hub():
    try:
        import huggingface_hub
        import huggingface_hub.constants      # the submodules this module reads, which the package loads lazily
        import huggingface_hub.errors
        import huggingface_hub.utils
    except ImportError:
        raise ModelError("Whisper models by name need the 'huggingface_hub' package: pip install 'minirt[whisper]' "
                         "(or give the model's folder)") from None
    return huggingface_hub


def _quiet_tqdm(hub):
    class Quiet(hub.utils.tqdm):
        def __init__(self, *args, **kwargs):
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)
    return Quiet


def model_folder(name_or_path, download_root=None, local_files_only: bool = False, revision=None,
                 progress: bool = False) -> str:
    """The checkpoint folder of `name_or_path`, as faster-whisper's WhisperModel finds it: the path itself when it
    exists; else a size name (MODELS) or a Hugging Face repo id, looked up in the Hugging Face cache (download_root,
    else HF_HUB_CACHE) and downloaded there when missing: only ALLOW_PATTERNS, at `revision` (a branch, tag or
    commit; default main). local_files_only=True (or HF_HUB_OFFLINE=1) never goes to the network. progress: show
    huggingface_hub's download bars on stderr (faster-whisper shows none).

    ModelError: an unknown name or a path that does not exist; a repo or revision the Hub does not have; a model
    neither cached nor downloadable (naming the repo, the cache and why: local_files_only, HF_HUB_OFFLINE, the
    network); a repo without the files minirt loads."""
    path = os.fspath(name_or_path)
    if os.path.exists(path):
        return path
    repo = repo_for(path)
    hub = _hub()
    what = repo + (f" at revision {revision!r}" if revision is not None else "")
    # an id may also be a mistyped relative path
    what += " (a Hugging Face repo id; no such model folder either)" if repo == path else f" (the model {path!r})"
    cache = os.path.expanduser(download_root) if download_root is not None else hub.constants.HF_HUB_CACHE
    errors = hub.errors
    try:
        folder = hub.snapshot_download(repo, revision=revision, cache_dir=download_root,
                                       local_files_only=local_files_only, allow_patterns=ALLOW_PATTERNS,
                                       tqdm_class=None if progress else _quiet_tqdm(hub))
    except errors.RevisionNotFoundError:
        raise ModelError(f"{what}: the Hugging Face Hub has no such revision of {repo}") from None
    except errors.RepositoryNotFoundError:     # GatedRepoError is one: a private or gated repo reads the same
        raise ModelError(f"{what}: no such repo on the Hugging Face Hub (or it is private or gated: log in with "
                         f"`hf auth login` or set HF_TOKEN)") from None
    except errors.LocalEntryNotFoundError as e:
        if getattr(e, "snapshot_path", None):      # IncompleteSnapshotError
            why = f"the cached copy {e.snapshot_path} is incomplete"
        else:
            why = f"it is not in the Hugging Face cache {cache}"
        if local_files_only:
            why += " and local_files_only=True forbids downloading it"
        elif hub.constants.HF_HUB_OFFLINE:
            why += " and HF_HUB_OFFLINE is set, which forbids downloading it"
        else:
            cause = e.__cause__ or e.__context__
            why += (" and the Hugging Face Hub cannot be reached"
                    + (f" ({type(cause).__name__}: {cause})" if cause else "") + "; check the network")
        raise ModelError(f"{what}: {why}") from None
    except Exception as e:      # the Hub's HTTP errors, its HTTP client's (httpx or requests, by version), the disk's
        raise ModelError(f"{what}: could not be downloaded into {cache} ({type(e).__name__}: {e})") from None
    if not os.path.isdir(folder):       # the repo has none of ALLOW_PATTERNS, so nothing was written
        raise ModelError(f"{what}: the repo has no file minirt loads (a Whisper model.safetensors or model.bin with "
                         f"config.json and tokenizer.json)")
    try:
        checkpoint_files(folder)
    except ModelError as e:
        raise ModelError(f"{what}: not a Whisper checkpoint minirt loads: {e}") from None
    return folder


def loadable(folder) -> tuple[str | None, str | None]:
    """(kind, None) when checkpoint folder `folder` has what load_checkpoint reads, judged by its files, its
    config.json's model_type and model.bin's spec name (nothing else is read); else (None, why not)."""
    try:
        kind, weights, _ = checkpoint_files(folder)
    except ModelError as e:
        return None, str(e).removeprefix(f"{folder}: ")
    if kind == "ctranslate2":
        from .ct2 import read_ct2_spec
        try:
            spec = read_ct2_spec(weights)
        except ModelError as e:
            return None, str(e)
        return (kind, None) if spec in ("", "WhisperSpec") else (None, f"a CTranslate2 {spec}, not Whisper")
    try:
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
            model_type = json.load(f).get("model_type", "whisper")
    except (OSError, ValueError, AttributeError) as e:
        return None, f"config.json unreadable ({e})"
    return (kind, None) if model_type == "whisper" else (None, f"model_type {model_type!r}, not whisper")


def cached_models(cache_dir=None) -> tuple[str, list]:
    """(the cache folder, [(repo id, refs, commit, bytes on disk, snapshot folder, kind or None, why not or None)]):
    every revision of every model repo in the Hugging Face cache (huggingface_hub.scan_cache_dir), with whether minirt
    loads it (loadable). An empty list when the cache does not exist yet."""
    hub = _hub()
    cache = os.path.expanduser(cache_dir) if cache_dir is not None else hub.constants.HF_HUB_CACHE
    try:
        info = hub.scan_cache_dir(cache)
    except hub.CacheNotFound:
        return cache, []
    rows = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model":
            continue
        for rev in sorted(repo.revisions, key=lambda r: r.last_modified, reverse=True):
            kind, why = loadable(str(rev.snapshot_path))
            rows.append((repo.repo_id, sorted(rev.refs), rev.commit_hash, rev.size_on_disk, str(rev.snapshot_path),
                         kind, why))
    return cache, rows
