"""Novelty search bonus with a per-prompt archive (credit/advantages/shaping/novelty_search.py)."""
from __future__ import annotations

import chex
import hypothesis
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import strategies as st

from credit.advantages.shaping import novelty_init_state, novelty_search_advantages
from credit.advantages.shaping._behaviour import ArchiveState, archive_init_state
from tests.advantages.outcome._harness import G, N, batches, bt, row0
from tests.advantages.shaping._behaviour_ref import (check_properties, insert_ref, novelty_ref,
                                                     random_archive, z_rows)

_jit = jax.jit(novelty_search_advantages, static_argnames=("num_groups", "group_size",
                                                           "scale", "archive_add"))
TOKENS = np.array([[1, 1], [1, 2], [3, 3]], np.int32)
ONE = dict(group_id=np.zeros(3, np.int32), response_mask=np.ones((3, 2), bool),
           prompt_id=np.zeros(3, np.int32), num_groups=1)


def ref_novelty_search(b, archive, inserted, novelty_coef=1.0, k=15, add=1, scale=True):
  nov, groups, phi = novelty_ref(b, archive, inserted, k)
  shaped = b["reward"].astype(np.float64) + novelty_coef * nov
  adv = np.zeros(len(nov))
  for rows in groups:
    for i, a in z_rows(shaped, rows, scale).items():
      adv[i] = a
  arch, ins = insert_ref(archive, inserted, phi, nov, groups, b["prompt_id"], add)
  return bt(adv, b), arch, ins, nov


def _call(b, state, jit=True, **kw):
  fn = _jit if jit else novelty_search_advantages
  return fn(reward=b["reward"], group_id=b["group_id"], response_mask=b["response_mask"],
            tokens=b["tokens"], prompt_id=b["prompt_id"], state=state, num_groups=N, **kw)


def test_worked_example():
  # φ0 = e1, φ1 = (e1 + e2)/2, φ2 = e3: distances 0.7071 (0-1), 1.4142 (0-2), 1.2247 (1-2).
  # k = 1, empty archive: n = [0.7071, 0.7071, 1.2247]; R = 0, so A = z(n).
  out = novelty_search_advantages(reward=np.zeros(3, np.float32), tokens=TOKENS,
                                  state=novelty_init_state(1), num_neighbors=1, **ONE)
  np.testing.assert_allclose(out.novelty, [0.707107, 0.707107, 1.224745], atol=1e-5)
  np.testing.assert_allclose(row0(out.advantages), [-0.57735, -0.57735, 1.154700], atol=1e-4)
  # The most novel response (row 2) entered slot 0 of the archive.
  assert int(out.state.inserted[0]) == 1
  np.testing.assert_allclose(out.state.archive[0, 0, 3], 1.0)
  # Next step, the same responses: row 2 now has a copy in the archive (distance 0).
  out = novelty_search_advantages(reward=np.zeros(3, np.float32), tokens=TOKENS,
                                  state=out.state, num_neighbors=1, **ONE)
  np.testing.assert_allclose(out.novelty, [0.707107, 0.707107, 0.0], atol=1e-5)


def test_beta_zero_is_grpo_and_archive_wraps():
  r = np.array([1., 0, 0], np.float32)
  state = archive_init_state(1, archive_size=2, descriptor_dim=8)
  for step in range(3):
    out = novelty_search_advantages(reward=r, tokens=TOKENS, state=state, novelty_coef=0.0,
                                    archive_add=2, **ONE)
    np.testing.assert_allclose(row0(out.advantages), [1.1547, -0.57735, -0.57735], atol=1e-4)
    state = out.state
    assert int(state.inserted[0]) == 2 * (step + 1)
  with pytest.raises(ValueError, match="archive_add=3 exceeds the archive size 2"):
    novelty_search_advantages(reward=r, tokens=TOKENS, state=state, archive_add=3, **ONE)


@hypothesis.settings(max_examples=20, deadline=None)
@hypothesis.given(data=st.data(), contiguous=st.booleans())
def test_matches_numpy_reference(data, contiguous):
  b = data.draw(batches(contiguous=contiguous))
  archive, inserted = random_archive(data.draw(st.integers(0, 1000)))
  kw = dict(num_neighbors=data.draw(st.sampled_from([1, 3, 15])),
            archive_add=data.draw(st.sampled_from([1, 2])), novelty_coef=0.7)
  out = _call(b, ArchiveState(archive, inserted), group_size=G if contiguous else None, **kw)
  want = ref_novelty_search(b, archive, inserted, 0.7, kw["num_neighbors"], kw["archive_add"])
  for got, w in zip((out.advantages, out.state.archive, out.state.inserted, out.novelty), want):
    np.testing.assert_allclose(np.asarray(got, np.float64), w, rtol=2e-4, atol=2e-4)


@hypothesis.settings(max_examples=10, deadline=None)
@hypothesis.given(data=st.data())
def test_properties(data):
  archive, inserted = random_archive(data.draw(st.integers(0, 1000)))
  state = ArchiveState(archive, inserted)
  check_properties(data, lambda b, jit: tuple(
      np.asarray(x) for x in jax.tree.leaves(_call(b, state, jit=jit))))


class JitTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_jit_equals_eager_on_the_worked_example(self):
    fn = self.variant(lambda r, t, s: novelty_search_advantages(
        reward=r, tokens=t, state=s, group_id=jnp.zeros(3, jnp.int32),
        response_mask=jnp.ones((3, 2), bool), prompt_id=jnp.zeros(3, jnp.int32),
        num_groups=1, num_neighbors=1))
    out = fn(jnp.zeros(3), jnp.asarray(TOKENS), novelty_init_state(1))
    np.testing.assert_allclose(np.asarray(out.advantages)[:, 0], [-0.57735, -0.57735, 1.1547],
                               atol=1e-4)
