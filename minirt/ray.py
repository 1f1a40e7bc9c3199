"""minirt as a Ray Data worker: callable classes for `ray.data.Dataset.map_batches` that Ray Data runs as a pool of
actors, each with its own model on the GPU Ray assigned to it (docs/scale.md has the recipe).

    import ray
    from minirt.ray import Transcriber
    ds = ray.data.from_items([{"audio": p} for p in paths])
    ds = ds.map_batches(Transcriber, fn_constructor_args=("whisper-tiny.en",), fn_constructor_kwargs={"beam_size": 1},
                        compute=ray.data.ActorPoolStrategy(size=2), num_gpus=1, batch_size=8)
    ds.write_parquet("transcripts/")

Transcriber: a column `audio` (paths, float32 16 kHz samples, or a file's bytes) in; `text`, `language`, `duration`
and `segments` (JSON) out. Runner: any model minirt runs, a column per input in, a column per output out.

The device: Vulkan knows nothing of CUDA_VISIBLE_DEVICES or ray.get_gpu_ids(), so each worker finds the Vulkan device
of the GPU Ray gave it by UUID (assigned_device). Ray itself is imported only by the caller: this module asks it
only what it assigned a Ray worker (ray.get_gpu_ids(), the worker's resources), where it is already imported.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

from .errors import DeviceError, InputError

NVIDIA_SMI = ("nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader")
# Ray custom resources that name a Vulkan device by index: a node declares one per device (ray start
# --resources='{"vk0": 1, "vk1": 1}'), and an actor given "vk1" (map_batches(..., resources={"vk1": 1})) opens device 1
RESOURCE_PREFIX = "vk"
CUSTOM_RESOURCE_HINT = ("give each actor its device through a Ray custom resource per device (a node's vk0, vk1, ...; "
                        "map_batches(..., resources={\"vk1\": 1})) or the device= argument (docs/scale.md, "
                        "\"Other drivers\")")


# -- which GPU --------------------------------------------------------------------------------------------------------

def nvml_uuids() -> dict | None:
    """{NVML index: "GPU-..." UUID} of this host's NVIDIA GPUs, from pynvml when it is installed, else from
    `nvidia-smi --query-gpu=index,uuid --format=csv,noheader`; None where neither answers (no NVIDIA driver)."""
    try:
        import pynvml
    except ImportError:
        pynvml = None
    if pynvml is not None:
        try:
            pynvml.nvmlInit()
            try:
                out = {}
                for i in range(pynvml.nvmlDeviceGetCount()):
                    u = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
                    out[i] = u.decode() if isinstance(u, bytes) else str(u)
                return out
            finally:
                pynvml.nvmlShutdown()
        except Exception:        # pynvml.NVMLError and its many subclasses: no driver here; try nvidia-smi
            pass
    try:
        r = subprocess.run(NVIDIA_SMI, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if r.returncode != 0:
        return None
    return parse_nvidia_smi(r.stdout)


def parse_nvidia_smi(text: str) -> dict:
    """{index: uuid} from the lines "0, GPU-xxxxxxxx-..." of nvidia-smi --query-gpu=index,uuid --format=csv,noheader."""
    out = {}
    for line in text.splitlines():
        index, sep, uuid = line.partition(",")
        if sep and index.strip().isdigit() and uuid.strip():
            out[int(index)] = uuid.strip()
    return out


def _ray():
    """The ray module where this process has imported and started Ray (a Ray worker, or a driver), else None."""
    ray = sys.modules.get("ray")
    return ray if ray is not None and ray.is_initialized() else None


def assigned_device(visible=None, gpu_ids=None, nvml=nvml_uuids, resources=None):
    """The device to open in this process, as Session(device=...) takes it, from what Ray gave it:

    - a custom resource vk<N> (map_batches(..., resources={"vkN": 1})): device N, by index;
    - else the first GPU in CUDA_VISIBLE_DEVICES, where Ray writes the GPUs it assigns an actor, by UUID ("GPU-..."):
      UUIDs are used as they are, indices are mapped to UUIDs through NVML (`nvml()`: {index: uuid}, nvml_uuids);
    - else None: no GPU assigned (CUDA_VISIBLE_DEVICES unset or empty, `gpu_ids` empty), minirt's default device
      (MINIRT_DEVICE, else the best GPU).

    visible: CUDA_VISIBLE_DEVICES's value (default: the environment's); gpu_ids: ray.get_gpu_ids(), resources: the
    resources Ray assigned ({name: amount}) (both by default asked of Ray where it runs). DeviceError where Ray
    assigned a GPU that cannot be named by UUID (no NVML: AMD, Intel; a MIG instance), saying what to do instead."""
    from .options import environment
    cvd = environment().cuda_visible_devices if visible is None else visible
    ray = _ray() if gpu_ids is None or resources is None else None
    if gpu_ids is None:
        gpu_ids = [str(i) for i in ray.get_gpu_ids()] if ray else []
    if resources is None:
        resources = ray.get_runtime_context().get_assigned_resources() if ray else {}
    named = sorted(int(m.group(1)) for m in (re.fullmatch(RESOURCE_PREFIX + r"(\d+)", k) for k in resources) if m)
    if named:
        return named[0]
    gpu_ids = [str(i) for i in gpu_ids]
    # CUDA reads the list up to its first invalid entry: "-1" (or "") hides every GPU
    visible = list(itertools.takewhile(lambda v: v and not v.startswith("-"), (v.strip() for v in cvd.split(","))))
    if not visible:
        if gpu_ids:
            raise DeviceError(f"Ray assigned this worker GPU {', '.join(gpu_ids)} but set no CUDA_VISIBLE_DEVICES "
                              f"(not an NVIDIA GPU?), so its Vulkan device is unknown; " + CUSTOM_RESOURCE_HINT)
        return None
    first = visible[0]
    if first.lower().startswith("mig-"):
        raise DeviceError(f"CUDA_VISIBLE_DEVICES={cvd}: a MIG instance is not a Vulkan "
                          f"device; run minirt on whole GPUs")
    if not first.isdigit():
        return first if first.lower().startswith("gpu-") else f"GPU-{first}"
    uuids = nvml()
    if not uuids:
        raise DeviceError(f"CUDA_VISIBLE_DEVICES={cvd} names GPU {first} by index, and "
                          f"without NVML (pynvml, nvidia-smi) the index cannot be mapped to a UUID, the only name "
                          f"Vulkan and CUDA share; start Ray with CUDA_VISIBLE_DEVICES listing UUIDs, or "
                          + CUSTOM_RESOURCE_HINT)
    if int(first) not in uuids:
        raise DeviceError(f"CUDA_VISIBLE_DEVICES={cvd} names GPU {first}, but NVML lists "
                          f"{', '.join(f'{i}: {u}' for i, u in sorted(uuids.items()))}")
    return uuids[int(first)]


def resolve_device(device=None):
    """`device` when given (an index or UUID, as Session takes it), else the GPU Ray assigned (assigned_device)."""
    return assigned_device() if device is None else device


# -- map_batches workers ----------------------------------------------------------------------------------------------

def _column(batch, name: str, what: str):
    if name not in batch:
        raise InputError(f"{what} needs a column '{name}'; the batch has {', '.join(map(str, batch)) or 'none'}")
    return batch[name]


def _passed_on(batch, consumed) -> dict:
    """The batch's other columns, unchanged (as numpy arrays where the batch is a pandas DataFrame)."""
    return {k: v if isinstance(v, np.ndarray) else np.asarray(v) for k, v in batch.items() if k not in consumed}


def _rows(arrays: list) -> np.ndarray:
    """One column of per-row arrays: stacked where they share a shape, else an object array of them."""
    if len({a.shape for a in arrays}) <= 1:
        return np.stack(arrays) if arrays else np.zeros((0,), np.float32)
    col = np.empty(len(arrays), dtype=object)
    for i, a in enumerate(arrays):
        col[i] = a
    return col


class Transcriber:
    """A callable class for map_batches: speech to text with minirt.whisper.WhisperModel, one model per actor.

    Constructor (fn_constructor_args / fn_constructor_kwargs): `model`, a Whisper model folder readable on every
    node, or a name or Hugging Face repo id (tiny.en, openai/whisper-small: each node finds it in its Hugging Face
    cache or downloads it there), as WhisperModel takes them (in one process a WhisperModel will do, used as it is);
    `precision`, `device`, `backend`, `download_root`, `local_files_only` and `revision`: WhisperModel's, for the
    model (device None: the GPU Ray assigned the actor, found by UUID: assigned_device); every other keyword is an
    option of WhisperModel.transcribe (beam_size, language, temperature, without_timestamps, ...), applied to every
    row.

    Batch in (batch_format "numpy" or "pandas"): a column `audio`, each row a file path, float32 16 kHz mono samples,
    or an audio file's bytes (read_binary_files' `bytes` column renamed; written to a temporary file to be read).
    Batch out: one row per input row: `text` (the segments' text, stripped), `language`, `duration` (seconds of
    audio) and `segments` (JSON: [{"id", "start", "end", "text", "tokens"}], as `minirt transcribe --format json`).
    The batch's other columns pass through; `audio` too where it holds paths (samples and bytes are dropped).

    A batch of several rows decoded greedily (beam_size=1) goes through WhisperModel.transcribe_batch: the windows of
    its files are decoded together on the GPU, each row's result the one it gets alone. A subclass that overrides
    transcribe() is called a row at a time."""

    def __init__(self, model, *, precision: str = "fp32", device=None, backend=None, download_root=None,
                 local_files_only: bool = False, revision=None, **transcribe_options):
        from .whisper.model import WhisperModel
        self.options = dict(transcribe_options)
        if isinstance(model, WhisperModel):       # in one process, a model already made
            self.device, self.model = model.device, model
            return
        self.device = resolve_device(device)
        self.model = WhisperModel(model, precision=precision, device=self.device, backend=backend,
                                  download_root=download_root, local_files_only=local_files_only, revision=revision)

    def transcribe(self, audio) -> dict:
        """One row's result: {"text", "language", "duration", "segments"}."""
        if isinstance(audio, (bytes, bytearray, memoryview)):
            with tempfile.NamedTemporaryFile(prefix="minirt-audio-") as f:
                f.write(audio)
                f.flush()
                return self.transcribe(f.name)
        if isinstance(audio, (str, np.str_, os.PathLike)):
            audio = os.fspath(audio)
        segments, info = self.model.transcribe(audio, **self.options)
        return _transcript(segments, info)

    def transcribe_rows(self, audio: list) -> list:
        """The rows' results, their windows decoded as batches (WhisperModel.transcribe_batch)."""
        with contextlib.ExitStack() as stack:
            items = []
            for a in audio:
                if isinstance(a, (bytes, bytearray, memoryview)):
                    f = stack.enter_context(tempfile.NamedTemporaryFile(prefix="minirt-audio-"))
                    f.write(a)
                    f.flush()
                    a = f.name
                items.append(os.fspath(a) if isinstance(a, (str, np.str_, os.PathLike)) else a)
            results = self.model.transcribe_batch(items, batch_size=min(len(items), self.model.max_batch_items),
                                                  **self.options)
        return [_transcript(segments, info) for segments, info in results]

    def _batched(self, rows: int) -> bool:
        return (rows > 1 and self.options.get("beam_size", 5) == 1 and type(self).transcribe is Transcriber.transcribe
                and hasattr(self.model.backend, "encode_batch"))

    def __call__(self, batch):
        audio = list(_column(batch, "audio", "Transcriber"))
        rows = self.transcribe_rows(audio) if self._batched(len(audio)) else [self.transcribe(a) for a in audio]
        paths = all(isinstance(a, (str, np.str_, os.PathLike)) for a in audio)
        out = _passed_on(batch, () if paths else ("audio",))
        for key, dtype in (("text", object), ("language", object), ("duration", np.float64), ("segments", object)):
            out[key] = np.array([r[key] for r in rows], dtype=dtype)
        return out


def _transcript(segments, info) -> dict:
    from .whisper.output import full_text, segment_dicts
    segments = list(segments)
    return {"text": full_text(segments), "language": info.language, "duration": float(info.duration),
            "segments": json.dumps(segment_dicts(segments), ensure_ascii=False)}


class Runner:
    """A callable class for map_batches: a minirt Session, one per actor.

    Constructor: `model` (an ONNX file or Whisper safetensors checkpoint, readable on every node) and Session's keywords
    (storage, precision, options, weights, local_size, ...); `device` as Session takes it, None: the GPU Ray assigned
    the actor (assigned_device).

    Batch in: a column per model input, named as the input. Where every input's first dimension is symbolic (a
    dynamic batch), a row holds one item, the input's shape without that dimension, and the batch's rows are stacked
    into one run (a batch of another row count, such as the last, is planned once more for its shape). Otherwise a
    row holds one whole input of the model's shape and each row is a run of its own. Batch out: a column per model
    output, a row per input row (without the batch dimension where the rows were stacked); the batch's other columns
    pass through, the input columns do not."""

    def __init__(self, model, *, device=None, **session_options):
        from .session import Session
        self.device = resolve_device(device)
        self.session = Session(model, device=self.device, **session_options)
        self.inputs = [i.name for i in self.session.inputs]
        self.outputs = [o.name for o in self.session.outputs]
        self.stacked = all(i.shape and not isinstance(i.shape[0], int) for i in self.session.inputs)

    def __call__(self, batch):
        cols = {n: _column(batch, n, "Runner") for n in self.inputs}
        rows = len(next(iter(cols.values())))
        if self.stacked:
            feeds = {n: np.stack([np.asarray(r, np.float32) for r in c]) for n, c in cols.items()}
            results = self.session.run(self.outputs, feeds)
            for name, y in zip(self.outputs, results):
                if y.ndim == 0 or y.shape[0] != rows:
                    raise InputError(f"output '{name}' has shape {list(y.shape)}, not a row per input row ({rows}): "
                                     f"its first dimension is not the batch")
            out = dict(zip(self.outputs, results))
        else:
            per_row = [self.session.run(self.outputs, {n: np.asarray(c[i], np.float32) for n, c in cols.items()})
                       for i in range(rows)]
            out = {name: _rows([r[k] for r in per_row]) for k, name in enumerate(self.outputs)}
        return {**_passed_on(batch, self.inputs), **out}
