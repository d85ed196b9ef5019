"""Tests of the rollout contract, eager validation and registry lookups."""
import jax.numpy as jnp
import numpy as np
import pytest

import credit
from credit import contract


def _fields(B=4, T=5):
  return dict(tokens=np.zeros((B, T), np.int32), response_mask=np.ones((B, T), bool),
              group_id=np.array([0, 0, 1, 1], np.int32), reward=np.ones(B, np.float32),
              logprob_old=np.zeros((B, T), np.float32))


def test_valid_fields_give_dims():
  assert contract.validate_fields(_fields(), num_groups=2) == {"B": 4, "T": 5}


@pytest.mark.parametrize("name,value,match", [
    ("reward", np.ones((4, 1), np.float32), r"`reward` must have shape \[B\]"),
    ("logprob_old", np.zeros((4, 6), np.float32), r"`logprob_old` has shape \(4, 6\).*T=5"),
    ("group_id", np.zeros(4, np.float32), "integer dtype"),
    ("reward", np.array([1, np.nan, 0, 0], np.float32), "`reward` contains NaN"),
    ("logprob_old", np.full((4, 5), -np.inf, np.float32), "`logprob_old` contains inf"),
    ("response_mask", np.zeros((4, 5), bool), "selects no token"),
    ("group_id", np.array([0, 0, 1, 2], np.int32), r"num_groups=2"),
    ("response_mask", np.full((4, 5), 2, np.int32), "only 0/1"),
])
def test_bad_input_is_named(name, value, match):
  f = _fields()
  f[name] = value
  with pytest.raises(contract.ContractError, match=match):
    contract.validate_fields(f, num_groups=2)


def test_nan_outside_mask_is_allowed():
  f = _fields()
  f["response_mask"] = np.array([[1, 1, 0, 0, 0]] * 4, bool)
  f["logprob_old"] = np.where(f["response_mask"], 0.0, np.nan).astype(np.float32)
  contract.validate_fields(f, num_groups=2)


def test_rollout_is_a_pytree_and_fields_lookup():
  r = credit.Rollout(tokens=jnp.zeros((2, 3), jnp.int32), response_mask=jnp.ones((2, 3), bool),
                     reward=jnp.ones(2), extras={"prompt_id": jnp.arange(2)})
  import jax
  leaves = jax.tree.leaves(r)
  assert len(leaves) == 4
  assert set(r.fields(["reward", "prompt_id"])) == {"reward", "prompt_id"}
  with pytest.raises(ValueError, match="lacks field"):
    r.fields(["logprob_ref"])
  credit.validate_rollout(r)


def test_contiguous_group_size():
  assert contract.contiguous_group_size(np.repeat(np.arange(3), 4)) == 4
  assert contract.contiguous_group_size(np.array([0, 1, 0, 1])) is None


def test_unknown_names_list_known_ones():
  with pytest.raises(credit.UnknownNameError, match="Known estimators"):
    credit.get_estimator("no-such-estimator")
  with pytest.raises(credit.UnknownNameError, match="Known policy losss|Known policy loss"):
    credit.get_policy_loss("no-such-loss")


def test_registry_reimport_is_idempotent_but_name_clashes_are_errors():
  from credit import registry

  def make():  # a fresh function object per call, same module and qualname: a re-import
    def my_estimator(**_):
      return None
    return my_estimator

  first, second = make(), make()
  try:
    registry.register_estimator("_test_reimport", needs=("reward",), paper="")(first)
    registry.register_estimator("_test_reimport", needs=("reward",), paper="")(second)
    assert registry.get_estimator("_test_reimport").fn is second

    def other(**_):
      return None

    with pytest.raises(ValueError, match="'_test_reimport' registered twice"):
      registry.register_estimator("_test_reimport", needs=(), paper="")(other)
    assert registry.get_estimator("_test_reimport").fn is second
    with pytest.raises(ValueError, match="'grpo' registered twice"):
      registry.register_estimator("grpo", needs=(), paper="")(other)
  finally:
    registry._ESTIMATORS.pop("_test_reimport", None)


def test_optional_needs_are_switched_on_by_hyperparameters():
  spec = credit.get_estimator("reinforce_pp")
  assert spec.needs_for({}) == {"reward", "response_mask"}
  assert spec.needs_for({"kl_coef": 0.0}) == {"reward", "response_mask"}
  assert spec.needs_for({"kl_coef": 0.05}) == {"reward", "response_mask", "logprob_old",
                                               "logprob_ref"}
  assert credit.get_estimator("grpo").needs_for({"kl_coef": 1.0}) == credit.get_estimator(
      "grpo").needs
