"""Low-rank adapters (LoRA) on the decoder's einsum projections.

Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", arXiv:2106.09685, eq. 3:

  h = W₀x + (α/r)·B A x,   A ∈ R^{r×in} (random),  B ∈ R^{out×r} = 0 at init,

so the adapted model starts equal to the base model. A is drawn U(-1/√fan_in, 1/√fan_in), the
default of the PEFT library (kaiming_uniform with a=√5); no dropout. Here a projection is an einsum
such as ``BTD,DNH->BTNH``: A has the kernel's input letters plus the rank (``Dr``), B the rank plus
the output letters (``rNH``), and merging adds ``(α/r)·einsum("Dr,rNH->DNH", A, B)`` to the kernel.

Adapter weights are `LoRAParam` (a subclass of `nnx.Param`), so either
  * ``nnx.Optimizer(model, tx, wrt=LoRAParam)`` with grads from
    ``nnx.grad(loss, argnums=nnx.DiffState(0, LoRAParam))``, or
  * ``optax.multi_transform({True: tx, False: optax.set_to_zero()}, lora_trainable_mask(state))``
    over the whole ``nnx.state(model, nnx.Param)``
trains only the adapters. (`optax.masked` alone is not enough: it passes the raw gradient through
for masked-out leaves.)
"""
from __future__ import annotations

import math
import re
from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from credit.models.decoder import Einsum


class LoRAParam(nnx.Param):
  """A trainable low-rank adapter weight."""


def _split_spec(einsum_str: str):
  lhs, out = einsum_str.split("->")
  x_letters, k_letters = lhs.split(",")
  in_letters = "".join(c for c in k_letters if c in x_letters)
  out_k_letters = "".join(c for c in k_letters if c not in x_letters)
  rest = "".join(c for c in x_letters if c not in in_letters)
  return x_letters, k_letters, in_letters, out_k_letters, rest, out


class LoRAEinsum(nnx.Module):
  """`base(x) + (alpha/rank) · B(A(x))` around a frozen `Einsum` projection."""

  def __init__(self, base: Einsum, *, rank: int, alpha: float, rngs: nnx.Rngs):
    if "r" in base.einsum_str:
      raise ValueError(f"einsum {base.einsum_str!r} already uses the rank letter 'r'")
    self.base = base
    self.rank = rank
    self.alpha = alpha
    x_l, k_l, in_l, out_l, rest, out = _split_spec(base.einsum_str)
    shape = dict(zip(k_l, base.kernel.shape))
    axes = dict(zip(k_l, base.kernel.get_metadata().get("out_sharding") or (None,) * len(k_l)))
    pdt = base.kernel[...].dtype
    fan_in = math.prod(shape[c] for c in in_l)
    bound = 1.0 / math.sqrt(fan_in)
    a = jax.random.uniform(rngs.params(), tuple(shape[c] for c in in_l) + (rank,), jnp.float32,
                           -bound, bound).astype(pdt)
    self.lora_a = LoRAParam(a, out_sharding=tuple(axes[c] for c in in_l) + ("lora_rank",),
                            eager_sharding=False)
    self.lora_b = LoRAParam(jnp.zeros((rank,) + tuple(shape[c] for c in out_l), pdt),
                            out_sharding=("lora_rank",) + tuple(axes[c] for c in out_l),
                            eager_sharding=False)
    self.a_str = f"{x_l},{in_l}r->{rest}r"
    self.b_str = f"{rest}r,r{out_l}->{out}"
    self.merge_str = f"{in_l}r,r{out_l}->{k_l}"

  @property
  def scale(self) -> float:
    return self.alpha / self.rank

  def __call__(self, x):
    dt = self.base.dtype
    z = jnp.einsum(self.a_str, x.astype(dt), self.lora_a[...].astype(dt))
    return self.base(x) + self.scale * jnp.einsum(self.b_str, z, self.lora_b[...].astype(dt))

  def merged_kernel(self):
    """W₀ + (α/r)·A·B in the kernel's layout and dtype (sum taken in float32)."""
    k = self.base.kernel[...]
    delta = jnp.einsum(self.merge_str, self.lora_a[...].astype(jnp.float32),
                       self.lora_b[...].astype(jnp.float32))
    return (k.astype(jnp.float32) + self.scale * delta).astype(k.dtype)


def _path_str(path) -> str:
  return ".".join(str(p) for p in path)


def _matches(path, targets: Sequence[str]) -> bool:
  name, dotted = str(path[-1]), _path_str(path)
  return any(t == name or re.fullmatch(t, dotted) for t in targets)


def _parent(model, path):
  obj = model
  for key in path[:-1]:
    obj = obj[key] if isinstance(key, int) else getattr(obj, key)
  return obj


def _set_child(parent, key, value):
  if isinstance(key, int):
    parent[key] = value
  else:
    setattr(parent, key, value)


def apply_lora(model: nnx.Module, *, rank: int, alpha: float,
               targets: Sequence[str] = ("q_proj", "v_proj"), rngs: nnx.Rngs) -> nnx.Module:
  """Wrap matching projections in place with LoRA adapters; returns the model.

  Args:
    model: a Decoder (or any module holding `Einsum` projections).
    rank: r.
    alpha: α (the update is scaled by α/r).
    targets: attribute names ("q_proj", "gate_proj", ...) or regular expressions matched in full
      against the dotted path (e.g. r"layers\\.[01]\\.self_attn\\.o_proj").
    rngs: source of the `params` keys for A.
  Raises:
    ValueError if nothing matches.
  """
  found = [(p, m) for p, m in nnx.iter_graph(model)
           if isinstance(m, Einsum) and p and _matches(p, targets)]
  if not found:
    raise ValueError(f"no projection matches targets {tuple(targets)}")
  for path, module in found:
    _set_child(_parent(model, path), path[-1],
               LoRAEinsum(module, rank=rank, alpha=alpha, rngs=rngs))
  return model


def lora_trainable_mask(params_state):
  """Same structure as an nnx.State of Variables, holding True for LoRA weights, False elsewhere.

  Use as labels of `optax.multi_transform` (see module docstring) or as an `optax.masked` mask.
  """
  return jax.tree.map(lambda v: v.replace(isinstance(v, LoRAParam)), params_state,
                      is_leaf=lambda x: isinstance(x, nnx.Variable))


def merge_lora(model: nnx.Module, *, inplace: bool = False) -> nnx.Module:
  """A plain model (no adapters) whose kernels are W₀ + (α/r)·A·B, ready for `save_pretrained`.

  By default works on a copy (`nnx.clone`), leaving `model` untouched.
  """
  out = model if inplace else nnx.clone(model)
  found = [(p, m) for p, m in nnx.iter_graph(out) if isinstance(m, LoRAEinsum)]
  for path, module in found:
    base = module.base
    base.kernel.set_value(module.merged_kernel())
    _set_child(_parent(out, path), path[-1], base)
  return out
