r"""Numbers written in tokens of several digits, each token's digits apart.

Llama 3, GPT-4o and DeepSeek-V3 write ``1234567`` as ``123|456|7``. With a
:class:`~ntil_jax.NumberTokens` vocabulary in place of the ten digit ids,
every loss here scores such numbers digit by digit, through **digit
slots**: a position whose label is a number token of width :math:`w`
becomes :math:`w` slots, one per digit of the token, and every other
position one slot. The numbers are then the maximal runs of digit slots,
exactly as for single-digit tokens, so ``123|4`` is the number 1234 and
``12|05`` is 1205, with every digit's place value counted across tokens.

Each digit slot gets a distribution over the ten digits: the model's
probability of the tokens **of the target's width** whose digit at that
slot is :math:`d`,

.. math:: \ell_j(d) = \log \sum_{k:\ \mathrm{width}(k) = w,\ d_j(k) = d}
   e^{z_k},

the log-sum-exp of their logits. Each loss reads these ten "digit logits"
where it read the ten digit tokens' logits, and the full vocabulary's
log-normalizer where it read that: the soft-label cross-entropy takes
:math:`\log P_j(d) = \ell_j(d) - \log Z`, the distance losses the softmax of
:math:`\ell_j`, i.e. the digit's marginal under the model's distribution
renormalized over the target width's tokens. NTIL's prediction is the
argmax digit of each slot (straight-through, as for single digits), so the
predicted number has the target's digit count. A model's mass on tokens of
another width (``12|34`` for ``123|4``) or on non-number tokens is outside
these terms; cross-entropy, computed per token as always, is what penalises
it. A token loss is the sum of its slots' losses, so the per-token output
is shaped like the labels, as for every other vocabulary.

With ten single-digit tokens and no word-start tokens the slots are the
positions, and every loss is today's exactly (that case runs the
single-digit code). A number token that starts a word (``'\u2581123'``;
``'123'`` in a WordPiece vocabulary) starts a new number: its slots are preceded by a non-digit slot.
"""

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ntil_jax import arrays
from ntil_jax import numbers
from ntil_jax import vocab

MAX_WIDTH = vocab.MAX_WIDTH
# The synthetic label of a slot that is no digit.
_OTHER = numbers.NUM_DIGITS


@dataclasses.dataclass(frozen=True)
class Spec:
  """The static part of a :class:`~ntil_jax.NumberTokens`, in its canonical
  order (by width, then value, then id): what the digit slots are built
  from. Hashable, so it can be a ``jit`` static argument."""

  widths: tuple
  values: tuple
  word_starts: tuple

  @functools.cached_property
  def max_width(self) -> int:
    return max(self.widths)

  @functools.cached_property
  def separated(self) -> bool:
    """Whether some token starts a word (a non-digit slot before it)."""
    return any(self.word_starts)

  @functools.cached_property
  def single_digits(self) -> bool:
    """Ten single-digit tokens, 0..9, none starting a word: digit ids."""
    return self.widths == (1,) * 10 and self.values == tuple(range(10))

  @functools.cached_property
  def narrow(self) -> bool:
    return self.single_digits and not self.separated

  @functools.cached_property
  def slots_per_token(self) -> int:
    return self.max_width + int(self.separated)

  @functools.cached_property
  def width_list(self) -> tuple:
    """The widths present, ascending."""
    return tuple(sorted(set(self.widths)))

  def writers(self, width: int) -> np.ndarray:
    """``[10**width, m]`` indices of the tokens writing each digit string
    of ``width`` digits (``-1`` pads; a string no token writes is all
    ``-1``)."""
    members = [[] for _ in range(10**width)]
    for index, (w, v) in enumerate(zip(self.widths, self.values)):
      if w == width:
        members[v].append(index)
    m = max(len(x) for x in members)
    table = np.full((10**width, m), -1, np.int32)
    for v, x in enumerate(members):
      table[v, : len(x)] = x
    return table


def _concrete(x):
  try:
    return np.asarray(x)
  except (jax.errors.TracerArrayConversionError, TypeError):
    return None


def spec_and_ids(tokens: vocab.NumberTokens, vocab_size=None):
  """``(spec, ids, concrete)``: the static :class:`Spec`, the ids in its
  canonical order (an array, traced if ``tokens.ids`` is) and those ids as
  NumPy (``None`` when traced).

  Raises:
    ValueError: in one line, for fields of different lengths, traced
      values, widths or word starts, values or widths that are not
      integers, a width outside 1..4, a value that
      does not fit its width, ids that are not integers, negative, at or
      above ``vocab_size`` or repeated, or a width whose tokens leave some
      digit out of some slot.
  """
  fields = {}
  for name in ("values", "widths", "word_starts"):
    value = _concrete(getattr(tokens, name))
    if value is None:
      raise ValueError(
          f"NumberTokens.{name} must be concrete (NumPy), not traced; only "
          "the ids may be traced."
      )
    if name != "word_starts" and not np.issubdtype(value.dtype, np.integer):
      # Cast, 3.9 would be scored as the digit 3.
      raise ValueError(
          f"NumberTokens.{name} must be integers, got dtype {value.dtype}."
      )
    fields[name] = value
  count = fields["values"].size
  shapes = {n: np.shape(getattr(tokens, n)) for n in tokens._fields}
  if count == 0 or any(s != (count,) for s in shapes.values()):
    raise ValueError(
        f"NumberTokens fields must be 1-D of one non-zero length, got {shapes}."
    )
  spec, order = _spec(
      *(
          tuple(fields[n].astype(t).tolist())
          for n, t in (("widths", np.int64), ("values", np.int64))
      ),
      tuple(fields["word_starts"].astype(bool).tolist()),
  )
  concrete = _concrete(tokens.ids)
  if concrete is None:
    return spec, jnp.asarray(tokens.ids)[order], None
  numbers.check_id_range(concrete, vocab_size, "NumberTokens.ids")
  unique, counts = np.unique(concrete, return_counts=True)
  if (counts > 1).any():
    raise ValueError(
        f"NumberTokens.ids repeat token {int(unique[counts > 1][0])}; each "
        "number token needs its own id."
    )
  concrete = concrete[order]
  return spec, jnp.asarray(concrete), concrete


@functools.lru_cache(maxsize=16)
def _spec(widths: tuple, values: tuple, word_starts: tuple):
  """``(Spec, order)`` of a vocabulary's fields, checked; cached, as every
  entry point of a loss call reads it."""
  widths, values = np.asarray(widths), np.asarray(values)
  if widths.min() < 1 or widths.max() > MAX_WIDTH:
    raise ValueError(
        f"number token widths must be 1 to {MAX_WIDTH} digits, got "
        f"{sorted(set(widths.tolist()))}."
    )
  bad = (values < 0) | (values >= 10**widths)
  if bad.any():
    i = int(np.flatnonzero(bad)[0])
    raise ValueError(
        f"number token {i} has value {values[i]}, which does not fit its "
        f"width of {widths[i]} digit(s)."
    )
  order = np.lexsort((np.arange(len(values)), values, widths))
  spec = Spec(
      widths=tuple(int(w) for w in widths[order]),
      values=tuple(int(v) for v in values[order]),
      word_starts=tuple(bool(word_starts[i]) for i in order),
  )
  _check_every_digit_in_every_slot(spec)
  return spec, order


def _check_every_digit_in_every_slot(spec: Spec) -> None:
  """Each width's tokens must put every digit at every slot: a slot's
  distribution over the ten digits is then never missing a digit."""
  for width in spec.width_list:
    present = np.zeros((width, 10), bool)
    for w, v in zip(spec.widths, spec.values):
      if w == width:
        for j in range(width):
          present[j, (v // 10 ** (width - 1 - j)) % 10] = True
    if not present.all():
      j, d = np.argwhere(~present)[0]
      raise ValueError(
          f"no number token of width {width} has digit {d} at place {j + 1} "
          f"of {width}: a vocabulary's tokens of a width must write every "
          "digit at every place (pass max_width= to number_tokens to drop "
          "a width the tokenizer never uses)."
      )


def _safe_logsumexp(x, axis):
  """``logsumexp``, ``-inf`` with a zero gradient where all of x is.

  ``+inf`` counts as float32's largest number: the result stays finite, so
  that a width the loss does not read at a position passes back a zero
  gradient there, not ``0 * inf`` = NaN.
  """
  x = jnp.minimum(x, jnp.finfo(jnp.float32).max)
  top = jax.lax.stop_gradient(jnp.max(x, axis=axis, keepdims=True))
  top = arrays.where(jnp.isfinite(top), top, 0.0)
  total = jnp.sum(jnp.exp(x - top), axis=axis)
  some = ~(total <= 0)  # a NaN stays NaN (invalid traced ids: NaN, not -inf)
  return arrays.where(
      some,
      jnp.log(arrays.where(some, total, 1.0)) + jnp.squeeze(top, axis),
      -jnp.inf,
  )


def slot_digit_logits(number_logits, spec: Spec):
  """``[..., T, P, 10]``: the digit logits of every (width, slot) pair.

  ``number_logits``: ``[..., T, K]`` in the canonical order of ``spec``.
  Pair ``p`` is slot ``j`` (0: the leftmost digit) of width ``w``, in the
  order of :func:`_pair_offsets`.
  """
  pairs = []
  for width in spec.width_list:
    table = spec.writers(width)
    present = table >= 0
    picked = jnp.take(number_logits, np.maximum(table, 0), axis=-1)
    picked = arrays.where(present, picked, -jnp.inf)
    if table.shape[1] == 1:
      strings = picked[..., 0]
    else:  # several tokens write the same digits ('12' and '\u258112')
      strings = _safe_logsumexp(picked, -1)
    grid = strings.reshape(strings.shape[:-1] + (10,) * width)
    lead = strings.ndim - 1
    for j in range(width):
      others = tuple(lead + i for i in range(width) if i != j)
      # Safe: a digit no token of the width gives a finite logit (-inf on
      # a width's tokens) would turn the pair's zero cotangent into NaN.
      pairs.append(_safe_logsumexp(grid, others) if others else grid)
  return jnp.stack(pairs, axis=-2)


def _pair_offsets(spec: Spec) -> np.ndarray:
  """``offsets[w]``: the index of slot 0 of width ``w`` among the pairs."""
  offsets = np.zeros(MAX_WIDTH + 1, np.int32)
  running = 0
  for width in spec.width_list:
    offsets[width] = running
    running += width
  return offsets


def _scatter_rows(values, dest, size, fill):
  """``out[b, dest[b, i]] = values[b, i]`` into ``[B, size, ...]`` rows."""

  def row(v, d):
    base = jnp.full((size,) + v.shape[1:], fill, v.dtype)
    return base.at[d].set(v, mode="drop", unique_indices=True)

  return jax.vmap(row)(values, dest)


def _gather_rows(values, dest):
  """``out[b, i] = values[b, dest[b, i]]``, 0 where ``dest`` is past it."""

  def row(v, d):
    return jnp.take(v, d, axis=0, mode="fill", fill_value=0)

  return jax.vmap(row)(values, dest)


class TokenCells(NamedTuple):
  """Each position's ``C`` cells (``spec.slots_per_token``), ``[B, T, C]``
  unless noted: the slots it stands for, in order, then unused cells.

  Attributes:
    is_number: ``[B, T]``, a scored number token.
    width: ``[B, T]``, its digit count (1 elsewhere).
    digit: which of the token's digits a cell holds (``-1``: the
      separator before a word-start token; ``>= width``: unused).
    is_digit: the cell holds a digit of a scored number token.
    label: the digit (0..9) of a digit cell, ``10`` for any other slot.
    dest: the slot each used cell becomes in the ``[B, C * T]`` slot
      sequence; ``C * T`` (past its end) for unused cells.
  """

  is_number: jax.Array
  width: jax.Array
  digit: jax.Array
  is_digit: jax.Array
  label: jax.Array
  dest: jax.Array


def token_cells(labels, mask, ids, spec: Spec) -> TokenCells:
  """The :class:`TokenCells` of ``[B, T]`` labels; ``mask``: where numbers
  are scored; ``ids``: the number tokens' ids in ``spec``'s order."""
  cells, count = _own_cells(labels, mask, ids, spec)
  cell = np.arange(spec.slots_per_token, dtype=np.int32)
  start = jnp.cumsum(count, axis=-1) - count
  size = spec.slots_per_token * labels.shape[-1]
  return cells._replace(
      dest=arrays.where(cell < count[..., None], start[..., None] + cell, size)
  )


def _own_cells(labels, mask, ids, spec: Spec):
  """Each token's cells as far as they are its own, and its slot count.

  Elementwise along T (no ``dest``, which counts the slots before the
  token): ``[..., T]`` labels of any leading shape, split over the mesh or
  not.
  """
  wide = jnp.int64 if labels.dtype.itemsize > 4 else jnp.int32
  matches = labels.astype(wide)[..., None] == ids.astype(wide)

  # Lookups as sums over the matches (at most one per position: ids are
  # distinct), elementwise under any sharding of the positions.
  def lookup(table):
    return jnp.sum(arrays.where(matches, np.asarray(table, np.int32), 0), -1)

  is_number = matches.any(-1) & mask
  width = arrays.where(is_number, lookup(spec.widths), 1)
  value = lookup(spec.values)
  separator = (is_number & (lookup(spec.word_starts) > 0)).astype(jnp.int32)
  cell = np.arange(spec.slots_per_token, dtype=np.int32)
  digit = cell - separator[..., None]
  is_digit = is_number[..., None] & (digit >= 0) & (digit < width[..., None])
  place = jnp.clip(width[..., None] - 1 - digit, 0, MAX_WIDTH - 1)
  digit_value = (value[..., None] // 10 ** place.astype(value.dtype)) % 10
  count = arrays.where(is_number, width + separator, 1)
  cells = TokenCells(
      is_number=is_number,
      width=width,
      digit=digit,
      is_digit=is_digit,
      label=arrays.where(is_digit, digit_value, _OTHER),
      dest=None,
  )
  return cells, count


def token_digit_logits(number_logits, labels, mask, ids, spec: Spec):
  """``[..., T, C, 10]``: each cell's digit logits, from the ``[..., T, K]``
  number-token logits (``mask``: where numbers are scored, None for all).

  Token by token, so that a sequence split over the mesh gathers these
  ``C * 10`` values per token for the number logic, not the ``K``.
  """
  mask = jnp.ones(labels.shape, bool) if mask is None else mask != 0
  cells, _ = _own_cells(labels, mask, ids, spec)
  return cell_digit_logits(number_logits, cells, spec)


def cell_digit_logits(number_logits, cells: TokenCells, spec: Spec):
  """``[B, T, C, 10]``: each digit cell's digit logits (0 elsewhere), from
  the ``[B, T, K]`` number-token logits.

  Positions that hold no scored number token read zeros (before any
  reduction, so NaN or inf logits there get a zero gradient).
  """
  number_logits = arrays.where(cells.is_number[..., None], number_logits, 0.0)
  pairs = slot_digit_logits(number_logits, spec)
  offsets = _pair_offsets(spec)
  first = sum(
      arrays.where(cells.width == w, offsets[w], 0) for w in spec.width_list
  )
  pair = first[..., None] + jnp.clip(cells.digit, 0, spec.max_width - 1)
  pair = jnp.clip(pair, 0, pairs.shape[-2] - 1)
  picked = jnp.take_along_axis(pairs, pair[..., None], axis=-2)
  return arrays.where(cells.is_digit[..., None], picked, 0.0)


class Slots(NamedTuple):
  """The digit slots of whole sequences: a loss's inputs over the
  ``[B, C * T]`` slot sequence, and the cells that map them back.

  Attributes:
    stats: the slots' statistics (``log_norm`` the token's, ``digit_logits``
      the slot's; no ``label_logits``).
    labels: a digit slot's digit, ``10`` for any other slot.
    mask: the digit slots.
    decimal_point_mask: the slot of a decimal-point token, or None.
    cells: the :class:`TokenCells` (leading axes flattened to B).
    shape: the labels' shape, ``[..., T]``.
  """

  stats: tuple
  labels: jax.Array
  mask: jax.Array
  decimal_point_mask: jax.Array | None
  cells: TokenCells
  shape: tuple


def digit_slots(stats, labels, mask, ids, spec, decimal_point_mask) -> Slots:
  """The :class:`Slots` of ``[..., T]`` labels and their statistics, whose
  ``digit_logits`` are :func:`token_digit_logits` (``[..., T, C, 10]``)."""
  shape = labels.shape
  rows, length = int(np.prod(shape[:-1], dtype=np.int64)), shape[-1]
  flat = lambda x: x.reshape((rows, length) + x.shape[len(shape) :])
  labels = flat(labels)
  mask = jnp.ones_like(labels, bool) if mask is None else flat(mask) != 0
  cells = token_cells(labels, mask, ids, spec)
  per = spec.slots_per_token
  dest = cells.dest.reshape(rows, length * per)
  size = per * length

  def scatter(per_cell, fill):  # [B, T, C, ...] -> [B, C * T, ...]
    values = per_cell.reshape((rows, length * per) + per_cell.shape[3:])
    return _scatter_rows(values, dest, size, fill)

  def per_token(x):  # [B, T] -> every cell of its token
    return jnp.broadcast_to(flat(x)[..., None], (rows, length, per))

  points = None
  if decimal_point_mask is not None:
    point = (flat(decimal_point_mask) != 0) & ~cells.is_number
    points = scatter(point[..., None] & (np.arange(per) == 0), False)
  digit_logits = flat(stats.digit_logits)
  log_norm = stats.log_norm  # None for a loss that reads the digits alone
  return Slots(
      stats=type(stats)(
          log_norm=None
          if log_norm is None
          else scatter(per_token(log_norm), 0.0),
          label_logits=None,
          digit_logits=scatter(digit_logits, 0.0),
      ),
      labels=scatter(cells.label, _OTHER),
      mask=scatter(cells.is_digit, False),
      decimal_point_mask=points,
      cells=cells,
      shape=shape,
  )


def per_cell(slot_values, slots: Slots):
  """``[B, T, C]``: each cell's slot value (0 for unused cells)."""
  rows, length, per = slots.cells.dest.shape
  dest = slots.cells.dest.reshape(rows, length * per)
  return _gather_rows(slot_values, dest).reshape(rows, length, per)


def to_tokens(slot_values, slots: Slots):
  """``[..., T]``: each token's slots' values summed."""
  return per_cell(slot_values, slots).sum(-1).reshape(slots.shape)


def slot_loss(numeric_fn, layout_fn, slots: Slots, loss_kwargs):
  """``numeric_fn`` on the slots, summed back onto the tokens; a
  :class:`~ntil_jax.NTILComponents` result field by field (see
  :func:`components_to_tokens`)."""
  layout = layout_fn(
      slots.labels,
      slots.mask,
      digit_token_ids=None,
      decimal_point_mask=slots.decimal_point_mask,
  )
  result = numeric_fn(slots.stats, layout, **loss_kwargs)
  if isinstance(result, tuple) and hasattr(result, "predicted_digits"):
    return components_to_tokens(result, slots)
  return to_tokens(result, slots)


def components_to_tokens(components, slots: Slots):
  """NTIL's parts per token, from its parts per slot.

  ``weights`` is the place weight of the token's last digit,
  :math:`(1+\\sigma)^{r}` with :math:`r` the digits to the right of the
  token; ``emd`` the token's digits' EMDs, each weighted by
  :math:`(1+\\sigma)` to the power of the digits to its right within the
  token, so that ``weights * emd`` is the token's weighted EMD as it is for
  single digits (in a number so long that a weight is capped at 1e30, or
  one underflows, ``emd`` is that product divided by the last digit's
  weight as it stands, and the product stays the loss's).
  ``relative`` and ``magnitude`` stand on the number's last
  token; ``predicted_digits`` is the straight-through prediction as the
  token's value (``[1, 2, 3]`` in a 3-digit token: 123).
  """
  cells = slots.cells
  weights = per_cell(components.weights, slots)
  separated = (cells.digit[..., 0] < 0).astype(jnp.int32)
  last = cells.width - 1 + separated  # the cell of the token's last digit
  last_weight = jnp.take_along_axis(weights, last[..., None], -1)[..., 0]
  last_weight = arrays.where(cells.is_number, last_weight, 1.0)
  safe = arrays.where(last_weight != 0, last_weight, 1.0)
  emd = jnp.sum(weights * per_cell(components.emd, slots), -1) / safe
  place = jnp.clip(cells.width[..., None] - 1 - cells.digit, 0)
  predicted = per_cell(components.predicted_digits, slots) * 10**place
  value = jnp.sum(arrays.where(cells.is_digit, predicted, 0), -1)
  shaped = lambda x: x.reshape(slots.shape)
  return type(components)(
      emd=shaped(emd),
      weights=shaped(last_weight),
      relative=to_tokens(components.relative, slots),
      magnitude=to_tokens(components.magnitude, slots),
      predicted_digits=shaped(value).astype(components.predicted_digits.dtype),
  )
