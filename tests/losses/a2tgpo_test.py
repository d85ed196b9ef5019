"""A2TGPO policy loss (credit/losses/policy/a2tgpo.py): adaptive per-turn clip range."""
from __future__ import annotations

import jax
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
  # Worked example: ε = [[0.1238, 0.2, 0.2], [0.2762, 0.2]]; ratio 1.25 everywhere, A = 1.
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


def test_dense_group_ids_match_the_pairwise_definition():
  # dense_group_ids (one sort) = the [B,B] definition: a valid row maps to the first valid row
  # with its id, an invalid row to itself; ids may repeat, interleave and be negative.
  def pairwise(g, v):
    return [min(j for j in range(len(g)) if v[j] and g[j] == g[b]) if v[b] else b
            for b in range(len(g))]

  rng = np.random.default_rng(0)
  dense = jax.jit(loss_mod.dense_group_ids)
  for n in (1, 16):
    for _ in range(6):
      g = rng.integers(-2, 4, n).astype(np.int32)
      v = rng.random(n) < 0.7
      np.testing.assert_array_equal(np.asarray(dense(g, v)), pairwise(g, v))


def test_declares_whole_groups_and_whole_groups_give_the_full_batch_terms():
  # The runner's minibatches hold whole groups because of this flag: the per-token loss on
  # any subset of whole groups (in any order) is the full batch's, a split group's is not.
  from tests.contract_fields import G, make_fields
  assert registry.get_policy_loss("a2tgpo").whole_groups
  b = make_fields(4)
  args = {k: b[k] for k in ("logprob", "logprob_old", "advantages", "response_mask")
          + TURN_FIELDS}
  args["logprob"] = args["logprob_old"] + np.float32(0.15)  # ρ = 1.16: the clip range binds
  tok = jax.jit(lambda a: loss_mod.a2tgpo_loss(**a).loss)
  full = np.asarray(tok(args))
  rows = np.r_[3 * G:4 * G, 0:G]            # groups 3 and 0, in that order
  got = np.asarray(tok({k: v[rows] for k, v in args.items()}))
  np.testing.assert_allclose(got, full[rows], rtol=1e-6, atol=1e-7)
  split = np.r_[0:G - 1, G:2 * G + 1]       # group 0 without its last row (same shape)
  got = np.asarray(tok({k: v[split] for k, v in args.items()}))
  assert not np.allclose(got[:G - 1], full[:G - 1], atol=1e-4)
