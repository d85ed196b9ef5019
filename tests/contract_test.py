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
