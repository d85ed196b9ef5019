"""SERENE's exploration / exploitation alternation (credit/advantages/shaping/serene.py)."""
from __future__ import annotations

import chex
import hypothesis
import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st

from credit.advantages.shaping import SereneState, serene_advantages, serene_init_state
from tests.advantages.outcome._harness import G, N, batches, bt, row0
from tests.advantages.shaping._behaviour_ref import (P, check_properties, insert_ref,
                                                     novelty_ref, random_archive, z_rows)

_jit = jax.jit(serene_advantages, static_argnames=("num_groups", "group_size", "scale",
                                                   "archive_add"))
TOKENS = np.array([[1, 1], [1, 2], [3, 3]], np.int32)
ONE = dict(group_id=np.zeros(3, np.int32), response_mask=np.ones((3, 2), bool),
           prompt_id=np.zeros(3, np.int32), num_groups=1, num_neighbors=1, tokens=TOKENS)


def ref_serene(b, s, tau=0.0):
  nov, groups, phi = novelty_ref(b, s.archive, s.inserted)
  r = b["reward"].astype(np.float64)
  found, visits = s.found.copy(), s.visits.copy()
  adv, exploit = np.zeros(len(r)), np.zeros(len(r))
  for rows in groups:
    p = int(b["prompt_id"][rows[0]])
    ex = 0 <= p < P and s.found[p] > 0 and s.visits[p] % 2 == 1
    for i, a in z_rows(r if ex else nov, rows).items():
      adv[i], exploit[i] = a, float(ex)
    if 0 <= p < P:
      found[p] = max(found[p], int(any(r[i] > tau for i in rows)))
      visits[p] = s.visits[p] + 1
  arch, ins = insert_ref(s.archive, s.inserted, phi, nov, groups, b["prompt_id"])
  return bt(adv, b), arch, ins, found, visits, nov, exploit


def _state(seed):
  rng = np.random.default_rng(seed)
  archive, inserted = random_archive(seed)
  return SereneState(archive, inserted, rng.integers(0, 2, P).astype(np.int32),
                     rng.integers(0, 4, P).astype(np.int32))


def _call(b, state, jit=True, **kw):
  fn = _jit if jit else serene_advantages
  return fn(reward=b["reward"], group_id=b["group_id"], response_mask=b["response_mask"],
            tokens=b["tokens"], prompt_id=b["prompt_id"], state=state, num_groups=N, **kw)


def test_worked_example_alternates_once_a_reward_is_found():
  zero, one = np.zeros(3, np.float32), np.array([1., 0, 0], np.float32)
  explore = [-0.57735, -0.57735, 1.1547]          # z of the novelty [.7071, .7071, 1.2247]
  # Visit 0: nothing found yet -> explore; no reward, so nothing is found.
  out = serene_advantages(reward=zero, state=serene_init_state(1), **ONE)
  np.testing.assert_allclose(row0(out.advantages), explore, atol=1e-4)
  assert int(out.state.found[0]) == 0 and int(out.state.visits[0]) == 1
  # Visit 1 (odd) but nothing found before it -> still explores; row 0 earns a reward.
  out = serene_advantages(reward=one, state=out.state, **ONE)
  assert float(out.exploit[0]) == 0.0 and int(out.state.found[0]) == 1
  # Visit 2 (even) -> explores; visit 3 (odd, found) -> exploits: z of the reward.
  out = serene_advantages(reward=one, state=out.state, **ONE)
  assert float(out.exploit[0]) == 0.0
  out = serene_advantages(reward=one, state=out.state, **ONE)
  assert float(out.exploit[0]) == 1.0
  np.testing.assert_allclose(row0(out.advantages), [1.1547, -0.57735, -0.57735], atol=1e-4)


@hypothesis.settings(max_examples=20, deadline=None)
@hypothesis.given(data=st.data(), contiguous=st.booleans())
def test_matches_numpy_reference(data, contiguous):
  b = data.draw(batches(contiguous=contiguous))
  s = _state(data.draw(st.integers(0, 1000)))
  out = _call(b, s, group_size=G if contiguous else None)
  want = ref_serene(b, s)
  got = (out.advantages, out.state.archive, out.state.inserted, out.state.found,
         out.state.visits, out.novelty, out.exploit)
  for g_, w in zip(got, want):
    np.testing.assert_allclose(np.asarray(g_, np.float64), w, rtol=2e-4, atol=2e-4)


@hypothesis.settings(max_examples=10, deadline=None)
@hypothesis.given(data=st.data())
def test_properties(data):
  s = _state(data.draw(st.integers(0, 1000)))
  check_properties(data, lambda b, jit: tuple(
      np.asarray(x) for x in jax.tree.leaves(_call(b, s, jit=jit))))


class JitTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_jit_equals_eager(self):
    s = SereneState(*serene_init_state(1)[:2], found=jnp.ones(1, jnp.int32),
                    visits=jnp.ones(1, jnp.int32))
    fn = self.variant(lambda r, st_: serene_advantages(
        reward=r, state=st_, group_id=jnp.zeros(3, jnp.int32),
        response_mask=jnp.ones((3, 2), bool), prompt_id=jnp.zeros(3, jnp.int32),
        num_groups=1, num_neighbors=1, tokens=jnp.asarray(TOKENS)))
    out = fn(jnp.array([1., 0, 0]), s)
    np.testing.assert_allclose(np.asarray(out.advantages)[:, 0], [1.1547, -0.57735, -0.57735],
                               atol=1e-4)
