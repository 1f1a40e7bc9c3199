"""A DecoderBackend whose encoder and decoder run on Vulkan: a minirt Program (minirt/program.py) of entry points
over state tensors that stay on the GPU (minirt/whisper/decoder_graph.py):

  encode(features)  the encode entry point: the encoder, then every decoder layer's cross-attention keys and values
                    into state; nothing comes back.
  set_encoder_output(hidden)
                    the cross entry point: those keys and values from an encoder output computed elsewhere.
  step(tokens)      a step entry point, one submission of a recorded command buffer: the tokens go in (int32), the
                    position goes in through the parameter block, the key/value cache grows by a row on the GPU,
                    and only the logits come back. step1 for one row (greedy decoding), stepB for up to max_batch
                    (beam search; fewer rows are padded and their logits dropped).
  start(prompt, ..) a prompt entry point: the whole prompt in one submission (up to 8 or 232 tokens, padded), the
                    logits at two of its positions back; a one-token prompt, or one that asks for more
                    positions, goes a token at a time through step1.
  reorder(rows)     the reorder entry point (a gather of cache rows on the GPU), or nothing where rows only drops
                    the last rows.
  step_select(tokens, suppress, control)
                    step1_select: a one-row step and greedy decoding's pick of the next token on the GPU
                    (TokenSelect, the logit filters as masks: filters.GpuMasks); only the token id, its
                    log-probability and the no-speech figures come back, 16 bytes instead of the logits.

A batch of independent sequences (BatchDecoder in backend.py: many windows decoded together, each at its own
position, finishing on its own) runs on entry points of its own (decoder_graph.batch_graphs: bencode and bencodeK
for fewer windows, bstepN, bstepN_select for step_rows_select, breorder) over state of its own, planned at
construction (max_items) or by add_batch() when first needed, fitted to the device's limits (plan_batch: fewer
sequences, or the encoder on chunks of the windows, where the device cannot hold them all). encode_batch runs the
smallest encoder entry point that holds the windows; those entry points share one activation arena.

The cache holds max_batch rows (the most a search uses: beam_size, or best_of when sampling; 5 by default). The step
entry points share their weights on the GPU (minirt/program.py). At precision fp16 every plan runs its kernels' half
variants (docs/architecture.md, Precision): weights, activations and the state (the key/value cache, the cross keys
and values) in 16-bit storage, fp32 arithmetic; the features, the encoder output and the logits stay float32 for the
host, the token ids int32."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import UnsupportedError
from ..ops import token_select as ts_op
from . import decoder_graph


DEFAULT_MAX_BATCH = 5      # cache rows: beam_size and best_of up to this (faster-whisper's defaults)


def plan_program(weights: dict, config: dict, profile, max_batch: int = DEFAULT_MAX_BATCH, options=None,
                 packs=None) -> dict:
    """{entry point: Plan} of the Whisper program (decoder_graph.py) for a device profile, in buffer storage at the
    precision of options (fp32 by default, or fp16; options: Session options for planning). packs: a Packs to share
    with a later plan_batch of the same weights (its encoders then reuse these packed weights)."""
    graphs = decoder_graph.program_graphs(weights, decoder_graph.dims_of(weights, config), int(max_batch))
    return _plans(graphs, profile, options, packs=packs)


def _plans(graphs: dict, profile, options, share_with: dict | None = None, packs=None) -> dict:
    """{entry point: Plan} of graphs; a constant equal to one of an earlier plan (or of share_with's), by name,
    dtype, shape and bytes, holds that plan's array (_share_data). packs: the planning call's Packs (each weight
    packed once, the same array in every plan that packs it; a fresh one where not given)."""
    from ..driver import plan_graph
    from ..options import Options
    from ..planner.lower import Packs
    opts = Options.of(options)
    if opts.storage not in ("auto", "buffer"):
        raise UnsupportedError(f"the Vulkan Whisper program runs in buffer storage (asked: {opts.storage})")
    opts = opts.replace(storage="buffer")
    seen, plans, packs = {}, {}, Packs() if packs is None else packs
    for p in (share_with or {}).values():
        _share_data(p, seen)
    for k, g in graphs.items():
        plans[k] = plan_graph(g, profile, "buffer", opts, packs=packs)[1]
        _share_data(plans[k], seen)
    return plans


def _share_data(plan, seen: dict) -> None:
    """Point plan's constants at the equal arrays in seen {(name, dtypes, shapes): [arrays]}, adding the others: the
    plans of a program hold the same packed weights many times over (a batch's encoder entry points each pack the
    whole encoder's), gigabytes of host memory at the large models' shapes, where one copy does."""
    for t in plan.tensors.values():
        if t.data is None:
            continue
        known = seen.setdefault((t.name, t.dtype, tuple(t.shape), t.data.dtype, t.data.shape), [])
        same = next((a for a in known if a is t.data), None)     # (packed weights: one array, Packs)
        same = same if same is not None else next((a for a in known if np.array_equal(a, t.data)), None)
        if same is None:
            known.append(t.data)
        else:
            t.data = same


def plan_batch(weights: dict, config: dict, profile, max_items: int, options=None, program=None,
               packs=None) -> dict:
    """{entry point: Plan} of the batch entry points (decoder_graph.batch_graphs), as plan_program plans, fitted to
    the device (fit_batch): they hold fewer than max_items sequences where the device cannot hold their state
    (plans["bstep1"].tensors["bself_k.0"].shape[0] says how many), and bencode takes fewer windows a run where it
    cannot hold the encoder's activations for all of them (its input's first dimension). bencodeK, the encoder of
    K < those windows (decoder_graph.encode_sizes), is there where its kernels are bencode's (_encode_ladder: a
    window's keys and values then come out bit for bit as bencode's); bencode's notes name them. program: the plans
    of the one-sequence program on this device and options (plan_program's; planned here where not given). packs:
    the Packs plan_program used for it, if any (each weight is then packed once for both)."""
    from ..options import Options
    from ..planner.lower import Packs
    dm = decoder_graph.dims_of(weights, config)
    opts = Options.of(options)
    weights = decoder_graph.shared_weights(weights)     # one transposed copy of a weight for all the graphs
    packs = Packs() if packs is None else packs     # every plan of this call (and each retry) packs a weight once
    if program is None:
        program = _plans({"encode": decoder_graph.encoder_graph(weights, dm)}, profile, opts, packs=packs)
    items, chunk, notes = fit_batch(dm, profile, int(max_items), program, opts.precision)
    while True:
        graphs = decoder_graph.batch_graphs(weights, dm, items, chunk if chunk < items else 0)
        for n in notes:
            graphs["bencode"].note("batch", n)
        try:
            plans = _plans(graphs, profile, opts, program, packs)
        except UnsupportedError:
            if chunk <= 1:      # the estimate holds for the encoder, whose activations are linear in windows
                raise
            chunk = max(1, chunk // 2)
            notes = notes[:1] + [f"encoder chunk halved to {chunk} windows: the plan of more did not fit"]
            continue
        return _encode_ladder(plans, chunk)


def _encode_ladder(plans: dict, chunk: int) -> dict:
    """plans without the bencodeK whose kernels differ from bencode's (a K-split, a split attention or another tile
    where fewer windows leave the GPU emptier: its windows would not come out bit for bit as bencode's), and bencode's
    notes saying which encoder entry points there are."""
    full = plans["bencode"]
    made, dropped = [], []
    for k in decoder_graph.encode_sizes(chunk)[:-1]:
        name = decoder_graph.encode_entry(k, chunk)
        if _kernels(plans[name]) == _kernels(full):
            made.append(k)
        else:
            dropped.append(k)
            del plans[name]
    if made or dropped:
        entries = ", ".join(decoder_graph.encode_entry(k, chunk) for k in made) or "none"
        full.notes.setdefault("batch", []).append(
            f"encoder entry points for fewer windows (a run takes the smallest that holds them): {entries}, "
            f"beside bencode's {chunk}; they share bencode's activation memory")
    if dropped:
        full.notes["batch"].append(
            f"not made for {', '.join(map(str, dropped))} windows: the planner picks other kernels there than for "
            f"{chunk} (K splits, split attention or other tiles where fewer windows fill the GPU less), so a window's "
            f"keys and values would not be bencode's bit for bit")
    return plans


# Kernel families (Dispatch.family) whose invocations use no shared memory or subgroup operations, each computing its
# own outputs: elementwise, copies, direct convolutions (glsl/conv.comp, conv_dw.comp)
LOCAL_FREE = ("elementwise", "copy", "conv")


def _kernels(plan) -> tuple:
    """What decides a window's arithmetic in an encoder plan: per node, its dispatches' kernels, specialization
    constants and local sizes (a grid's size only says how many windows run; the local size of a kernel whose
    invocations share nothing, LOCAL_FREE, changes nothing they compute); the cross keys' and values' projections
    by kernel alone (bencode of the whole batch writes them into the state, a chunk's merge them and copy their
    rows there)."""
    nodes, cross = {}, set()
    for d in plan.dispatches:
        if d.node.startswith(decoder_graph.BATCH_CROSS):
            if not d.kernel.startswith("copy_rows"):
                cross.add(d.kernel)
        else:
            local = () if d.family in LOCAL_FREE else tuple(d.local_size or ())
            nodes.setdefault(d.node, set()).add((d.kernel, tuple(d.spec), local))
    return nodes, cross


def fit_batch(dm, profile, max_items: int, program: dict, precision: str = "fp32") -> tuple:
    """(sequences, encoder windows a run, [planner notes]) of a batch of up to max_items sequences on `profile`:
    as many sequences as the batch's state (decoder_graph.batch_state_bytes) lets fit maxStorageBufferRange,
    maxMemoryAllocationSize and the device heap beside the program's weights and activations, and as many windows a
    run of the encoder as its activations (program["encode"], the encoder of one window: each window of a batch
    adds its tensors) let fit (minirt.planner.memory_plan.items_that_fit). The notes say what bound them."""
    from ..plan import CONSTANT, STATE, WEIGHT
    from ..planner.memory_plan import items_that_fit, per_item
    itemsize = 2 if precision == "fp16" else 4
    held = {}
    for plan in program.values():       # weights and constants once (shared by name), every entry's activations
        for t in plan.tensors.values():
            if t.role in (WEIGHT, CONSTANT, STATE) and not t.view_of:
                held[t.name] = t.nbytes
    held_bytes = sum(held.values()) + sum(per_item(p, profile)[2] for p in program.values() if p.dispatches)
    largest, total = decoder_graph.batch_state_bytes(dm, itemsize)
    items, why = items_that_fit(profile, max_items, largest, heap=total, reserved=held_bytes)
    if not items:
        raise UnsupportedError(f"a batch's state tensors ({largest / 2**20:.1f} MiB a sequence) do not fit "
                               f"the maxStorageBufferRange or maxMemoryAllocationSize of '{profile.name}'")
    notes = [f"a batch of {items} sequences, not {max_items}: for its state, {why}"] if items < max_items else []
    big, big_bytes, arena_bytes = per_item(program["encode"], profile)
    chunk, why = items_that_fit(profile, items, big_bytes, arena_bytes, arena_bytes, held_bytes + items * total)
    if chunk < items:       # as few runs as that takes, of equal windows (16 in 2 runs of 8, not 14 and 14)
        chunk = -(-items // -(-items // max(1, chunk)))
        notes.append(f"the encoder runs on {chunk} of the batch's {items} windows at a time (input_features "
                     f"[{chunk}, ...], parameter {decoder_graph.CHUNK_ROW}: the chunk's first row of the bcross_* "
                     f"state): {why} (the largest: '{big.name}' {list(big.shape)} for one window)")
    return items, max(1, chunk), notes


class VulkanBackend:
    """weights and config as checkpoint.load_checkpoint returns them; precision: "fp32" or "fp16" (16-bit storage,
    fp32 arithmetic; it overrides options' precision); device: a Vulkan device index or UUID (None: the default
    one); max_batch: cache rows; max_items: sequences of a batch (BatchDecoder; 0: none until add_batch()); options:
    minirt Session options for planning (the storage is buffer); profile: GPU time per dispatch
    (self.program.dispatch_times(entry)); gpu_select (an attribute too): greedy decoding at temperature 0
    (decoding.generate_batch, search.greedy) picks each step's tokens on the GPU where its filters are masks
    (step_select, step_rows_select); False: every step's logits come back and the host picks (to compare)."""

    def __init__(self, weights: dict, config: dict, precision: str = "fp32", device=None,
                 max_batch: int = DEFAULT_MAX_BATCH,
                 options=None, profile=False, max_items: int = 0, gpu_select: bool = True):
        from ..options import Options
        from ..program import Program
        from ..driver import get_device
        if precision not in ("fp32", "fp16"):
            raise ValueError(f"precision must be 'fp32' or 'fp16', got {precision!r}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        self.dims = dm = decoder_graph.dims_of(weights, config)
        self.n_mels, self.n_vocab, self.n_text_ctx = dm.n_mels, dm.n_vocab, dm.n_text_ctx
        self.multilingual = self.n_vocab >= 51865
        self.max_batch = int(max_batch)
        self.gpu_select = bool(gpu_select)
        # the step entry point (and its rows) for each row count 1 .. max_batch: the smallest that holds them
        sizes = sorted({1, self.max_batch})
        self._entries = [None] + [next((decoder_graph.step_entry(n), n) for n in sizes if n >= r)
                                  for r in range(1, self.max_batch + 1)]
        self._prompt_sizes = decoder_graph.prompt_sizes(dm)
        opts = Options.of(options).replace(precision=precision)
        self._opts = opts
        self.precision = precision
        self.name = f"Vulkan ({'float16' if precision == 'fp16' else 'float32'})"
        from ..planner.lower import Packs
        # kept for add_batch: its encoders pack the same weights as the program's (the packed arrays are the plans')
        self._packs = Packs()
        self.plans = plan_program(weights, config, get_device(device).profile, self.max_batch, opts, self._packs)
        self.program = Program(self.plans, device, timeout_s=opts.timeout_s, profile=profile)
        self._len = 0             # positions in the cache
        self._batch = 0           # rows in use
        self._encoded = False
        self.max_items = 0        # the batch entry points' sequences (0: not made yet)
        self._items = 0           # sequences encoded by encode_batch
        self._row_item, self._row_len = [], []
        if max_items:
            self.add_batch(weights, config, max_items)

    # -- BatchDecoder ------------------------------------------------------------------------------------------
    def add_batch(self, weights: dict, config: dict, max_items: int = 16) -> None:
        """Plan and make the batch entry points (decoder_graph.batch_graphs) for up to max_items sequences, from the
        same weights and config as the backend's (a weight already on the GPU is shared); nothing where they exist
        for as many."""
        if self.max_items:
            if max_items > self.max_items:
                raise ValueError(f"this backend's batch holds {self.max_items} sequences; {max_items} asked")
            return
        if not 1 <= max_items <= decoder_graph.MAX_ITEMS:
            raise ValueError(f"max_items must be 1 to {decoder_graph.MAX_ITEMS}, got {max_items}")
        plans = plan_batch(weights, config, self.program.device.profile, max_items, self._opts, self.plans,
                           self._packs)
        self._packs = None      # the plans hold what it made
        chunk = plans["bencode"].tensors["input_features"].shape[0]
        sizes = [k for k in decoder_graph.encode_sizes(chunk) if decoder_graph.encode_entry(k, chunk) in plans]
        self.program.add(plans, share=[decoder_graph.encode_entry(k, chunk) for k in sizes])
        self.plans.update(plans)
        items = plans["breorder"].tensors["rows"].shape[0]
        self._batch_steps = decoder_graph.batch_step_sizes(items)
        self._encode_chunk = chunk
        self.encode_sizes = sizes     # the encoder entry points' windows (plan_batch): a run takes the smallest
        self.max_items = int(items)

    def encode_batch(self, features: np.ndarray) -> None:
        x = np.asarray(features, np.float32)
        if not self.max_items:
            raise RuntimeError("this backend has no batch entry points (VulkanBackend(max_items=...) or add_batch())")
        want = (self.n_mels, self.dims.frames)
        if x.ndim != 3 or tuple(x.shape[1:]) != want or not 1 <= len(x) <= self.max_items:
            raise ValueError(f"features must be [1 to {self.max_items}, {want[0]}, {want[1]}] (max_items "
                             f"{self.max_items}), got {list(x.shape)}")
        chunk = self._encode_chunk
        for at in range(0, len(x), chunk):
            # up to a chunk of windows a run (plan_batch), in the smallest encoder entry point that holds them, the
            # rest padded; a run of fewer windows than the batch writes its rows of the batch's state from row0 on
            part = x[at:at + chunk]
            k = next(k for k in self.encode_sizes if k >= len(part))
            full = np.zeros((k,) + want, np.float32)
            full[:len(part)] = part
            entry = decoder_graph.encode_entry(k, chunk)
            params = {decoder_graph.CHUNK_ROW: at * self.dims.n_audio_ctx} if self.plans[entry].params else {}
            self.program.run(entry, {"input_features": full}, params)
        self._items, self._row_item, self._row_len = len(x), [], []

    def start_rows(self, items) -> None:
        items = [int(i) for i in items]
        if not self._items:
            raise RuntimeError("start_rows() before encode_batch()")
        if not 1 <= len(items) <= self.max_items or min(items) < 0 or max(items) >= self._items:
            raise ValueError(f"start_rows() items {items}: 1 to {self.max_items} rows, each an item of the "
                             f"{self._items} encoded")
        self._row_item, self._row_len = items, [0] * len(items)

    def step_rows(self, tokens: np.ndarray) -> np.ndarray:
        return self._step_rows(tokens)[:, 0]

    def step_rows_select(self, tokens: np.ndarray, suppress: np.ndarray, control: np.ndarray) -> np.ndarray:
        """step_rows(), then greedy decoding's pick from each row's logits on the GPU (bstepN_select: TokenSelect,
        minirt/ops/token_select.py), the logit filters as masks (suppress and control [rows, CONTROL] int32:
        filters.GpuMasks): [rows, 4] float32, the token id, its log-probability and the no-speech figures."""
        return self._step_rows(tokens, (suppress, control))

    def _step_rows(self, tokens, select=None):
        tokens = np.asarray(tokens).reshape(-1)
        n = len(self._row_item)
        if not n or len(tokens) != n:
            raise ValueError(f"step_rows() got {len(tokens)} tokens for {n} rows")
        if max(self._row_len) >= self.n_text_ctx:
            raise ValueError(f"the decoder has {self.n_text_ctx} positions; {max(self._row_len) + 1} needed")
        self._check_tokens(int(tokens.min()), int(tokens.max()))
        rows = next(k for k in self._batch_steps if k >= n)
        full = np.zeros((rows, 1), np.int32)
        full[:n, 0] = tokens
        params = {f"pos.{r}": 0 for r in range(rows)}       # padding rows write row r >= n at 0: no live row's
        params.update({f"item.{r}": 0 for r in range(rows)})
        for r in range(n):
            params[f"pos.{r}"], params[f"item.{r}"] = self._row_len[r], self._row_item[r]
        out = self._run(f"bstep{rows}", {"tokens": full}, params, select, n)
        self._row_len = [k + 1 for k in self._row_len]
        return out[:n]

    def reorder_rows(self, rows: np.ndarray) -> None:
        rows = np.asarray(rows, np.int64).reshape(-1)
        n, old = len(rows), len(self._row_item)
        if not 1 <= n <= self.max_items or rows.min() < 0 or rows.max() >= old:
            raise ValueError(f"reorder_rows() rows {rows.tolist()} for {old} rows (at most {self.max_items})")
        if not np.array_equal(rows, np.arange(n)):      # else: the first n rows stay where they are
            full = np.arange(self.max_items, dtype=np.int32)
            full[:n] = rows
            self.program.run("breorder", {"rows": full}, {"len": max(self._row_len)})
        self._row_item = [self._row_item[r] for r in rows]
        self._row_len = [self._row_len[r] for r in rows]

    # -- word timestamps ---------------------------------------------------------------------------------------
    def add_align(self, heads, eot: int, weights) -> None:
        """Plan and make the align entry points (decoder_graph.align_graphs) for these alignment heads [(layer,
        head)] and text tokens below eot; weights: the checkpoint's weights (a dict, or a function returning them;
        a weight already on the GPU is shared). Nothing where they exist."""
        if getattr(self, "align_heads", None) is not None:
            return
        heads = [(int(a), int(b)) for a, b in heads]
        if callable(weights):
            weights = weights()
        graphs = decoder_graph.align_graphs(weights, self.dims, heads, int(eot), self.max_batch)
        plans = _plans(graphs, self.program.device.profile, self._opts)
        self.program.add(plans)
        self.plans.update(plans)
        self._align_sizes = decoder_graph.align_sizes(self.dims)
        self.align_heads, self.align_eot = heads, int(eot)

    def align(self, tokens: Sequence[int], num_frames: int):
        """ReferenceBackend.align on the GPU (an alignP entry point) for the window encode() put there: (the
        alignment heads' cross-attention probabilities over the first num_frames // 2 encoder positions, [heads,
        len(tokens), num_frames // 2] float32; each next token's probability among the text tokens, [len(tokens)]
        float32, 0 where it is not a text token, the last of token 0). Row 0 of the cache is overwritten."""
        if not self._encoded:
            raise RuntimeError("align() before encode()")
        if getattr(self, "align_heads", None) is None:
            raise RuntimeError("align() before add_align()")
        tokens = [int(t) for t in tokens]
        n = int(num_frames) // 2
        if not tokens or len(tokens) > self._align_sizes[-1] or not 1 <= n <= self.dims.n_audio_ctx:
            raise ValueError(f"align() of {len(tokens)} tokens (1 to {self._align_sizes[-1]}) over {n} encoder "
                             f"positions (1 to {self.dims.n_audio_ctx})")
        self._check_tokens(min(tokens), max(tokens))
        slots = next(k for k in self._align_sizes if k >= len(tokens))
        feed = np.zeros((1, slots), np.int32)
        feed[0, :len(tokens)] = tokens
        nxt = np.array(tokens[1:] + [0] + [0] * (slots - len(tokens)), np.int64)
        text = nxt < self.align_eot
        picks = (np.arange(slots) * self.align_eot + np.where(text, nxt, 0)).astype(np.int32)
        mask = np.full(self.dims.n_audio_ctx, -np.inf, np.float32)
        mask[:n] = 0
        out = self.program.run(decoder_graph.align_entry(slots), {"tokens": feed, "key_mask": mask, "picks": picks},
                               {"pos": 0})
        self._len, self._batch = 0, 0
        T = len(tokens)
        probs = np.where(text[:T], np.asarray(out["token_probs"]).reshape(-1)[:T], 0).astype(np.float32)
        return np.ascontiguousarray(out["attention"][:, :T, :n], np.float32), probs

    # -- DecoderBackend ----------------------------------------------------------------------------------------
    def encode(self, features: np.ndarray) -> None:
        x = np.asarray(features, np.float32)
        if x.ndim == 3 and x.shape[0] == 1:
            x = x[0]
        want = (self.n_mels, self.dims.frames)
        if x.shape != want:
            raise ValueError(f"features must be {list(want)}, got {list(x.shape)}")
        self.program.run("encode", {"input_features": np.ascontiguousarray(x[None])})
        self._encoded, self._len, self._batch = True, 0, 0

    def set_encoder_output(self, hidden: np.ndarray) -> None:
        """What encode() does after its encoder, from an encoder output computed elsewhere: [n_audio_ctx,
        d_model] (or with a leading 1) float32, the encoder's final layer norm applied."""
        x = np.asarray(hidden, np.float32)
        if x.ndim == 3 and x.shape[0] == 1:
            x = x[0]
        want = (self.dims.n_audio_ctx, self.dims.d_model)
        if x.shape != want:
            raise ValueError(f"the encoder output must be {list(want)}, got {list(x.shape)}")
        self.program.run("cross", {"encoder_output": np.ascontiguousarray(x[None])})
        self._encoded, self._len, self._batch = True, 0, 0

    def start(self, prompt: Sequence[int], positions: Sequence[int]) -> np.ndarray:
        if not self._encoded:
            raise RuntimeError("start() before encode()")
        prompt, positions = [int(t) for t in prompt], [int(p) for p in positions]
        if not prompt:
            raise ValueError("the prompt is empty")
        if any(not 0 <= p < len(prompt) for p in positions):
            raise ValueError(f"positions {positions} are not all in the prompt of {len(prompt)} tokens")
        self._len, self._batch = 0, 1
        if 1 < len(prompt) <= self._prompt_sizes[-1] and len(set(positions)) <= decoder_graph.PROMPT_PICKS:
            return self._prompt(prompt, positions)
        wanted, rows = set(positions), {}
        for i, t in enumerate(prompt):
            logits = self._step(np.array([t]))
            if i in wanted:
                rows[i] = np.array(logits[0])
        return np.stack([rows[p] for p in positions]) if positions else np.zeros((0, self.n_vocab), np.float32)

    def step(self, tokens: np.ndarray) -> np.ndarray:
        tokens = np.asarray(tokens).reshape(-1)
        if not self._batch or len(tokens) != self._batch:
            raise ValueError(f"step() got {len(tokens)} tokens for a batch of {self._batch}")
        return self._step(tokens)

    def step_select(self, tokens: np.ndarray, suppress: np.ndarray, control: np.ndarray) -> np.ndarray:
        """step() of one row, then greedy decoding's pick from its logits on the GPU (step1_select), as
        step_rows_select: [1, 4] float32."""
        tokens = np.asarray(tokens).reshape(-1)
        if self._batch != 1 or len(tokens) != 1:
            raise ValueError(f"step_select() takes one token for a batch of 1, got {len(tokens)} for {self._batch}")
        return self._step(tokens, (suppress, control))

    def reorder(self, rows: np.ndarray) -> None:
        rows = np.asarray(rows, np.int64).reshape(-1)
        n = len(rows)
        if not 1 <= n <= self.max_batch:
            raise ValueError(f"reorder() to {n} rows; this backend holds 1 to {self.max_batch} "
                             f"(VulkanBackend(max_batch=...))")
        if rows.min() < 0 or rows.max() >= max(self._batch, 1):
            raise ValueError(f"reorder() rows {rows.tolist()} for a batch of {self._batch}")
        if not np.array_equal(rows, np.arange(n)):      # else: the first n rows stay where they are
            full = np.arange(self.max_batch, dtype=np.int32)
            full[:n] = rows
            self.program.run("reorder", {"rows": full}, {"len": self._len})
        self._batch = n

    # -- the rest --------------------------------------------------------------------------------------------
    def _step(self, tokens, select=None):
        if self._len >= self.n_text_ctx:
            raise ValueError(f"the decoder has {self.n_text_ctx} positions; {self._len + 1} needed")
        self._check_tokens(min(tokens), max(tokens))
        entry, rows = self._entries[len(tokens)]
        full = np.zeros((rows, 1), np.int32)
        full[:len(tokens), 0] = tokens
        out = self._run(entry, {"tokens": full}, {"pos": self._len}, select, len(tokens))
        self._len += 1
        return out[:len(tokens)] if select else out[:len(tokens), 0]

    def _run(self, entry, feeds, params, select, n):
        """Step entry point `entry`'s logits, or with select = (suppress, control rows of the n live rows) its
        _select entry point's selection (the padding rows' control suppresses nothing)."""
        if select is None:
            return self.program.run(entry, feeds, params)["logits"]
        suppress, control = select
        control = np.asarray(control)
        rows = self.plans[entry].tensors["tokens"].shape[0]
        if control.shape != (n, ts_op.CONTROL):
            raise ValueError(f"control must be [{n}, {ts_op.CONTROL}] for {n} rows, got {list(control.shape)}")
        full = ts_op.control(rows, self.n_vocab)
        full[:n] = control
        feeds = dict(feeds, suppress=suppress, select=full)
        return self.program.run(decoder_graph.select_entry(entry), feeds, params)["selection"]

    def _prompt(self, prompt, positions):
        self._check_tokens(min(prompt), max(prompt))
        slots = next(n for n in self._prompt_sizes if n >= len(prompt))
        tokens = np.zeros((1, slots), np.int32)
        tokens[0, :len(prompt)] = prompt
        picks = sorted(set(positions)) or [len(prompt) - 1]
        picks += [picks[-1]] * (decoder_graph.PROMPT_PICKS - len(picks))
        logits = self.program.run(decoder_graph.prompt_entry(slots),
                                  {"tokens": tokens, "picks": np.array(picks, np.int32)},
                                  {"pos": 0})["logits"]
        self._len = len(prompt)
        return np.stack([logits[picks.index(p)] for p in positions]) if positions else \
            np.zeros((0, self.n_vocab), np.float32)

    def _check_tokens(self, low, high):
        if low < 0 or high >= self.n_vocab:
            raise ValueError(f"token ids must be in [0, {self.n_vocab}), got {low}..{high}")

    def close(self):
        self.program.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
