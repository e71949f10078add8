"""Horovod's gradient policy, once for every binding: argument checks, averaging and scaling, groups, names and
local accumulation.

A binding (torch, TensorFlow/Keras, JAX, numpy) converts tensors and wires its autograd and optimizers; every rule
about *what* is reduced, *how it is scaled* and *which arguments are legal* lives here, as plain functions over
numbers, sequences and process sets, so that the bindings agree by construction. Nothing here imports a framework.

The rules, as Horovod defines them:

* ``op``: ``Average`` (default), ``Sum``, ``Adasum``, ``Min``, ``Max``, ``Product``; the deprecated ``average=``
  maps to Average/Sum and may not be combined with ``op`` (:func:`resolve_op`).
* ``gradient_predivide_factor`` f (Average only): gradients are multiplied by 1/f before the sum and the sum by f/size
  after it, i.e. ``prescale_factor=1/f, postscale_factor=f`` on an Average reduction (:func:`predivide_factors`).
* Sparse gradients (``IndexedSlices``, sparse COO) are gathered, not summed: Average and Sum only, never Adasum; the
  gathered values are multiplied by :func:`reduction_scale`.
* Gradients kept local (``register_local_source``, ``local_layers``) are divided by the set's size when
  ``scale_local_gradients`` (:func:`local_gradient_scale`).
* ``backward_passes_per_step`` n: n backward passes accumulate locally before one reduction; with
  ``average_aggregated_gradients`` the sum is divided by n (:func:`aggregation_scale`, :class:`PassCounter`).
* ``groups``: an int n splits the gradients, in order, into n fused groups; a list of lists fuses each inner list;
  a gradient in no group is reduced on its own (:func:`split_groups`).
"""

from __future__ import annotations

import math
import numbers
import warnings
from typing import Any, Callable, Dict, Hashable, Iterable, List, Optional, Sequence, Tuple

from horovod.common.util import is_power_of_two  # noqa: F401 — part of the policy's names
from horovod.runtime import basics
from horovod.runtime import collectives as _c
from horovod.runtime.collectives import Adasum, Average, Sum, check_reducescatter_op, resolve_op  # noqa: F401
from horovod.runtime.process_sets import ProcessSet, global_process_set

__all__ = [
    "BackwardPasses", "resolve_op", "check_scale_factors", "check_optimizer_arguments", "check_sparse_op", "check_reducescatter_op",
    "is_power_of_two", "or_global", "set_size", "set_rank", "reduction_active",
    "predivide_factors", "reduction_scale", "local_gradient_scale", "aggregation_scale",
    "split_groups", "parameter_names", "PassCounter", "allreduce_groups", "submit_groups",
]


# -- arguments ------------------------------------------------------------------------------------------------------

def check_scale_factors(prescale_factor, postscale_factor) -> Tuple[float, float]:
    """The scale factors as floats.

    Raises:
        TypeError: a factor is not a real number (a tensor, a string...). ValueError: a factor is not finite.
    """
    out = []
    for label, value in (("prescale_factor", prescale_factor), ("postscale_factor", postscale_factor)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{label} must be a real number, not {type(value).__name__} ({value!r})")
        if not math.isfinite(value):
            raise ValueError(f"{label} must be finite, not {value!r}")
        out.append(float(value))
    return out[0], out[1]


def check_optimizer_arguments(op, gradient_predivide_factor: float = 1.0, backward_passes_per_step: int = 1,
                              groups=None, num_groups: int = 0, average_aggregated_gradients: bool = False,
                              what: str = "tensors"):
    """Horovod's checks on a distributed optimizer's (or gradient tape's) arguments; returns ``groups``, which the
    deprecated ``num_groups`` fills when it is unset.

    Args:
        what: how the binding calls its parameters, for messages (``"torch.Tensor"``, ``"tf.Variable"``).
    Raises:
        ValueError: ``gradient_predivide_factor`` with an op other than Average, ``backward_passes_per_step`` < 1,
            Adasum with ``average_aggregated_gradients``, or ``groups`` neither a positive int nor a list.
    """
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed in v0.23.0.",
                      DeprecationWarning, stacklevel=3)
        if groups is None:
            groups = num_groups
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    if op == Adasum and average_aggregated_gradients:
        raise ValueError("Adasum does not support average_aggregated_gradients == True")
    if groups is not None and not (isinstance(groups, list) or (isinstance(groups, int) and groups > 0)):
        raise ValueError(f"groups should be a non-negative integer or a list of list of {what}.")
    return groups


def check_sparse_op(op) -> None:
    """Sparse gradients are gathered: only Average and Sum apply.

    Raises:
        NotImplementedError: Adasum. ValueError: any other op but Average and Sum.
    """
    if op == Adasum:
        raise NotImplementedError("The Adasum reduction does not currently support sparse tensors. As a "
                                  "workaround please pass sparse_as_dense=True to DistributedOptimizer")
    if op not in (Average, Sum):
        raise ValueError(f"sparse tensors can only be reduced with hvd.Average or hvd.Sum, not {op!r}")


# -- process sets ---------------------------------------------------------------------------------------------------

def or_global(process_set: Optional[ProcessSet]) -> ProcessSet:
    """``process_set``, or the global set for None."""
    return process_set if process_set is not None else global_process_set


def set_size(process_set: Optional[ProcessSet]) -> int:
    """The number of ranks in the set.

    Raises:
        ValueError: the set is not registered (or Horovod is not initialized).
    """
    return _known(or_global(process_set), "size", "{} is not registered (or Horovod is not initialized)")


def set_rank(process_set: Optional[ProcessSet]) -> int:
    """This process's rank within the set.

    Raises:
        ValueError: this process is not a member (or the set is not registered).
    """
    return _known(or_global(process_set), "rank", "this rank is not a member of {}")


def _known(process_set: ProcessSet, attribute: str, message: str) -> int:
    value = getattr(process_set, attribute)()
    if value is None:
        raise ValueError(message.format(process_set))
    return value


def reduction_active(process_set: Optional[ProcessSet]) -> bool:
    """Whether reducing gradients over the set does anything: this rank is a member and the set has more than one
    rank, or the job is elastic (its size may grow, and every rank must keep submitting the same ops)."""
    process_set = or_global(process_set)
    if not process_set.included():
        return False
    return (process_set.size() or 1) > 1 or bool(basics.context().config.elastic)


# -- scaling --------------------------------------------------------------------------------------------------------

def predivide_factors(op, gradient_predivide_factor: float = 1.0) -> Tuple[float, float]:
    """``(prescale_factor, postscale_factor)`` of a gradient reduction: ``(1/f, f)`` for Average, else ``(1, 1)``.

    With Average the core divides the sum by the set's size too, so a gradient is divided by f before the sum and
    by size/f after it.
    """
    if op == Average:
        return 1.0 / gradient_predivide_factor, float(gradient_predivide_factor)
    return 1.0, 1.0


def reduction_scale(op, size: int, prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> float:
    """The factor a reduction applies on top of the plain sum: the scale factors, and 1/size for Average.

    It scales the gathered values of a sparse reduction and the gradient of a reducescatter.
    """
    return prescale_factor * postscale_factor / (size if op == Average else 1)


def local_gradient_scale(process_set: Optional[ProcessSet], scale_local_gradients: bool = True) -> float:
    """The factor for gradients kept local: 1/size of the set when ``scale_local_gradients`` and reducing is
    active (:func:`reduction_active`), else 1."""
    if not scale_local_gradients or not reduction_active(process_set):
        return 1.0
    return 1.0 / set_size(process_set)


def aggregation_scale(backward_passes_per_step: int, average_aggregated_gradients: bool) -> float:
    """The factor for gradients summed locally over ``backward_passes_per_step`` passes: 1/n when
    ``average_aggregated_gradients``, else 1."""
    return 1.0 / backward_passes_per_step if average_aggregated_gradients else 1.0


# -- groups and names -----------------------------------------------------------------------------------------------

def split_groups(groups, items: Sequence, key: Callable[[Any], Hashable] = id,
                 member_check: Optional[Callable[[Any], bool]] = None, what: str = "tensors") -> List[List[int]]:
    """The fused groups as lists of indices into ``items``, covering every item once.

    Args:
        groups: None or 0 (every item alone), an int n (``items`` split in order into n groups of sizes differing
            by at most one), or a list of lists of items (each inner list one group; members not in ``items``,
            e.g. frozen parameters, are skipped).
        items: the gradients' parameters or variables, in the order they are reduced.
        key: identity of an item (``id`` for torch tensors, ``v.ref()`` for TensorFlow variables).
        member_check: with a list, each member must pass it.
        what: the members' kind, for messages.
    Returns:
        Explicit groups first, in the given order, then each item in no group as a group of one. A group of one is
        reduced as a plain (not grouped) reduction.
    Raises:
        ValueError: a member fails ``member_check``, appears twice, or ``groups`` is malformed.
    """
    n = len(items)
    if not groups:
        return [[i] for i in range(n)]
    if isinstance(groups, int):
        return _split_in_order(n, groups)
    if not isinstance(groups, list):
        raise ValueError(f"groups should be a non-negative integer or a list of list of {what}.")
    position = {key(item): i for i, item in enumerate(items) if item is not None}
    seen: set = set()
    out: List[List[int]] = []
    for group in groups:
        members = []
        for member in group:
            if member_check is not None and not member_check(member):
                raise ValueError(f"groups must consist of {what}.")
            k = key(member)
            if k in seen:
                raise ValueError("A parameter can only appear once in groups.")
            seen.add(k)
            if k in position:
                members.append(position[k])
        if members:
            out.append(members)
    grouped = {i for group in out for i in group}
    return out + [[i] for i in range(n) if i not in grouped]


def _split_in_order(n: int, groups: int) -> List[List[int]]:
    if groups < 0:
        raise ValueError("groups should be a non-negative integer or a list of lists.")
    size, extra = divmod(n, groups)
    out, start = [], 0
    for k in range(groups):
        end = start + size + (1 if k < extra else 0)
        if end > start:
            out.append(list(range(start, end)))
        start = end
    return out


def parameter_names(param_lists: Sequence[Sequence[Any]], named_parameters: Optional[Iterable] = None,
                    key: Callable[[Any], Hashable] = id) -> Dict[Hashable, str]:
    """The name each parameter's reduction carries, keyed by ``key(parameter)``.

    Without ``named_parameters`` a parameter is ``noname.{list}.{index}`` (its position in ``param_lists``, e.g. an
    optimizer's parameter groups), the same on every rank that builds the same model.

    Raises:
        ValueError: ``named_parameters`` holds something other than ``(name, parameter)`` tuples, repeats a name,
            or leaves a parameter of ``param_lists`` unnamed.
    """
    if named_parameters is None:
        return {key(p): f"noname.{g}.{i}" for g, params in enumerate(param_lists) for i, p in enumerate(params)}
    named_parameters = list(named_parameters)
    if any(not isinstance(item, tuple) for item in named_parameters):
        raise ValueError("named_parameters should be a sequence of tuples (name, parameter), usually produced by "
                         "model.named_parameters().")
    names = [name for name, _ in named_parameters]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"Parameter names in named_parameters must be unique. Found duplicates: "
                         f"{', '.join(duplicates)}")
    named = {key(p) for _, p in named_parameters}
    unnamed = [id(p) for params in param_lists for p in params if key(p) not in named]
    if unnamed:
        raise ValueError(f"named_parameters was specified, but one or more model parameters were not named. "
                         f"Python object ids: {', '.join(str(i) for i in unnamed)}")
    return {key(p): name for name, p in named_parameters}


def allreduce_groups(arrays: Sequence, groups: Sequence[Sequence[int]], name: str, op=Average,
                     prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     process_set: Optional[ProcessSet] = None, dtypes: Optional[Sequence[Optional[str]]] = None
                     ) -> List[Any]:
    """Allreduce numpy arrays in the fused groups of :func:`split_groups`: submit every group, then wait for all,
    so the engine negotiates and fuses them together. Returns the reduced arrays in the order of ``arrays``.

    A group of one is a plain allreduce named ``{name}.{index}``; a larger group is a grouped allreduce named
    ``{name}.group{first index}``. ``dtypes`` gives the core's dtype name where numpy's is wrong (``"bfloat16"``).
    """
    return submit_groups(arrays, groups, name, op, prescale_factor, postscale_factor, process_set, dtypes)()


def submit_groups(arrays: Sequence, groups: Sequence[Sequence[int]], name: str, op=Average,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                  process_set: Optional[ProcessSet] = None, dtypes: Optional[Sequence[Optional[str]]] = None
                  ) -> Callable[[Optional[float]], List[Any]]:
    """:func:`allreduce_groups` in two halves: submits every group and returns ``finish(timeout=None)``, which
    waits for all and returns the reduced arrays in the order of ``arrays`` (a timeout makes each wait leave the
    engine's loop to its thread: see :meth:`horovod.core.handles.Handle.wait`)."""
    dtypes = list(dtypes) if dtypes is not None else [None] * len(arrays)
    kwargs = dict(op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                  process_set=or_global(process_set))
    pending = []
    for members in groups:
        if len(members) == 1:
            i = members[0]
            handle = _c.allreduce_async(arrays[i], name=f"{name}.{i}", dtype=dtypes[i], **kwargs)
        else:
            handle = _c.grouped_allreduce_async([arrays[i] for i in members], name=f"{name}.group{members[0]}",
                                                dtypes=[dtypes[i] for i in members], **kwargs)
        pending.append((members, handle))
    count = len(arrays)

    def finish(timeout: Optional[float] = None) -> List[Any]:
        results: List[Any] = [None] * count
        for members, handle in pending:
            value = handle.result(timeout)
            for i, v in zip(members, value if len(members) > 1 else [value]):
                results[i] = v
        return results
    return finish


# -- local accumulation ---------------------------------------------------------------------------------------------

_EXTRA_BACKWARD = ("Gradients were computed more than backward_passes_per_step times before call to step(). "
                   "Increase backward_passes_per_step to accumulate gradients locally.")


class PassCounter:
    """Counts backward passes per parameter: the n-th pass (n = ``backward_passes_per_step``) of a parameter is the
    one whose gradient, now summed over n passes, is reduced. After the reduction, :meth:`reset` starts counting
    again.

    Keys are any hashable identities of parameters.
    """

    def __init__(self, keys: Iterable[Hashable], backward_passes_per_step: int = 1):
        if backward_passes_per_step <= 0:
            raise ValueError("backward_passes_per_step must be > 0")
        self.passes = backward_passes_per_step
        self._left = {k: backward_passes_per_step for k in keys}

    def count(self, key: Hashable) -> bool:
        """Record one backward pass of ``key``; True when it completes the accumulation (reduce now).

        Raises:
            AssertionError: more passes than ``backward_passes_per_step`` before a reset (Horovod's error).
        """
        if self._left[key] <= 0:
            raise AssertionError(_EXTRA_BACKWARD)
        self._left[key] -= 1
        return self._left[key] == 0

    def reset(self, key: Optional[Hashable] = None) -> None:
        """Start counting again for ``key`` (every key when None)."""
        for k in ([key] if key is not None else list(self._left)):
            self._left[k] = self.passes

    def set_passes(self, backward_passes_per_step: int) -> None:
        """Change ``backward_passes_per_step``; every count starts again.

        Raises:
            ValueError: not positive.
        """
        if backward_passes_per_step <= 0:
            raise ValueError("backward_passes_per_step must be > 0")
        self.passes = backward_passes_per_step
        self.reset()


class BackwardPasses:
    """Mixin for an optimizer wrapper whose ``_passes`` is a :class:`PassCounter`: Horovod's
    ``backward_passes_per_step`` property and ``set_backward_passes_per_step``, once for every optimizer."""

    @property
    def backward_passes_per_step(self) -> int:
        """Backward passes accumulated locally before each reduction."""
        return self._passes.passes

    @backward_passes_per_step.setter
    def backward_passes_per_step(self, passes: int) -> None:
        """Set it (ValueError when < 1)."""
        self._passes.set_passes(passes)

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Change how many backward passes accumulate locally before each reduction.

        Raises:
            ValueError: ``passes`` < 1.
        """
        self._passes.set_passes(passes)
