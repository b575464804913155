"""Pipeline stages: a contiguous layer range of the target, its own KV caches, and no trees.

Contract: a :class:`Stage` holds the weights of decoder layers ``layers`` only (the first stage
also the token embedding, the last also the final norm and LM head) and one KV cache per request.
:meth:`Stage.run` takes :class:`Rows` (token ids at the first stage, hidden states after it),
runs its layers with the rows' positions and visibility, appends them to the request's cache and
returns the rows for the next stage, or logits at the last. Stages see rows, positions and masks;
which rows are a tree, a prompt chunk or one decoded token is the scheduler's business.

Rows of a request, as every stage sees them (the same order everywhere, so every stage's cache
holds the same rows):

- ``prefix_len`` committed positions that every row may attend to (the prompt and accepted
  tokens),
- then the *round's* rows already in the cache, numbered from 0 (a round = what the scheduler
  may still prune: the draft rows since ``prefix_len``),
- then this message's rows, round rows ``[first_row, first_row + T)``.

``visible`` (bool ``[T, first_row + T]``) says which round rows each row attends to; None means
causal (every cached row, and the earlier rows of this message): prompt chunks (Jupiter §IV-A:
chunk i attends to the cached chunks before it) and plain decoding. A stage checks that its cache
holds ``prefix_len + first_row`` rows before it runs anything (a lost or stale message is refused,
never applied to the wrong cache).

Pruning (FlowSpec §III-C): :meth:`Stage.prune` keeps round rows ``keep`` (ascending) in the cache;
the first ``committed`` of them join the committed positions (the accepted path), so the next
round counts its rows from ``prefix_len + committed``. Rows still in flight, run by an earlier
stage but not yet here, are pruned and renumbered the same way by :func:`prune_rows` when they
arrive. Every Rows and every prune carries the scheduler's ``step`` (one counter per request): a
prune of step s applies to rows of steps below s, and a pruned Rows takes the prune's step, so no
prune is applied twice.

Tasks (:class:`StageTask`): a request may name a task (Rows.task, on every message), which every
stage runs with its own view of its layers (the navigator's: the adapter's LoRA merged). The first
stage conditions that view on the image features the request's first rows carry (Rows.image); the
last masks each row's logits with the grammar state D0 computed for it (Rows.states: the row's
committed answer and draft path walked through the task's grammar, numbered as
TokenGrammar.reachable numbers them), so its argmax is the constrained target's choice. A stage
keeps each request's task and view until it releases the request.

Loading (core/engine/partial.load_stage_model): only the stage's own tensors are read from the
safetensors file, into a model whose other modules stay on the meta device (no memory): a Jetson
holds its share of the target, not the whole. The wire form of Rows (HiddenStates) is the nodes'
business (nodes/wire.py).

Knows nothing about ROS.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from ..engine.constraint import TokenGrammar, constrain
from ..engine.kv_cache import KVCache
from ..engine.models import TorchCausalLM, causal_mask

PRUNE_LOG = 64  # prunes remembered per request, for rows still in flight


class StageError(ValueError):
    """Rows a stage cannot apply: another request's layout, a wrong width, a stale step."""


@dataclass
class Rows:
    """One message's rows of one request (see the module docstring for the layout)."""

    request_id: str
    step: int
    prefix_len: int
    first_row: int
    positions: torch.Tensor  # [T] long
    data: torch.Tensor  # [T] long token ids (into the first stage) or [T, E] hidden states
    visible: torch.Tensor | None = None  # bool [T, first_row + T]; None = causal
    after_prune: int = 0  # run only once the prune of this step is applied (0: none before them)
    task: str = ""  # the request's task ('' the plain target): every stage runs its view (StageTask)
    states: torch.Tensor | None = None  # [T] long: each row's grammar state for the last stage (-1: none)
    image: torch.Tensor | None = None  # a task's image features, with the request's first rows (the first stage's)

    def __len__(self) -> int:
        return int(self.positions.shape[0])

    def check(self) -> None:
        """StageError naming the field whose shape disagrees with the rest."""
        t = len(self)
        if t == 0:
            raise StageError(f"request {self.request_id}: no rows")
        if self.data.shape[0] != t:
            raise StageError(f"request {self.request_id}: data has {self.data.shape[0]} rows, positions {t}")
        if self.visible is not None and tuple(self.visible.shape) != (t, self.first_row + t):
            raise StageError(f"request {self.request_id}: visible is {tuple(self.visible.shape)}, expected "
                             f"({t}, first_row + rows = {self.first_row + t})")
        if self.prefix_len < 0 or self.first_row < 0:
            raise StageError(f"request {self.request_id}: negative prefix_len or first_row")
        if self.states is not None and tuple(self.states.shape) != (t,):
            raise StageError(f"request {self.request_id}: states is {tuple(self.states.shape)}, expected ({t},)")


@dataclass(frozen=True)
class Prune:
    """Keep round rows ``keep`` (ascending) of a request's round, as of ``step``; the first
    ``committed`` kept rows become committed positions. With ``fork_from``: the request starts
    instead as a copy of that request's first ``prefix_len`` cached rows (a shared prompt, Jupiter
    §V-B), applied in order with the source's own prunes (both arrive on one topic)."""

    request_id: str
    step: int
    prefix_len: int
    keep: tuple[int, ...] = ()
    committed: int = 0
    fork_from: str = ""


def prune_rows(rows: Rows, prune: Prune) -> Rows | None:
    """``rows`` after ``prune`` (their round rows renumbered, pruned ones gone); None if none is
    left. Rows of a step at or after the prune's were built after it and come back unchanged."""
    if rows.step >= prune.step or prune.fork_from:
        return rows
    if rows.prefix_len != prune.prefix_len:
        raise StageError(f"request {rows.request_id}: rows of step {rows.step} have prefix_len {rows.prefix_len}, "
                         f"the prune of step {prune.step} prefix_len {prune.prefix_len}")
    end = rows.first_row + len(rows)
    keep = [k for k in prune.keep if k < end]
    mine = [k - rows.first_row for k in keep if k >= rows.first_row]
    if not mine:
        return None
    first = len(keep) - len(mine) - prune.committed
    if first < 0:  # rows still on their way cannot have been accepted: the scheduler never saw them
        raise StageError(f"request {rows.request_id}: the prune of step {prune.step} commits rows of step "
                         f"{rows.step} that are still in flight")
    visible = None
    if rows.visible is not None:
        visible = rows.visible[mine][:, keep[prune.committed:]]
    states = None if rows.states is None else rows.states[mine]
    return dataclasses.replace(rows, step=prune.step, prefix_len=prune.prefix_len + prune.committed, first_row=first,
                               positions=rows.positions[mine], data=rows.data[mine], visible=visible, states=states)


def additive_mask(rows: Rows, dtype: torch.dtype) -> torch.Tensor | None:
    """The [T, prefix_len + first_row + T] additive mask of ``rows`` (None: causal over T = 1)."""
    t, cached = len(rows), rows.prefix_len + rows.first_row
    if rows.visible is None:
        return causal_mask(cached, t, dtype) if t > 1 else None
    allowed = torch.ones(t, cached + t, dtype=torch.bool)
    allowed[:, rows.prefix_len:] = rows.visible
    mask = torch.zeros(t, cached + t, dtype=dtype)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)


@dataclass(frozen=True)
class StageTask:
    """A task a stage serves besides the plain target (Rows.task names it): ``model``, this stage's
    view of the target (an adapter's LoRA merged into its layers, a vocabulary view at the last);
    ``condition(model, features)``, at the first stage, the view a request's image conditions (its
    first rows carry the features); ``grammar``, at the last stage, masks each row's logits with the
    grammar state the row carries (TokenGrammar.mask_of), so the target's choice is the constrained
    one. Every stage must serve the same tasks."""

    model: TorchCausalLM
    condition: Callable[[TorchCausalLM, torch.Tensor], TorchCausalLM] | None = None
    grammar: TokenGrammar | None = None


class Stage:
    """One stage of the target: ``model``'s layers ``layers``; the first stage embeds token ids,
    the last returns logits (``first``/``last`` as loaded by :func:`load_stage_model`); ``tasks``:
    the :class:`StageTask` s it serves besides the plain target."""

    def __init__(self, model: TorchCausalLM, layers: range, *, first: bool, last: bool,
                 capacity: int = 256, tasks: Mapping[str, StageTask] | None = None) -> None:
        if layers.start < 0 or layers.stop > model.config.num_hidden_layers or len(layers) == 0:
            raise StageError(f"layers {layers.start}-{layers.stop - 1} are not a range of the model's "
                             f"{model.config.num_hidden_layers} layers")
        self.model, self.layers, self.first, self.last = model, layers, first, last
        self.hidden_size = model.config.hidden_size
        self.capacity = capacity
        self.tasks = dict(tasks or {})
        self.caches: dict[str, KVCache] = {}
        self.prunes: dict[str, deque[Prune]] = {}
        self.requests: dict[str, tuple[str, TorchCausalLM]] = {}  # request -> (its task, the model it runs)

    def __repr__(self) -> str:
        ends = ("embedding + " if self.first else "") + f"layers {self.layers.start}-{self.layers.stop - 1}"
        return f"Stage({ends}{' + head' if self.last else ''})"

    def cache_length(self, request_id: str) -> int:
        cache = self.caches.get(request_id)
        return 0 if cache is None else cache.length

    def ready(self, rows: Rows) -> bool:
        """Whether the prune sent before ``rows`` (``after_prune``) is applied here: rows and prunes
        travel apart, and rows that overtook their prune must wait for it."""
        log = self.prunes.get(rows.request_id)
        return rows.after_prune == 0 or (bool(log) and log[-1].step >= rows.after_prune)

    def arrive(self, rows: Rows) -> Rows | None:
        """``rows`` as they are now: every prune this stage saw since the rows' step applied (None:
        all pruned)."""
        for prune in self.prunes.get(rows.request_id, ()):
            rows = prune_rows(rows, prune)
            if rows is None:
                return None
        return rows

    @torch.inference_mode()
    def run(self, rows: Rows) -> torch.Tensor:
        """Run the rows (after :meth:`arrive`) through this stage: hidden states [T, E] for the next
        stage, or logits [T, V] from the last. StageError if the rows do not fit this stage."""
        rows.check()
        self._check_data(rows)
        cache = self.caches.get(rows.request_id)
        have = 0 if cache is None else cache.length
        if have != rows.prefix_len + rows.first_row:
            raise StageError(f"request {rows.request_id}: rows of step {rows.step} expect "
                             f"{rows.prefix_len + rows.first_row} cached rows (prefix_len {rows.prefix_len} + "
                             f"first_row {rows.first_row}), {self!r} has {have}")
        model = self._model(rows, new=cache is None)
        if cache is None:
            cache = self.caches[rows.request_id] = model.new_cache(self.capacity, self.layers)
        cache.ensure_capacity(have + len(rows))
        hidden = model.embed(rows.data[None], rows.positions) if self.first else rows.data[None].to(model.dtype)
        out, _ = model.run_layers(hidden, rows.positions, additive_mask(rows, model.dtype), cache, self.layers)
        if not self.last:
            return out[0]
        logits = model.head(out)[0]
        if rows.states is not None:
            grammar = self.tasks[rows.task].grammar if rows.task else None
            if grammar is None:
                raise StageError(f"request {rows.request_id}: states: task {rows.task!r} has no grammar here")
            for i, state in enumerate(rows.states.tolist()):
                if state >= 0:
                    logits[i] = constrain(logits[i], grammar.mask_of(state))
        return logits

    def _model(self, rows: Rows, new: bool) -> TorchCausalLM:
        """The model a request's rows run through: the target, or its task's view (conditioned on the
        image its first rows carry, at the first stage); StageError naming the field at fault."""
        if not new:
            task, model = self.requests.get(rows.request_id, ("", self.model))
            if rows.task != task:
                raise StageError(f"request {rows.request_id}: task: {rows.task!r}, the request runs {task!r}")
            return model
        if not rows.task:
            if rows.image is not None:
                raise StageError(f"request {rows.request_id}: image: an image needs a task")
            return self.model
        task = self.tasks.get(rows.task)
        if task is None:
            raise StageError(f"request {rows.request_id}: task: this stage serves no task {rows.task!r} "
                             f"(tasks: {', '.join(map(repr, self.tasks)) or 'none'})")
        model = task.model
        if self.first and task.condition is not None:
            if rows.image is None:
                raise StageError(f"request {rows.request_id}: image: task {rows.task!r} needs the image features "
                                 "with its first rows")
            try:
                model = task.condition(model, rows.image)
            except ValueError as exc:
                raise StageError(f"request {rows.request_id}: image: {exc}") from None
        self.requests[rows.request_id] = (rows.task, model)
        return model

    def _check_data(self, rows: Rows) -> None:
        if self.first:
            if rows.data.dim() != 1 or rows.data.dtype != torch.long:
                raise StageError(f"request {rows.request_id}: data must be token ids [rows] (long) at the "
                                 f"first stage, got {tuple(rows.data.shape)} {rows.data.dtype}")
        elif rows.data.dim() != 2 or rows.data.shape[1] != self.hidden_size:
            raise StageError(f"request {rows.request_id}: data must be hidden states [rows, {self.hidden_size}], "
                             f"got {tuple(rows.data.shape)}")

    @torch.inference_mode()
    def prune(self, prune: Prune) -> None:
        """Keep the prefix and round rows ``prune.keep`` of what this stage's cache holds; remember
        the prune for rows of earlier steps still on their way here."""
        log = self.prunes.setdefault(prune.request_id, deque(maxlen=PRUNE_LOG))
        if log and prune.step <= log[-1].step:
            raise StageError(f"request {prune.request_id}: prune of step {prune.step} after step {log[-1].step}")
        log.append(prune)
        if prune.fork_from:
            self.fork(prune.fork_from, prune.request_id, prune.prefix_len)
            return
        cache = self.caches.get(prune.request_id)
        if cache is None:
            return
        if cache.length < prune.prefix_len:
            raise StageError(f"request {prune.request_id}: prune at prefix_len {prune.prefix_len}, "
                             f"{self!r} holds {cache.length} rows")
        held = cache.length - prune.prefix_len
        cache.keep([*range(prune.prefix_len), *(prune.prefix_len + k for k in prune.keep if k < held)])

    @torch.inference_mode()
    def fork(self, source: str, request_id: str, length: int) -> None:
        """Start ``request_id``'s cache as a copy of ``source``'s first ``length`` rows."""
        held = self.caches.get(source)
        if held is None or held.length < length:
            raise StageError(f"request {request_id}: cannot fork {length} rows of request {source}, {self!r} holds "
                             f"{0 if held is None else held.length}")
        if request_id in self.caches:
            raise StageError(f"request {request_id}: already has a cache here; fork only a new request")
        if source in self.requests:
            self.requests[request_id] = self.requests[source]
        cache = self.caches[request_id] = self.model.new_cache(max(self.capacity, length), self.layers)
        cache.k[:, :, :, :length] = held.k[:, :, :, :length]
        cache.v[:, :, :, :length] = held.v[:, :, :, :length]
        cache.length = length

    @torch.inference_mode()
    def measure(self, rows: Sequence[int], cached: int, repeats: int = 3) -> list[float]:
        """Seconds this stage takes for each count of new rows over ``cached`` cached ones (its layers,
        and the head at the last stage): the median of ``repeats`` after a warm-up, on a scratch cache.
        What the stage answers `profile` with (Jupiter: each device profiles its own share)."""
        from ..engine.timing import median_ms

        out = []
        for n in rows:
            cache = self.model.new_cache(cached + n, self.layers)
            cache.k.zero_()
            cache.v.zero_()
            cache.length = cached
            data = (torch.zeros(n, dtype=torch.long) if self.first
                    else torch.zeros(n, self.hidden_size, dtype=self.model.dtype))
            probe = Rows("profile", 0, cached, 0, torch.arange(cached, cached + n), data)
            mask = additive_mask(probe, self.model.dtype)

            def step(_, cache=cache, data=data, positions=probe.positions, mask=mask) -> None:
                hidden = self.model.embed(data[None], positions) if self.first else data[None]
                hidden, _ = self.model.run_layers(hidden, positions, mask, cache, self.layers)
                if self.last:
                    self.model.head(hidden)

            def reset(cache=cache) -> None:
                cache.length = cached

            out.append(median_ms(step, repeats, after=reset) / 1000)
        return out

    def release(self, request_id: str) -> None:
        """Forget a request's cache and prunes."""
        self.caches.pop(request_id, None)
        self.prunes.pop(request_id, None)
        self.requests.pop(request_id, None)
