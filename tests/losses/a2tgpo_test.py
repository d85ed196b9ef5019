"""A2TGPO policy loss (credit/losses/policy/a2tgpo.py): adaptive per-turn clip range."""
from __future__ import annotations

import numpy as np

from credit import registry
from credit.losses.policy import a2tgpo as loss_mod
from tests.advantages.turn.a2tgpo_test import EXAMPLE

TURN_FIELDS = ("gold_logprob_turns", "gold_logprob_prompt", "step_mask", "turn_id", "group_id")


def _batch(ratio):
  m = EXAMPLE["response_mask"]
  old = np.full(m.shape, -1.0, np.float32)
  return dict(logprob=(old + np.log(ratio)).astype(np.float32), logprob_old=old,
              advantages=np.ones(m.shape, np.float32), response_mask=m,
              **{k: EXAMPLE[k] for k in TURN_FIELDS})


def np_loss(ratio, adv, eps, mask):
  lc = np.maximum(-adv * ratio, -adv * np.clip(ratio, 1 - eps, 1 + eps))
  return (lc * mask).sum() / mask.sum()


def test_registered_with_turn_fields():
  spec = registry.get_policy_loss("a2tgpo")
  assert spec.confidence == "inferred"
  assert set(TURN_FIELDS) <= spec.needs
  assert spec.token_fn is loss_mod.a2tgpo_loss


def test_example_clip_ranges_bind():
  # Spec §5 example: ε = [[0.1238, 0.2, 0.2], [0.2762, 0.2]]; ratio 1.25 everywhere, A = 1.
  spec = registry.get_policy_loss("a2tgpo")
  out = spec.fn(**_batch(1.25))
  eps = np.array([[0.123809, 0.2, 0.2], [0.276191, 0.2, 0.2]])
  m = EXAMPLE["response_mask"]
  want = np_loss(1.25, 1.0, eps, m)
  np.testing.assert_allclose(float(out.loss), want, atol=1e-5)
  np.testing.assert_allclose(float(out.metrics["clip_eps_mean"]), eps[m].mean(), atol=1e-5)
  # Turn 1 of rollout 1 (ε = 0.2762) is the only token left unclipped at ratio 1.25.
  np.testing.assert_allclose(float(out.metrics["clipfrac"]), 4 / 5, atol=1e-6)


def test_without_turn_fields_is_ppo_clip():
  b = _batch(1.25)
  core = {k: b[k] for k in ("logprob", "logprob_old", "advantages", "response_mask")}
  got = registry.get_policy_loss("a2tgpo").fn(**core)
  want = registry.get_policy_loss("ppo_clip").fn(**core)
  np.testing.assert_allclose(float(got.loss), float(want.loss), atol=1e-7)


def test_group_ids_need_no_static_count():
  b = _batch(1.25)
  big = dict(b, group_id=np.array([1000, 1000], np.int32))
  f = registry.get_policy_loss("a2tgpo").fn
  np.testing.assert_allclose(float(f(**big).loss), float(f(**b).loss), atol=1e-7)
  np.testing.assert_array_equal(
      np.asarray(loss_mod.dense_group_ids(np.array([7, 3, 7, 3, 9]), np.array([1, 1, 1, 0, 1],
                                                                             bool))),
      [0, 1, 0, 3, 4])
