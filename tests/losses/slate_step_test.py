"""SLATE's step objective (credit/losses/policy/slate_step.py) against a transcription of
algoprog/SLATE `aggregate_step_objectives` (Eq. 7), on a two-prompt tree batch.

Registry-wide properties (masked rows, padding, sharding, vmap) run in
tests/registry_common_test.py.
"""
import chex
import jax
import numpy as np
import pytest

from credit import losses
from credit.registry import get_policy_loss

jax.config.update("jax_numpy_rank_promotion", "raise")

T = 5


def code_step_objective(step_advantages, step_log_ratios, clip_eps=0.2):
  """`aggregate_step_objectives` without its KL: mean over steps of the mean over the k
  candidates of min(ρA, clip(ρ)A), ρ = exp(mean token log-ratio). It returns J (maximised)."""
  total = 0.0
  for adv, log_ratio in zip(step_advantages, step_log_ratios):
    ratio = np.exp(log_ratio)
    surr1 = ratio * adv
    surr2 = np.clip(ratio, 1 - clip_eps, 1 + clip_eps) * adv
    total += np.minimum(surr1, surr2).mean()
  return total / max(len(step_advantages), 1)


def tree_batch(seed=0):
  """Prompt 0: two steps of k = 3 candidates (the second continues row 1); prompt 1: one
  step of k = 2 candidates plus an empty row. Rows own only their step's tokens."""
  rng = np.random.default_rng(seed)
  parent = np.array([-1, -1, -1, 1, 1, 1, -1, -1, -1], np.int32)
  prefix = np.array([0, 0, 0, 2, 2, 2, 0, 0, 0], np.int32)
  gid = np.array([0, 0, 0, 0, 0, 0, 7, 7, 7], np.int32)
  lens = np.array([2, 2, 1, 3, 2, 3, 4, 2, 0])
  starts = prefix
  col = np.arange(T)[None, :]
  mask = (col >= starts[:, None]) & (col < (starts + lens)[:, None])
  old = (-np.abs(rng.normal(size=(9, T))) - 0.1).astype(np.float32)
  lp = (old + 0.3 * rng.normal(size=(9, T))).astype(np.float32)
  adv_row = rng.normal(size=9).astype(np.float32)
  adv = np.repeat(adv_row[:, None], T, 1).astype(np.float32)
  return dict(logprob=lp, logprob_old=old, advantages=adv, response_mask=mask,
              parent_id=parent, prefix_len=prefix, group_id=gid)


# Rows of each step (candidate set) of each prompt.
STEPS = {0: [[0, 1, 2], [3, 4, 5]], 7: [[6, 7]]}


def code_loss(b, lp=None):
  lp = b["logprob"] if lp is None else lp
  lp, old = np.asarray(lp, np.float64), np.asarray(b["logprob_old"], np.float64)
  m = b["response_mask"]
  per_prompt = []
  for steps in STEPS.values():
    advs = [np.array([b["advantages"][j, m[j]].mean() for j in s]) for s in steps]
    lrs = [np.array([(lp[j] - old[j])[m[j]].mean() for j in s]) for s in steps]
    per_prompt.append(code_step_objective(advs, lrs))
  return -np.mean(per_prompt)  # E_x, and minimised as a loss


def _run(b, **kw):
  fn = get_policy_loss("slate_step").fn
  f = lambda lp: tuple(fn(**{**b, "logprob": lp}, **kw))  # noqa: E731
  (loss, metrics), g = jax.value_and_grad(f, has_aux=True)(b["logprob"])
  return float(loss), metrics, np.asarray(g)


@pytest.mark.parametrize("seed", (0, 1, 2))
def test_matches_the_code_value_and_gradient(seed):
  b = tree_batch(seed)
  loss, metrics, g = _run(b)
  np.testing.assert_allclose(loss, code_loss(b), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(metrics["step_weight_sum"], 1.0, rtol=1e-6)
  # The code's gradient by central differences (float64) on every loss token.
  h = 1e-5
  want = np.zeros_like(g, np.float64)
  for i, t in zip(*np.nonzero(b["response_mask"])):
    up, dn = b["logprob"].astype(np.float64), b["logprob"].astype(np.float64)
    up[i, t] += h
    dn[i, t] -= h
    want[i, t] = (code_loss(b, up) - code_loss(b, dn)) / (2 * h)
  np.testing.assert_allclose(g, want, rtol=1e-3, atol=1e-5)
  assert np.all(g[~b["response_mask"]] == 0.0)


def test_clipped_step_has_no_gradient_and_positive_advantage_is_pushed_up():
  # One root step of two candidates: the first's ratio e^0.5 > 1.2 with A > 0 is clipped;
  # the second (ratio 1, A > 0) gets −A·ρ/(k·|o|) = −1/(2·2) per token.
  b = dict(logprob=np.array([[0.0, -1.0], [-1.0, -1.0]], np.float32),
           logprob_old=np.array([[-0.5, -1.5], [-1.0, -1.0]], np.float32),
           advantages=np.ones((2, 2), np.float32), response_mask=np.ones((2, 2), bool),
           parent_id=np.full(2, -1, np.int32), prefix_len=np.zeros(2, np.int32),
           group_id=np.zeros(2, np.int32))
  loss, metrics, g = _run(b)
  np.testing.assert_allclose(loss, -(1.2 + 1.0) / 2, rtol=1e-6)
  np.testing.assert_allclose(g, [[0.0, 0.0], [-0.25, -0.25]], rtol=1e-6)
  np.testing.assert_allclose(metrics["clipfrac"], 0.5)


def test_without_tree_fields_is_gspo_with_eps_02_over_rows():
  b = tree_batch(3)
  flat = {k: b[k] for k in ("logprob", "logprob_old", "advantages", "response_mask")}
  loss, _, g = _run(flat)
  gspo = get_policy_loss("gspo").fn
  f = lambda lp: gspo(**{**flat, "logprob": lp}, clip_low=0.2, clip_high=0.2).loss  # noqa: E731
  want, g_want = jax.value_and_grad(f)(flat["logprob"])
  np.testing.assert_allclose(loss, want, rtol=1e-5)
  np.testing.assert_allclose(g, g_want, rtol=1e-5, atol=1e-7)


def test_prompt_ids_and_row_order_do_not_matter():
  b = tree_batch(4)
  loss, _, g = _run(b)
  b2 = dict(b, group_id=np.where(b["group_id"] == 0, 123, -5).astype(np.int32))
  loss2, _, g2 = _run(b2)
  np.testing.assert_allclose(loss2, loss, rtol=1e-6)
  np.testing.assert_allclose(g2, g, rtol=1e-6)


class JitTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_jit_equals_eager(self):
    b = tree_batch(5)
    fn = get_policy_loss("slate_step").fn
    out = self.variant(lambda **kw: fn(**kw).loss)(**b)
    np.testing.assert_allclose(out, fn(**b).loss, rtol=1e-6)
    tok = losses.slate_step_loss(**b)
    assert tok.loss.shape == (9, T)
