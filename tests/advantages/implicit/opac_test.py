"""OPAC latent-reward actor-critic on logged rollouts (credit/advantages/implicit/opac.py)."""
from __future__ import annotations

import chex
import hypothesis
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st

from credit.advantages.implicit import opac_advantages
from tests.advantages.outcome._harness import Case, reference_test, valid_groups
from tests.advantages.shaping._behaviour_ref import check_properties
from tests.advantages.shaping._harness_a import jcall

FIELDS = ("reward", "group_id", "response_mask", "tokens")


def ref_opac(b, feature_dim=64, ridge=1.0, pessimism=0.1):
  valid, groups = valid_groups(b)
  mask, tok = b["response_mask"], b["tokens"]
  B, T = mask.shape
  phi = np.zeros((B, feature_dim))
  for i in np.flatnonzero(valid):
    for t in np.flatnonzero(mask[i]):
      phi[i, tok[i, t] % feature_dim] += 1
  lam = phi.T @ phi + ridge * np.eye(feature_dim)
  w = np.linalg.solve(lam, phi.T @ np.where(valid, b["reward"], 0.0))
  unc = np.sqrt(np.diag(np.linalg.inv(lam)))
  r = np.zeros((B, T))
  u = np.zeros((B, T))
  for i in np.flatnonzero(valid):
    for t in np.flatnonzero(mask[i]):
      k = tok[i, t] % feature_dim
      r[i, t], u[i, t] = w[k] - pessimism * unc[k], unc[k]
  ret = np.flip(np.cumsum(np.flip(r, 1), 1), 1)
  adv = np.zeros((B, T))
  for rows in groups:
    for t in range(T):
      on = [i for i in rows if mask[i, t]]
      for i in on:
        adv[i, t] = ret[i, t] - np.mean([ret[j, t] for j in on])
  return adv, r, u, w


CASES = [
    Case("opac", "opac", FIELDS, ref_opac),
    Case("opac_pessimistic_small", "opac", FIELDS, ref_opac,
         (("feature_dim", 8), ("ridge", 0.5), ("pessimism", 1.0))),
]

test_matches_numpy_reference = reference_test(CASES)
TOK = np.array([[1, 2], [1, 3]], np.int32)
KW = dict(group_id=np.zeros(2, np.int32), response_mask=np.ones((2, 2), bool), num_groups=1,
          feature_dim=4)


def test_worked_example():
  # Φ = [e1+e2, e1+e3], R = [1, 0]: Λ = [[3,1,1],[1,2,0],[1,0,2]] on buckets 1..3 (+ λ=1
  # on bucket 0), w = Λ⁻¹ΦᵀR = [0, .25, .375, −.125]. Returns-to-go: row 0 [.625, .375],
  # row 1 [.125, −.125]; position baselines [.375, .125] -> A = ±.25.
  out = jcall(opac_advantages, reward=np.array([1., 0], np.float32), tokens=TOK,
              pessimism=0.0, **KW)
  np.testing.assert_allclose(out.weights, [0, 0.25, 0.375, -0.125], atol=1e-6)
  np.testing.assert_allclose(out.advantages, [[0.25, 0.25], [-0.25, -0.25]], atol=1e-6)
  # (Λ⁻¹)_kk = [1, 0.5, 0.625, 0.625]: the shared token 1 is the best known.
  out = jcall(opac_advantages, reward=np.array([1., 0], np.float32), tokens=TOK, **KW)
  np.testing.assert_allclose(out.uncertainty, np.sqrt([[0.5, 0.625], [0.5, 0.625]]), atol=1e-6)
  np.testing.assert_allclose(out.token_reward, [[0.25 - 0.1 * np.sqrt(0.5), 0.375 - 0.1 * np.sqrt(
      0.625)], [0.25 - 0.1 * np.sqrt(0.5), -0.125 - 0.1 * np.sqrt(0.625)]], atol=1e-6)


def test_pessimism_penalises_rarely_seen_tokens_more():
  # Token 5 appears in every row, token 6 once: its latent reward is pulled down further.
  tok = np.array([[5, 5, 6], [5, 5, 5], [5, 5, 5], [5, 5, 5]], np.int32)
  kw = dict(reward=np.array([1., 1, 1, 1], np.float32), tokens=tok,
            group_id=np.zeros(4, np.int32), response_mask=np.ones((4, 3), bool), num_groups=1)
  plain = jcall(opac_advantages, pessimism=0.0, **kw)
  pess = jcall(opac_advantages, pessimism=1.0, **kw)
  drop = np.asarray(plain.token_reward) - np.asarray(pess.token_reward)
  assert drop[0, 2] > 3 * drop[0, 0] > 0


@hypothesis.settings(max_examples=10, deadline=None)
@hypothesis.given(data=st.data())
def test_properties(data):
  def call(b, jit):
    kw = {f: b[f] for f in FIELDS}
    out = jcall(opac_advantages, num_groups=4, **kw) if jit else opac_advantages(
        num_groups=4, **kw)
    return tuple(np.asarray(x) for x in out)
  check_properties(data, call)


class JitTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_jit_equals_eager_on_the_worked_example(self):
    fn = self.variant(lambda r, t: opac_advantages(
        reward=r, tokens=t, group_id=jnp.zeros(2, jnp.int32),
        response_mask=jnp.ones((2, 2), bool), num_groups=1, feature_dim=4).advantages)
    np.testing.assert_allclose(fn(jnp.array([1., 0]), jnp.asarray(TOK)),
                               [[0.25, 0.25], [-0.25, -0.25]], atol=1e-6)
