"""The one place that validates input and words the errors.

Every public entry point of the package checks its arguments here, before any torch internals run, and every
message has one shape::

    <where>: <argument> must be <what was expected>, got <what was received>

A wrong *type* raises ``TypeError`` (a list where a tensor is needed, an int tensor where a floating one is,
``"False"`` where a bool is); a right type with a wrong value raises ``ValueError`` (a bad shape, an empty
size, a dtype or device that does not match the other inputs or the layer's parameters). Shapes are quoted
as ``(B, H, N, D)`` tuples; values with ``repr``.

Rules that hold for every entry point:

* **Sizes.** Every size must be at least 1 (B, H, N, M, D, Dv; for layers B, L, S), an empty batch too.
* **Dtypes.** q, k, v (and a layer's inputs and parameters) share one floating dtype. Under ``torch.autocast``
  every floating dtype but float64 counts as the autocast dtype, as for torch's own operators.
* **Numbers** are finite and, where they reach a float32 computation, representable in float32.
* **Tracing.** A message is built only when its check fails, so ``torch.compile`` and ``torch.export`` trace
  through every check at any shape (a tracer cannot build a string from a symbolic size).
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence, Sized
from typing import Any, Literal, NoReturn, TypeVar, overload

import torch
from torch import nn

from ._runtime import accumulation_dtype, autocast_dtype, result_dtype, tracing

_FLOAT32 = torch.finfo(torch.float32)

# A check that returns what it was given returns it with the type it was given (a choice, a callable, a sequence).
T = TypeVar("T")
SizedT = TypeVar("SizedT", bound=Sized)


def shape_str(x: torch.Tensor) -> str:
    """``(2, 3, 4)``: a tensor's shape as it is quoted in messages."""
    return "(" + ", ".join(str(s) for s in x.shape) + ")"


def describe(value: object) -> str:
    """How a received value is quoted: tensors by dtype, shape (and device), containers by size, else ``repr``."""
    if isinstance(value, torch.Tensor):
        where = "" if value.device.type == "cpu" else f" on {value.device}"
        return f"a {str(value.dtype).removeprefix('torch.')} tensor of shape {shape_str(value)}{where}"
    if hasattr(value, "shape") and hasattr(value, "dtype"):  # numpy and friends
        return f"a {type(value).__module__.split('.')[0]}.{type(value).__name__} of shape {tuple(value.shape)}"
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return f"a {type(value).__name__} of length {len(value)}"
    if isinstance(value, nn.Module):
        return f"a {type(value).__name__} module"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# ----------------------------------------------------------------------------------------------------------
# Numbers, flags and choices


def check_int(
    value: object, arg: str, *, name: str, minimum: int | None = None, maximum: int | None = None, why: str = ""
) -> int:
    """``value`` as an int in [minimum, maximum] (``why`` follows the bound); bools, floats and strings are refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: {arg} must be an int, got {describe(value)}")
    value = int(value)
    if minimum is not None and value < minimum or maximum is not None and value > maximum:
        if maximum is None:
            expected = f"an int >= {minimum}"
        elif minimum is None:
            expected = f"an int <= {maximum}"
        else:
            expected = f"an int in {minimum}..{maximum}"
        raise ValueError(f"{name}: {arg} must be {expected}{why}, got {value!r}")
    return value


def check_number(
    value: object,
    arg: str,
    *,
    name: str,
    minimum: float | None = None,
    maximum: float | None = None,
    strict_minimum: bool = False,
    strict_maximum: bool = False,
    why: str = "",
) -> float:
    """``value`` as a finite float within the bounds (``why`` follows them); bools, strings, NaN, inf are refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: {arg} must be a number, got {describe(value)}")
    value = float(value)
    low_bad = minimum is not None and (value <= minimum if strict_minimum else value < minimum)
    high_bad = maximum is not None and (value >= maximum if strict_maximum else value > maximum)
    finite = -math.inf < value < math.inf  # math.isfinite, written so that a tracer can follow a symbolic float
    if not finite or low_bad or high_bad:
        parts = []
        if minimum is not None:
            parts.append(f"{'>' if strict_minimum else '>='} {minimum:g}")
        if maximum is not None:
            parts.append(f"{'<' if strict_maximum else '<='} {maximum:g}")
        expected = "a finite number" + (" " + " and ".join(parts) if parts else "")
        raise ValueError(f"{name}: {arg} must be {expected}{why}, got {value!r}")
    return value


def check_bool(value: object, arg: str, *, name: str) -> bool:
    """``value`` if it is a bool (``True``/``False``); the string ``"False"`` or the int 1 are refused."""
    if not isinstance(value, bool):
        raise TypeError(f"{name}: {arg} must be True or False, got {describe(value)}")
    return value


def check_probability(value: object, arg: str, *, name: str) -> float:
    """A dropout-like probability in [0, 1)."""
    return check_number(value, arg, name=name, minimum=0.0, maximum=1.0, strict_maximum=True)


#: The largest eps accepted: eps keeps a normaliser away from zero, and a larger one swamps the normaliser (the
#: weights of a row then sum to far less than one) or, added to every component of a flow vector, overflows.
EPS_MAX = 1.0


def check_eps(eps: object, *, name: str) -> float:
    """The eps of a normaliser: 0, or from float32's smallest normal number (it is added in float32) to ``EPS_MAX``."""
    eps = check_number(eps, "eps", name=name, minimum=0.0)
    if eps > EPS_MAX:
        raise ValueError(
            f"{name}: eps must be at most {EPS_MAX:g} (eps keeps a normaliser away from zero; a larger one swamps "
            f"it), got {eps!r}"
        )
    if 0.0 < eps < _FLOAT32.tiny:
        raise ValueError(
            f"{name}: eps must be 0 or at least float32's smallest normal number {_FLOAT32.tiny:.4g} (it is added "
            f"in float32, where a smaller one rounds to 0 or to a denormal), got {eps!r}"
        )
    return eps


def check_scale(scale: object, *, name: str) -> float | None:
    """A softmax scale: None (1 / sqrt(D)) or a positive normal float32 number (else NaN rows or inf)."""
    if scale is None:
        return None
    scale = check_number(scale, "scale", name=name, minimum=0.0, strict_minimum=True)
    if not _FLOAT32.tiny <= scale <= _FLOAT32.max:
        raise ValueError(
            f"{name}: scale must be a normal float32 number, {_FLOAT32.tiny:.4g} to {_FLOAT32.max:.4g} (a smaller "
            f"one underflows to 0 and gives NaN rows, a larger one overflows), got {scale!r}"
        )
    return scale


def check_choice(value: T, arg: str, choices: Sequence[object], *, name: str, why: str = "") -> T:
    """``value`` if it is one of ``choices`` (compared with ==, of the same type); ``why`` explains the choices."""
    for choice in choices:
        if type(value) is type(choice) and value == choice:
            return value
    listed = ", ".join(repr(c) for c in choices)
    kinds = {type(c) for c in choices}
    error = ValueError if type(value) in kinds else TypeError
    raise error(f"{name}: {arg} must be {'one of ' if len(choices) > 1 else ''}{listed}{why}, got {describe(value)}")


def check_instance(value: object, arg: str, cls: type[T] | tuple[type[T], ...], *, name: str, what: str) -> T:
    """``value`` if it is an instance of ``cls`` (``what`` words the expectation), else TypeError."""
    if not isinstance(value, cls):
        raise TypeError(f"{name}: {arg} must be {what}, got {describe(value)}")
    return value


def check_callable(value: T, arg: str, *, name: str, what: str = "a callable") -> T:
    """``value`` if it can be called."""
    if not callable(value):
        raise TypeError(f"{name}: {arg} must be {what}, got {describe(value)}")
    return value


def check_generator(generator: object, *, name: str, arg: str = "generator") -> torch.Generator | None:
    """None or a ``torch.Generator`` (an int seed is not a generator: pass it as ``seed=``)."""
    if generator is None:
        return None
    return check_instance(generator, arg, torch.Generator, name=name, what="a torch.Generator or None")


def check_device(device: object, *, name: str, arg: str = "device") -> torch.device | None:
    """None, a ``torch.device`` or a device string such as ``"cuda:0"``; returns a ``torch.device``."""
    if device is None or isinstance(device, torch.device):
        return device
    if not isinstance(device, str):
        raise TypeError(
            f"{name}: {arg} must be a torch.device or a device string such as 'cpu', got {describe(device)}"
        )
    try:
        return torch.device(device)
    except RuntimeError:
        raise ValueError(f"{name}: {arg} must be a device string such as 'cpu' or 'cuda:0', got {device!r}") from None


def check_dtype(dtype: object, arg: str, *, name: str, floating: bool = True) -> torch.dtype:
    """A ``torch.dtype`` (a floating one when ``floating``)."""
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"{name}: {arg} must be a torch.dtype, got {describe(dtype)}")
    if floating and not dtype.is_floating_point:
        raise ValueError(f"{name}: {arg} must be a floating-point dtype, got {dtype}")
    return dtype


def check_factory(device: object, dtype: object, *, name: str) -> dict[str, Any]:
    """A layer's ``device`` and ``dtype`` keywords, as torch's modules take them (either None): a floating dtype."""
    return {
        "device": check_device(device, name=name),
        "dtype": None if dtype is None else check_dtype(dtype, "dtype", name=name),
    }


def check_exclusive(first: bool, second: bool, first_arg: str, second_arg: str, *, name: str, why: str = "") -> None:
    """Two flags that cannot both be True: ``second`` must be False when ``first`` is (``why`` says why)."""
    if first and second:
        raise ValueError(f"{name}: {second_arg} must be False with {first_arg}=True{why}, got {second_arg}=True")


# ----------------------------------------------------------------------------------------------------------
# Containers


def _plural(n: int, item: str) -> str:
    return f"{n} {item}" + ("" if n == 1 or item.endswith("s") else "s")  # "2 series", not "2 seriess"


def check_count(
    items: SizedT,
    arg: str,
    *,
    name: str,
    minimum: int = 1,
    maximum: int | None = None,
    item: str = "entry",
    why: str = "",
) -> SizedT:
    """``items`` (anything with a length) holds ``minimum`` to ``maximum`` entries, each called an ``item``."""
    n = len(items)
    if n < minimum or maximum is not None and n > maximum:
        if maximum is None:
            expected = f"at least {_plural(minimum, item)}"
        elif maximum == minimum:
            expected = _plural(minimum, item)
        elif minimum <= 0:
            expected = f"at most {_plural(maximum, item)}"
        else:
            expected = f"{minimum} to {_plural(maximum, item)}"
        raise ValueError(f"{name}: {arg} must hold {expected}{why}, got {_plural(n, item)}")
    return items


def check_sequence(
    value: T,
    arg: str,
    *,
    name: str,
    mapping: bool = False,
    what: str | None = None,
    minimum: int = 0,
    maximum: int | None = None,
    item: str = "entry",
) -> T:
    """``value``, a sequence (not a string) or with ``mapping`` a mapping, of ``minimum`` to ``maximum`` entries."""
    kind = Mapping if mapping else Sequence
    if isinstance(value, (str, bytes)) or not isinstance(value, kind):
        expected = what or ("a mapping" if mapping else "a sequence (a list or a tuple)")
        raise TypeError(f"{name}: {arg} must be {expected}, got {describe(value)}")
    if minimum > 0 or maximum is not None:
        check_count(value, arg, name=name, minimum=minimum, maximum=maximum, item=item)
    return value


def check_distinct(items: Iterable[T], arg: str, *, name: str, key: Callable[[T], object], why: str = "") -> None:
    """No two of ``items`` share ``key(item)`` (``why`` says what the key is)."""
    seen: dict[object, T] = {}
    for item in items:
        if key(item) in seen:
            raise ValueError(f"{name}: {arg} must be distinct{why}, got {seen[key(item)]!r} and {item!r}")
        seen[key(item)] = item


def check_subset(values: Iterable[object], arg: str, allowed: Iterable[object], *, name: str) -> None:
    """Every one of ``values`` (names, keys) is among ``allowed``; the message lists the unknown ones."""
    known = list(allowed)
    unknown = [v for v in values if v not in known]
    if unknown:
        listed = ", ".join(repr(a) for a in known)
        raise ValueError(f"{name}: {arg} must be among {listed}, got unknown {arg} {unknown!r}")


def check_all_equal(values: Mapping[str, object], arg: str, *, name: str, what: str) -> None:
    """Every value of ``values`` (label -> value) is equal to the first: ``arg`` must ``what``."""
    labels = list(values)
    first = values[labels[0]] if labels else None

    def shown(value: object) -> str:  # the values themselves (describe() would give only a list's length)
        text = repr(value)
        return text if len(text) <= 80 else text[:77] + "..."

    for label in labels[1:]:
        if values[label] != first:
            got = f"{shown(first)} for {labels[0]} but {shown(values[label])} for {label}"
            raise ValueError(f"{name}: {arg} must {what}, got {got}")


# ----------------------------------------------------------------------------------------------------------
# Tensors


def check_tensor(
    x: object, arg: str, *, name: str, dims: int | None = None, layout: str = "", floating: bool = True
) -> torch.Tensor:
    """``x`` if it is a tensor (floating-point when ``floating``) with ``dims`` dimensions (named by ``layout``)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: {arg} must be a torch.Tensor, got {describe(x)}")
    if floating and not x.is_floating_point():
        raise TypeError(f"{name}: {arg} must be a floating-point tensor, got {describe(x)}")
    if dims is not None and x.dim() != dims:
        raise ValueError(f"{name}: {arg} must have {dims} dimensions {layout}".rstrip() + f", got {describe(x)}")
    return x


def check_last_dim(x: torch.Tensor, arg: str, size: int, *, name: str, what: str = "") -> torch.Tensor:
    """x has at least one dimension and its last one has ``size`` entries (``what`` names that size)."""
    if x.dim() < 1 or x.shape[-1] != size:
        label = f"{size} ({what})" if what else f"{size}"
        raise ValueError(f"{name}: {arg} must have a last dimension of size {label}, got {describe(x)}")
    return x


def check_dims(x: T, arg: str, dims: int, *, name: str, layout: str = "", at_least: bool = False) -> T:
    """An array or tensor (anything with ``ndim``) with ``dims`` dimensions, or at least ``dims``."""
    ndim = getattr(x, "ndim", None)
    if not isinstance(ndim, int):
        raise TypeError(f"{name}: {arg} must be an array or a tensor, got {describe(x)}")
    if ndim < dims if at_least else ndim != dims:
        count = f"at least {dims}" if at_least else f"{dims}"
        raise ValueError(f"{name}: {arg} must have {count} dimensions {layout}".rstrip() + f", got {describe(x)}")
    return x


def check_square(x: torch.Tensor, arg: str, *, name: str, layout: str = "(..., N, N)") -> torch.Tensor:
    """A tensor of at least 2 dimensions whose last two are equal (a self-attention map)."""
    check_tensor(x, arg, name=name)
    if x.dim() < 2 or x.shape[-1] != x.shape[-2]:
        raise ValueError(f"{name}: {arg} must be square {layout}, got {describe(x)}")
    return x


def check_non_negative(x: torch.Tensor, arg: str, *, name: str) -> torch.Tensor:
    """No entry of the tensor x is negative (NaN counts as negative: it is no weight). One host synchronisation."""
    if x.numel() and not bool((x >= 0).all()):
        raise ValueError(f"{name}: {arg} must be non-negative, got a minimum of {x.min().item():g}")
    return x


def check_not_empty(x: torch.Tensor, arg: str, *, name: str, why: str = "") -> torch.Tensor:
    """The tensor x has at least one entry (``why``: what an empty x would leave undefined)."""
    if x.numel() == 0:
        raise ValueError(f"{name}: {arg} must not be empty{why}, got {describe(x)}")
    return x


def check_nonzero(x: torch.Tensor, arg: str, *, name: str, why: str = "") -> torch.Tensor:
    """The tensor x has an entry that is not zero (``why``: what an all-zero x would leave undefined)."""
    if not bool((x != 0).any()):
        raise ValueError(f"{name}: {arg} must not be all zeros{why}, got {describe(x)} of zeros")
    return x


def check_same_shape(x: torch.Tensor, y: torch.Tensor, x_arg: str, y_arg: str, *, name: str) -> None:
    """Two tensors of one shape."""
    if x.shape != y.shape:
        raise ValueError(f"{name}: {y_arg} must have the shape {shape_str(x)} of {x_arg}, got {describe(y)}")


def check_max_size(
    x: torch.Tensor, arg: str, dim: int, maximum: int, *, name: str, label: str, why: str = ""
) -> torch.Tensor:
    """Dimension ``dim`` of x (called ``label``: ``"N"``) has at most ``maximum`` entries."""
    if x.shape[dim] > maximum:
        raise ValueError(f"{name}: {arg} must have {label} <= {maximum}{why}, got {describe(x)}")
    return x


def check_unbatched(x: object, arg: str, *, name: str, layout: str = "(H, N, D)") -> torch.Tensor:
    """One example: a floating tensor ``layout`` or the same with a leading batch of 1; returned with the batch."""
    x = check_tensor(x, arg, name=name)
    if x.dim() == len(layout.split(",")):
        return x[None]
    if x.dim() == len(layout.split(",")) + 1 and x.shape[0] == 1:
        return x
    raise ValueError(f"{name}: {arg} must have shape {layout} or (1, {layout[1:]}, got {describe(x)}")


def check_not_both(
    first: object, second: object, first_arg: str, second_arg: str, *, name: str, why: str = " (pass one of them)"
) -> None:
    """At most one of two alternatives is given (``why`` replaces the default explanation)."""
    if first is not None and second is not None:
        raise ValueError(f"{name}: {second_arg} must be None when {first_arg} is given{why}, got {describe(second)}")


def check_sizes(tensors: Mapping[str, torch.Tensor], labels: Mapping[str, tuple[str, ...]], *, name: str) -> None:
    """Every size of every tensor is at least 1; ``labels[arg]`` names the dimensions of ``tensors[arg]``."""
    for arg, x in tensors.items():
        for label, size in zip(labels[arg], x.shape, strict=True):
            if size < 1:
                shown = ", ".join(f"{a} {shape_str(t)}" for a, t in tensors.items())
                raise ValueError(f"{name}: {label} must be at least 1 (every size must be), got {shown}")


def _dtypes_and_devices(tensors: Mapping[str, torch.Tensor], *, name: str) -> None:
    """One dtype (under autocast every autocast-eligible dtype counts as the autocast dtype) and one device."""
    xs = list(tensors.values())
    labels = ", ".join(tensors)
    if len({result_dtype(x) for x in xs}) != 1:
        got = ", ".join(f"{a} {str(x.dtype).removeprefix('torch.')}" for a, x in tensors.items())
        raise ValueError(f"{name}: {labels} must share a dtype, got {got}")
    if len({x.device for x in xs}) != 1:
        got = ", ".join(f"{a} on {x.device}" for a, x in tensors.items())
        raise ValueError(f"{name}: {labels} must be on one device, got {got}")


def check_qkv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, name: str, same_length: bool = False, why: str = ""
) -> tuple[int, int, int, int, int, int]:
    """Validate q (B,H,N,D), k (B,H,M,D), v (B,H,M,Dv), N == M with ``same_length``; return (B, H, N, M, D, Dv)."""
    tensors = {"q": q, "k": k, "v": v}
    for label, x in tensors.items():
        check_tensor(x, label, name=name, dims=4, layout="(B, H, N, D)" if label == "q" else "(B, H, M, D)")
    B, H, N, D = q.shape
    _, _, M, _ = k.shape
    Dv = v.shape[-1]

    def shapes() -> str:  # only when a check fails (module docstring: tracing)
        return f"q {shape_str(q)}, k {shape_str(k)}, v {shape_str(v)}"

    if k.shape[0] != B or v.shape[0] != B:
        raise ValueError(f"{name}: k and v must have the batch size B = {B} of q, got {shapes()}")
    if k.shape[1] != H or v.shape[1] != H:
        raise ValueError(f"{name}: k and v must have the head count H = {H} of q, got {shapes()}")
    if k.shape[3] != D:
        raise ValueError(f"{name}: k must have the feature size D = {D} of q, got {shapes()}")
    if v.shape[2] != M:
        raise ValueError(f"{name}: v must have the key length M = {M} of k, got {shapes()}")
    check_sizes(tensors, {"q": ("B", "H", "N", "D"), "k": ("B", "H", "M", "D"), "v": ("B", "H", "M", "Dv")}, name=name)
    if same_length and N != M:
        raise ValueError(f"{name}: k must have as many keys as q has queries (N == M){why}, got {shapes()}")
    _dtypes_and_devices(tensors, name=name)
    return B, H, N, M, D, Dv


def check_step_inputs(
    q_t: torch.Tensor, k_t: torch.Tensor, v_t: torch.Tensor, *, name: str
) -> tuple[int, int, int, int]:
    """One token of a recurrent step: q_t, k_t (B, H, D) and v_t (B, H, Dv) alike; returns (B, H, D, Dv)."""
    tensors = {"q_t": q_t, "k_t": k_t, "v_t": v_t}
    for label, x in tensors.items():
        check_tensor(x, label, name=name, dims=3, layout="(B, H, Dv)" if label == "v_t" else "(B, H, D)")
    if q_t.shape != k_t.shape or v_t.shape[:2] != q_t.shape[:2]:
        shapes = f"q_t {shape_str(q_t)}, k_t {shape_str(k_t)}, v_t {shape_str(v_t)}"
        raise ValueError(f"{name}: q_t, k_t must be (B, H, D) of one shape and v_t (B, H, Dv), got {shapes}")
    check_sizes(tensors, {"q_t": ("B", "H", "D"), "k_t": ("B", "H", "D"), "v_t": ("B", "H", "Dv")}, name=name)
    _dtypes_and_devices(tensors, name=name)
    B, H, D = q_t.shape
    return B, H, D, v_t.shape[-1]


def _check_state_tensor(
    x: object, arg: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, name: str, layout: str = ""
) -> torch.Tensor:
    """A tensor of a recurrent state: of ``shape`` (``layout`` names it), in ``dtype`` on ``device``."""
    x = check_tensor(x, arg, name=name)
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name}: {arg} must have shape {layout}{tuple(shape)} for these inputs, got {describe(x)}")
    if x.dtype != dtype:
        raise ValueError(f"{name}: {arg} must be in the accumulation dtype {dtype} of these inputs, got {describe(x)}")
    if x.device != device:
        raise ValueError(f"{name}: {arg} must be on the inputs' device {device}, got {describe(x)}")
    return x


def check_state(
    state: object,
    cls: type[T],
    fields: Mapping[str, tuple[int, ...]],
    *,
    name: str,
    dtype: torch.dtype,
    device: torch.device,
    counts: Mapping[str, tuple[int, ...]] | None = None,
    arg: str = "state",
) -> T:
    """A recurrent state: an instance of the NamedTuple ``cls``, each field of ``fields`` a tensor of that shape in
    ``dtype`` on ``device``, each field of ``counts`` an int64 tensor of token counts; ``arg`` names it."""
    if not isinstance(state, cls):
        raise TypeError(
            f"{name}: {arg} must be a {cls.__name__} (from a previous call or step) or None, got {describe(state)}"
        )
    for field, shape in (counts or {}).items():
        x = check_tensor(getattr(state, field), f"{arg}.{field}", name=name, floating=False)
        if x.dtype != torch.int64 or tuple(x.shape) != tuple(shape):
            raise ValueError(
                f"{name}: {arg}.{field} must be an int64 tensor of token counts of shape {tuple(shape)} for these "
                f"inputs, got {describe(x)}"
            )
        if x.device != device:
            raise ValueError(f"{name}: {arg}.{field} must be on the inputs' device {device}, got {describe(x)}")
        if not tracing() and bool((x < 0).any()):  # one host synchronisation, for the state of a whole call
            raise ValueError(f"{name}: {arg}.{field} must hold token counts >= 0, got {x.tolist()}")
    for field, shape in fields.items():
        _check_state_tensor(getattr(state, field), f"{arg}.{field}", shape, dtype, device, name=name)
    return state


def check_gated(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gate: object, state: object, *, name: str, arg: str,
    vector: bool, scale: object, step: bool = False,
) -> tuple[torch.Tensor, float, torch.Tensor, torch.dtype]:  # fmt: skip
    """The inputs of a chapter 8 function: q, k (B, H, N, D), v (B, H, N, Dv) (one token's with ``step``), a gate
    shaped like q without its last dimension or (``vector``) like q, ``scale`` and the state S (B, H, D, Dv) (zeros
    for None). Returns (gate, scale, S, the result dtype)."""
    if step:
        B, H, D, Dv = check_step_inputs(q, k, v, name=name)
    else:
        B, H, _, _, D, Dv = check_qkv(q, k, v, name=name, same_length=True, why=" (it is causal only)")
    g = check_tensor(gate, arg, name=name)
    shapes = [tuple(q.shape[:-1]), tuple(q.shape)] if vector else [tuple(q.shape[:-1])]
    if tuple(g.shape) not in shapes:
        wanted = " or ".join(str(x) for x in shapes)
        raise ValueError(f"{name}: {arg} must have shape {wanted} for q {shape_str(q)}, got {describe(g)}")
    if g.device != q.device:
        raise ValueError(f"{name}: {arg} must be on q's device {q.device}, got {describe(g)}")
    given = check_scale(scale, name=name)
    acc, shape = accumulation_dtype(q.dtype), (B, H, D, Dv)
    if state is None:
        S = torch.zeros(shape, dtype=acc, device=q.device)
    else:
        where = "state" if step else "initial_state"
        S = _check_state_tensor(state, where, shape, acc, q.device, name=name, layout="(B, H, D, Dv) = ")
    return g, D**-0.5 if given is None else given, S, result_dtype(q)


def check_attn_mask(
    mask: object, target: tuple[int, int, int, int], *, name: str, arg: str = "attn_mask"
) -> torch.Tensor:
    """An ``attn_mask`` as SDPA takes it, bool or floating, broadcastable to ``target`` (B, H, N, M); returned as a
    4-D view (each dimension 1 or full size)."""
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{name}: {arg} must be a bool or floating-point torch.Tensor, got {describe(mask)}")
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise TypeError(
            f"{name}: {arg} must be a bool tensor (True = may attend) or a floating one (added to the scores), "
            f"got {describe(mask)}"
        )
    shape = (1,) * (4 - mask.dim()) + tuple(mask.shape)
    if mask.dim() > 4 or any(size not in (1, full) for size, full in zip(shape, target, strict=True)):
        raise ValueError(f"{name}: {arg} must broadcast to (B, H, N, M) = {tuple(target)}, got {describe(mask)}")
    return mask.reshape(shape)


def check_key_padding_mask(mask: object, B: int, M: int, *, name: str, floating: bool = False) -> torch.Tensor:
    """A (B, M) ``key_padding_mask``: bool, True = padding; with ``floating`` also a float mask."""
    mask = check_tensor(mask, "key_padding_mask", name=name, floating=False)
    if mask.dtype != torch.bool and not (floating and mask.is_floating_point()):
        kinds = (
            "a bool tensor (True = padding) or a floating one (added to the scores)"
            if floating
            else "a bool tensor (True = padding, as in nn.MultiheadAttention) (this mechanism has no scores to add a "
            "float mask to)"
        )
        raise TypeError(f"{name}: key_padding_mask must be {kinds}, got {describe(mask)}")
    if mask.dim() != 2 or mask.shape[0] != B or mask.shape[1] != M:
        raise ValueError(f"{name}: key_padding_mask must have shape (B, M) = ({B}, {M}), got {describe(mask)}")
    return mask


def check_no_attn_mask(mask: object, *, name: str, why: str) -> None:
    """A mechanism that cannot honour an arbitrary ``attn_mask`` (``why`` says why and what to use instead)."""
    if mask is not None:
        raise ValueError(f"{name}: attn_mask must be None{why}, got {describe(mask)}")


def check_is_causal(is_causal: object, causal: object = None, *, name: str) -> bool:
    """``is_causal`` (torch's name), or the deprecated ``causal`` that attnbook 0.1 used for it."""
    if causal is not None:
        causal = check_bool(causal, "causal", name=name)
        if is_causal:
            raise ValueError(f"{name}: causal must be None with is_causal=True (causal is its old name), got {causal}")
        if not tracing():
            warnings.warn(
                f"{name}: causal= is deprecated since attnbook 0.2.0, use is_causal= (torch's name)",
                FutureWarning,
                stacklevel=3,
            )
        return causal
    return check_bool(is_causal, "is_causal", name=name)


def check_renamed_mask(attn_mask: torch.Tensor | None, mask: object, *, name: str) -> torch.Tensor | None:
    """``attn_mask`` (torch's name), or the deprecated ``mask`` that attnbook 0.1 used for it (a FutureWarning)."""
    if mask is None:
        return attn_mask
    check_not_both(attn_mask, mask, "attn_mask", "mask", name=name, why=" (mask is attn_mask's old name)")
    if not tracing():
        warnings.warn(
            f"{name}: mask= is deprecated since attnbook 0.2.0, use attn_mask= (torch's name, the same meaning)",
            FutureWarning,
            stacklevel=3,
        )
    return check_tensor(mask, "mask", name=name, floating=False)


def check_state_call(
    causal: bool, initial_state: object, output_final_state: bool, *, name: str, self_attention: bool = True
) -> None:
    """A call with a recurrent state must be causal and, for a layer, self-attention."""
    if initial_state is None and not output_final_state:
        return
    state = "None" if initial_state is None else describe(initial_state)
    got = f"initial_state={state}, output_final_state={output_final_state}"
    if not causal:
        raise ValueError(
            f"{name}: a call with a state (initial_state, output_final_state) must be causal (is_causal=True, or a "
            f"layer built with causal=True: a state sums up the tokens before a position), got a non-causal call "
            f"with {got}"
        )
    if not self_attention:
        raise ValueError(
            f"{name}: a call with a state (initial_state, output_final_state) must be self-attention, layer(x) (the "
            f"state holds the layer's own past keys), got separate keys with {got}"
        )


def check_kv_cache(cache: object, cls: type[Any], k: torch.Tensor, v: torch.Tensor, *, name: str, arg: str) -> None:
    """A KV cache (an instance of ``cls``) whose keys and values continue k (B, H, n, D) and v (B, H, n, Dv)."""
    if not isinstance(cache, cls):
        raise TypeError(
            f"{name}: {arg} must be a {cls.__name__} (from a previous call or step) or None, got {describe(cache)}"
        )
    B, H = k.shape[0], k.shape[1]
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(
            f"{name}: the new values must have the new keys' (B, H, n) = {tuple(k.shape[:3])}, got {describe(v)}"
        )
    if (cache.keys is None) != (cache.values is None):
        raise ValueError(
            f"{name}: {arg}.keys and {arg}.values must both be tensors or both None (an empty cache), got keys "
            f"{describe(cache.keys)} and values {describe(cache.values)}"
        )
    for label, held, new in (("keys", cache.keys, k), ("values", cache.values, v)):
        if held is None:  # an empty cache
            continue
        if not isinstance(held, torch.Tensor):
            raise TypeError(f"{name}: {arg}.{label} must be a torch.Tensor or None, got {describe(held)}")
        if held.dim() != 4 or held.shape[0] != B or held.shape[1] != H or held.shape[-1] != new.shape[-1]:
            width = "D" if label == "keys" else "Dv"
            raise ValueError(
                f"{name}: {arg}.{label} must have shape (B, H, t, {width}) = ({B}, {H}, t, {new.shape[-1]}) for "
                f"these inputs, got {describe(held)}"
            )
        if held.dtype != new.dtype or held.device != new.device:
            raise ValueError(
                f"{name}: {arg}.{label} must have the dtype and device of the new {label} ({new.dtype} on "
                f"{new.device}), got {describe(held)}"
            )
    t = 0 if cache.keys is None else cache.keys.shape[2]
    if cache.values is not None and cache.values.shape[2] != t:
        raise ValueError(
            f"{name}: {arg}.values must hold as many tokens as {arg}.keys ({t}), got {describe(cache.values)}"
        )
    check_padding(cache.padding, B, t, k.device, name=name, arg=f"{arg}.padding", length="t")


def check_padding(
    padding: object, B: int, n: int, device: torch.device, *, name: str, arg: str = "padding", length: str = "n"
) -> None:
    """None or a (B, n) bool tensor on ``device``, True = padding: the padding a KV cache holds for its tokens."""
    if padding is None:
        return
    expected = f"None or a bool tensor of shape (B, {length}) = ({B}, {n}) (True = padding)"
    if not isinstance(padding, torch.Tensor) or padding.dtype != torch.bool:
        raise TypeError(f"{name}: {arg} must be {expected}, got {describe(padding)}")
    if tuple(padding.shape) != (B, n) or padding.device != device:
        raise ValueError(f"{name}: {arg} must be {expected} on {device}, got {describe(padding)}")


def check_same_value(
    first: object, second: object, first_arg: str, second_arg: str, *, name: str, why: str = ""
) -> None:
    """Two names for one setting (``why`` says why both exist): when both are given they must agree."""
    if first is not None and second is not None and first != second:
        raise ValueError(
            f"{name}: {second_arg} must equal {first_arg}{why}, got {first_arg}={first!r}, {second_arg}={second!r}"
        )


# ----------------------------------------------------------------------------------------------------------
# Layers


def check_divisible(total: int, parts: int, *, name: str, total_arg: str, parts_arg: str) -> None:
    """``total`` splits into ``parts`` equal parts (d_model into n_heads heads)."""
    if total % parts:
        raise ValueError(
            f"{name}: {total_arg} must be a multiple of {parts_arg}, got {total_arg}={total}, {parts_arg}={parts}"
        )


def _check_layer_dtype(x: torch.Tensor, arg: str, like: torch.Tensor, *, name: str) -> None:
    """x's dtype and device are those of the layer's parameter ``like`` (under autocast: both eligible)."""
    cast = autocast_dtype(x.device)
    eligible = cast is not None and torch.float64 not in (x.dtype, like.dtype)
    if x.dtype != like.dtype and not eligible:
        raise ValueError(
            f"{name}: {arg} must have the layer's dtype {like.dtype} (convert the input, or the layer with "
            f".to(dtype)), got {describe(x)}"
        )
    if x.device != like.device:
        raise ValueError(f"{name}: {arg} must be on the layer's device {like.device}, got {describe(x)}")


def check_tokens(
    x: object, arg: str, *, name: str, width: int, like: torch.Tensor, width_name: str = "dim"
) -> torch.Tensor:
    """Tokens x (B, N, width) for a layer whose parameter ``like`` fixes dtype and device."""
    return _check_layer_tensor(x, arg, ("B", "N", width_name), width, like, name=name)


def check_step_token(x: object, arg: str, *, name: str, width: int, like: torch.Tensor) -> torch.Tensor:
    """One token of a layer's recurrent step: x (B, width) with the dtype and device of the parameter ``like``."""
    return _check_layer_tensor(x, arg, ("B", "d_input"), width, like, name=name)


def _check_layer_tensor(
    x: object, arg: str, labels: tuple[str, ...], width: int, like: torch.Tensor, *, name: str
) -> torch.Tensor:
    x = check_tensor(x, arg, name=name, dims=len(labels), layout=f"({', '.join(labels)})")
    if x.shape[-1] != width:
        raise ValueError(f"{name}: {arg} must have the last dimension {labels[-1]} = {width}, got {describe(x)}")
    check_sizes({arg: x}, {arg: labels}, name=name)
    _check_layer_dtype(x, arg, like, name=name)
    return x


def check_token_ids(tokens: object, arg: str, *, name: str, vocab: int, layout: str = "(B, N)") -> torch.Tensor:
    """Integer token ids in 0..vocab-1, a non-empty tensor of ``layout`` (reading the range syncs the host)."""
    dims = len([part for part in layout.strip("()").split(",") if part.strip()])  # "(B,)" -> 1
    if not isinstance(tokens, torch.Tensor):
        raise TypeError(f"{name}: {arg} must be a torch.Tensor of token ids {layout}, got {describe(tokens)}")
    if tokens.dtype not in (torch.int64, torch.int32):  # what nn.Embedding takes
        raise TypeError(f"{name}: {arg} must be an int64 or int32 tensor of token ids, got {describe(tokens)}")
    if tokens.dim() != dims or tokens.numel() == 0:
        raise ValueError(f"{name}: {arg} must be a non-empty {layout} tensor, got {describe(tokens)}")
    if tracing():  # the range needs the values on the host: a compiled graph leaves it to the embedding
        return tokens
    low, high = int(tokens.min()), int(tokens.max())
    if low < 0 or high >= vocab:
        raise ValueError(f"{name}: {arg} must hold token ids in 0..{vocab - 1}, got values in {low}..{high}")
    return tokens


def check_layer_inputs(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    *,
    name: str,
    d_input: int,
    like: torch.Tensor,
    same_length: bool = False,
    why: str = "",
) -> None:
    """queries (B, L, d_input), keys and values (B, S, d_input) of the dtype and device of the parameter ``like``;
    L == S with ``same_length``."""
    tensors = {"queries": queries, "keys": keys, "values": values}
    for arg, x in tensors.items():
        check_tensor(x, arg, name=name, dims=3, layout="(B, L, d_input)" if arg == "queries" else "(B, S, d_input)")

    def shapes() -> str:  # only when a check fails (module docstring: tracing)
        return ", ".join(f"{a} {shape_str(x)}" for a, x in tensors.items())

    for arg, x in tensors.items():
        if x.shape[-1] != d_input:
            raise ValueError(f"{name}: {arg} must have the last dimension d_input = {d_input}, got {shapes()}")
    if not (queries.shape[0] == keys.shape[0] == values.shape[0]):
        raise ValueError(
            f"{name}: keys and values must have the batch size B = {queries.shape[0]} of queries, got {shapes()}"
        )
    if keys.shape[1] != values.shape[1]:
        raise ValueError(f"{name}: values must have the length S = {keys.shape[1]} of keys, got {shapes()}")
    labels = {"queries": ("B", "L", "d_input"), "keys": ("B", "S", "d_input"), "values": ("B", "S", "d_input")}
    check_sizes(tensors, labels, name=name)
    if same_length and queries.shape[1] != keys.shape[1]:
        raise ValueError(f"{name}: keys must have the same length as queries (L == S){why}, got {shapes()}")
    for arg, x in tensors.items():
        _check_layer_dtype(x, arg, like, name=name)


# ----------------------------------------------------------------------------------------------------------
# Feature maps


def _lead_shape(x: torch.Tensor, lead: tuple[int, ...]) -> str:
    """x's shape with its leading dimensions (rows of B H) replaced by ``lead``, as the caller passed them."""
    return "(" + ", ".join(str(s) for s in (*lead, *x.shape[-2:])) + ")" if lead else shape_str(x)


def check_features(fx: object, x: torch.Tensor, *, name: str, label: str, lead: tuple[int, ...] = ()) -> torch.Tensor:
    """phi(x) is a floating tensor with x's leading dimensions (quoted as ``lead`` when given)."""
    if not isinstance(fx, torch.Tensor) or not fx.is_floating_point():
        raise TypeError(f"{name}: the feature map must return a floating-point tensor, got {describe(fx)}")
    if fx.dim() != x.dim() or fx.shape[:-1] != x.shape[:-1]:
        got = _lead_shape(fx, lead) if lead and fx.dim() == x.dim() else shape_str(fx)
        raise ValueError(
            f"{name}: the feature map must keep the leading dimensions of {label} {_lead_shape(x, lead)} "
            f"and map only the last one, got {got}"
        )
    if fx.shape[-1] < 1:
        raise ValueError(f"{name}: the feature map must give at least one feature (R >= 1), got {shape_str(fx)}")
    return fx


def check_feature_widths(
    fq: torch.Tensor,
    fk: torch.Tensor,
    *,
    name: str,
    labels: tuple[str, str] = ("q", "k"),
    lead: tuple[int, ...] = (),
) -> None:
    """The features of queries and keys have one width R."""
    if fq.shape[-1] != fk.shape[-1]:
        raise ValueError(
            f"{name}: the feature map must give {labels[0]} and {labels[1]} features of one width R, got "
            f"{labels[0]} features {_lead_shape(fq, lead)} but {labels[1]} features {_lead_shape(fk, lead)}"
        )


def check_drawn_width(drawn: int, D: int, *, name: str, got: str | Callable[[], str]) -> None:
    """Random features drawn for width ``drawn`` are applied to vectors of width D (``got``: what was received)."""
    if drawn != D:
        shown = got() if callable(got) else got
        raise ValueError(
            f"{name}: the PerformerFeatures must be drawn for the width D of q and k, drawn for D={drawn}, got {shown}"
        )


def check_feature_map(spec: T, known: Sequence[str], *, name: str) -> T:
    """A feature-map spec: one of the ``known`` names or a callable; returns it unchanged."""
    expected = ", ".join(repr(n) for n in known) + ", a callable or a PerformerFeatures"
    if isinstance(spec, str):
        if spec not in known:
            raise ValueError(f"{name}: feature_map must be {expected}, got {spec!r}")
        return spec
    if not callable(spec):
        raise TypeError(f"{name}: feature_map must be {expected}, got {describe(spec)}")
    return spec


# ----------------------------------------------------------------------------------------------------------
# Mixture of heads


def check_moh_heads(num_heads: object, shared_head: object, routed_head: object, *, name: str) -> tuple[int, int, int]:
    """Mixture-of-head head counts: ``routed_head = 0`` with ``shared_head = num_heads``, or ``routed_head >= 1``
    with ``shared_head + routed_head <= num_heads``; the message says what else would go wrong. Returns (H, h_s, k)."""
    H = check_int(num_heads, "num_heads", name=name, minimum=1)
    s = check_int(shared_head, "shared_head", name=name, minimum=0)
    k = check_int(routed_head, "routed_head", name=name, minimum=0)
    heads = f"num_heads={H}, shared_head={s}, routed_head={k}"
    if s > H:
        raise ValueError(f"{name}: shared_head must be at most num_heads, got more shared heads than heads ({heads})")
    if k == 0 and s == 0:
        raise ValueError(
            f"{name}: no head would ever be used: with routed_head=0 every head must be shared "
            f"(shared_head=num_heads) ({heads})"
        )
    if k == 0 and s < H:
        raise ValueError(
            f"{name}: with routed_head=0 no token can choose the {H - s} non-shared heads, so they would never be "
            f"used; set shared_head=num_heads or routed_head >= 1 ({heads})"
        )
    if s + k > H:
        raise ValueError(
            f"{name}: each token would use shared_head + routed_head = {s + k} heads but there are only {H}; "
            f"routed_head must be at most num_heads - shared_head = {H - s} ({heads})"
        )
    return H, s, k


def check_moh_routed(num_heads: int, shared_head: int, *, name: str, why: str = "") -> None:
    """An MoH layer with routed heads (``shared_head < num_heads``): one whose router chooses something."""
    if shared_head >= num_heads:
        raise ValueError(
            f"{name}: the layer must have routed heads (shared_head < num_heads){why}, got "
            f"num_heads={num_heads}, shared_head={shared_head}"
        )


def check_head_dim(head_dim: object, dim: int, num_heads: int, *, name: str) -> int:
    """A head width: given (an int >= 1), or ``dim // num_heads``, which must not be 0."""
    if head_dim is None:
        if dim < num_heads:
            raise ValueError(
                f"{name}: head_dim must be at least 1, got head_dim = dim // num_heads = {dim} // {num_heads} = 0; "
                f"pass head_dim or use fewer heads"
            )
        return dim // num_heads
    return check_int(head_dim, "head_dim", name=name, minimum=1)


def check_norm_layer(norm_layer: object, width: int, *, name: str, **factory: Any) -> nn.Module:
    """``norm_layer(width, **factory)``: a normalisation class or factory such as ``nn.LayerNorm``, built."""
    what = "a normalisation class or factory such as nn.LayerNorm, called as norm_layer(head_dim)"
    if isinstance(norm_layer, nn.Module) or not callable(norm_layer):
        raise TypeError(f"{name}: norm_layer must be {what}, got {describe(norm_layer)}")
    given = {key: value for key, value in factory.items() if value is not None}
    layer = norm_layer(width, **given)
    if not isinstance(layer, nn.Module):
        raise TypeError(f"{name}: norm_layer(head_dim) must return an nn.Module, got {describe(layer)}")
    return layer


def check_callables(fns: object, arg: str, *, name: str) -> dict[str, Callable[[], Any]]:
    """A non-empty dict of zero-argument callables (name -> callable)."""
    if not isinstance(fns, dict):
        raise TypeError(f"{name}: {arg} must be a dict of name -> zero-argument callable, got {describe(fns)}")
    if not fns:
        raise ValueError(f"{name}: {arg} must hold at least one callable to time, got an empty dict")
    for key, fn in fns.items():
        check_callable(fn, f"{arg}[{key!r}]", name=name, what="a zero-argument callable")
    return fns


def check_module(model: object, arg: str, *, name: str) -> nn.Module:
    """``model`` if it is an ``nn.Module``."""
    return check_instance(model, arg, nn.Module, name=name, what="an nn.Module")


def check_found(items: SizedT, arg: str, *, name: str, expected: str, got: str, minimum: int = 1) -> SizedT:
    """``items`` (e.g. the layers of a kind found in a model) holds at least ``minimum`` entries."""
    if len(items) < minimum:
        raise ValueError(f"{name}: {arg} must {expected}, got {got}")
    return items


@overload
def check_supported(supported: Literal[False], arg: str, *, name: str, expected: str, got: str) -> NoReturn: ...


@overload
def check_supported(supported: bool, arg: str, *, name: str, expected: str, got: str) -> None: ...


def check_supported(supported: bool, arg: str, *, name: str, expected: str, got: str) -> None:
    """A capability the object may lack, worded as :func:`check_found`; ``supported=False`` always raises."""
    if not supported:
        raise ValueError(f"{name}: {arg} must {expected}, got {got}")


def check_extra(modules: Sequence[str], *, extra: str, name: str) -> None:
    """The packages of an optional extra are importable, else an ``ImportError`` naming them and the extra."""
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ImportError(
            f"{name} must have the packages of attnbook's '{extra}' extra (install them with "
            f"pip install 'attnbook[{extra}]'), got no {', '.join(missing)}"
        )


# Every check, and the two helpers that word the messages (accumulation_dtype is attnbook._runtime's, re-exported).
__all__ = ["shape_str", "describe", "accumulation_dtype", *(name for name in dir() if name.startswith("check_"))]
