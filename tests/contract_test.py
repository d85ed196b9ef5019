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
                     reward=jnp.ones(2), extras={"sub_rewards": jnp.ones((2, 3))})
  import jax
  leaves = jax.tree.leaves(r)
  assert len(leaves) == 4
  assert set(r.fields(["reward", "sub_rewards"])) == {"reward", "sub_rewards"}
  with pytest.raises(ValueError, match="lacks field"):
    r.fields(["logprob_ref"])
  credit.validate_rollout(r)


def test_contiguous_group_size():
  assert contract.contiguous_group_size(np.repeat(np.arange(3), 4)) == 4
  assert contract.contiguous_group_size(np.array([0, 1, 0, 1])) is None


def test_unknown_names_list_known_ones():
  with pytest.raises(credit.UnknownNameError, match="Unknown estimator.*Known: .*'grpo'"):
    credit.get_estimator("no-such-estimator")
  with pytest.raises(credit.UnknownNameError, match="Unknown policy loss.*Known: .*'ppo_clip'"):
    credit.get_policy_loss("no-such-loss")


def test_registry_reimport_is_idempotent_but_name_clashes_are_errors():
  from credit import registry

  def make():  # a fresh function object per call, same module and qualname: a re-import
    def my_estimator(*, reward):
      """Test estimator."""
      return reward
    return my_estimator

  first, second = make(), make()
  try:
    registry.register_estimator("_test_reimport", needs=("reward",), paper="",
                                confidence="inferred", source="a test")(first)
    registry.register_estimator("_test_reimport", needs=("reward",), paper="",
                                confidence="inferred", source="a test")(second)
    assert registry.get_estimator("_test_reimport").fn is second

    def other(*, reward):
      """Another."""
      return reward

    with pytest.raises(ValueError, match="'_test_reimport' registered twice"):
      registry.register_estimator("_test_reimport", needs=("reward",), paper="",
                                  confidence="inferred", source="a test")(other)
    assert registry.get_estimator("_test_reimport").fn is second
    with pytest.raises(ValueError, match="'grpo' registered twice"):
      registry.register_estimator("grpo", needs=("reward",), paper="",
                                  confidence="inferred", source="a test")(other)
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


def test_contract_is_one_complete_table():
  letters = set("BTKRkMAFJUCS")
  for name, f in credit.CONTRACT.items():
    assert set(f.shape) <= letters and f.shape.startswith("B"), name
    assert f.dtype in ("i", "b", "f") and f.meaning, name
    assert not (f.finite and f.dtype != "f"), name
  # Rollout is derived from the table: one attribute per field, absent ones None.
  r = credit.Rollout(tokens=np.zeros((2, 3), np.int32), response_mask=np.ones((2, 3), bool))
  assert set(credit.CONTRACT) <= set(vars(r))
  assert r.present() == ["tokens", "response_mask"]
  for name in ("prompt_id", "reward_baseline", "reward_components", "sum_pi_squared",
               "is_weights", "step_reward", "step_id", "logprob_teacher", "logprob_alt",
               "teacher_topk_logprob", "teacher_topk_ids", "values", "parent_id", "prefix_len",
               "sample_weight", "policy_version"):
    assert name in credit.CONTRACT, name


def test_fields_beyond_bt_are_checked():
  f = _fields()
  f["reward_components"] = np.ones((4, 2), np.float32)
  f["teacher_topk_logprob"] = np.zeros((4, 5, 3), np.float32)
  f["teacher_topk_ids"] = np.zeros((4, 5, 3), np.int32)
  dims = contract.validate_fields(f, num_groups=2)
  assert dims == {"B": 4, "T": 5, "R": 2, "k": 3}
  bad = dict(f, teacher_topk_ids=np.zeros((4, 5, 2), np.int32))
  with pytest.raises(contract.ContractError, match="`teacher_topk_ids`.*k=3"):
    contract.validate_fields(bad, num_groups=2)
  bad = dict(f, teacher_topk_logprob=np.full((4, 5, 3), np.nan, np.float32))
  contract.validate_fields(bad, num_groups=2)   # not required finite (tail bucket may be -inf)
  nan = f["reward_components"].copy()
  nan[1, 0] = np.nan
  with pytest.raises(contract.ContractError, match="`reward_components` contains NaN"):
    contract.validate_fields(dict(f, reward_components=nan), num_groups=2)
  masked = dict(f, response_mask=np.array([[1, 1, 0, 0, 0]] * 4, bool),
                sum_pi_squared=np.where(np.arange(5) < 2, 0.5, np.nan).astype(np.float32)
                * np.ones((4, 1), np.float32))
  contract.validate_fields(masked, num_groups=2)   # NaN only outside the response: fine


def test_registration_requires_provenance():
  """`confidence` and `source` are arguments of every registration; errors name the method."""
  from credit import losses, registry

  def est(*, reward):
    return reward

  with pytest.raises(ValueError, match="'_test_prov'.*confidence= and source="):
    registry.register_estimator("_test_prov", needs=("reward",), paper="p")(est)
  with pytest.raises(ValueError, match="'_test_prov'.*source="):
    registry.register_estimator("_test_prov", needs=("reward",), paper="p",
                                confidence="inferred")
  with pytest.raises(ValueError, match="'_test_prov'.*confidence='guessed' is not one of"):
    registry.register_estimator("_test_prov", needs=("reward",), paper="p",
                                confidence="guessed", source="p")
  with pytest.raises(ValueError, match="'_test_prov'.*must name the code"):
    registry.register_estimator("_test_prov", needs=("reward",), paper="p",
                                confidence="code-verified", source="the paper only")
  with pytest.raises(ValueError, match="policy loss '_test_prov_loss'.*confidence="):
    registry.register_policy_loss("_test_prov_loss", needs=("logprob",), paper="p")
  with pytest.raises(ValueError, match="policy loss '_test_prov_loss'.*confidence="):
    losses.policy_loss("_test_prov_loss", paper="p")(
        registry.get_policy_loss("ppo_clip").token_fn)
  assert "_test_prov" not in registry.list_estimators()
  try:
    registry.register_estimator("_test_prov", needs=("reward",), paper="p",
                                confidence="code-verified",
                                source="A paper, arXiv:0000.00000; "
                                "code: owner/repo@abc1234 f.py")(est)
    spec = registry.get_estimator("_test_prov")
    assert spec.confidence == "code-verified" and "owner/repo@abc1234" in spec.source
  finally:
    registry._ESTIMATORS.pop("_test_prov", None)
  for spec in [*map(registry.get_estimator, registry.list_estimators()),
               *map(registry.get_policy_loss, registry.list_policy_losses())]:
    assert spec.confidence in registry.CONFIDENCE_TAGS and spec.source.strip(), spec.name
