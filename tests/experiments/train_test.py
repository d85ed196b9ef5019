"""Pure step functions of the runner (experiments/train.py): extra loss terms."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import credit
from credit.losses import observation_ce_loss
from credit.models import Decoder, ModelConfig
from credit.scoring import score_tokens
from experiments import train


def test_observation_cross_entropy_adds_echo_term_to_the_rl_loss():
  """With obs_ce_coef = λ the RL loss is the policy loss + λ·observation_ce_loss of the same
  model pass over `obs_mask` (ECHO), and its gradient reaches the parameters; λ = 0 leaves
  the loss as it was."""
  cfg = ModelConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_layers=1,
                    num_heads=2, num_kv_heads=1, head_dim=8, pad_token_id=0)
  graphdef, params, rest = train.split_model(Decoder(cfg, rngs=nnx.Rngs(0)))
  rng = np.random.default_rng(0)
  B, T = 4, 10
  tokens = rng.integers(1, 16, (B, T)).astype(np.int32)
  attn = np.ones((B, T), bool)
  resp = np.zeros((B, T), bool)
  resp[:, 3:6] = True
  obs = np.zeros((B, T), bool)
  obs[:, 6:9] = True          # an observation after the first action turn
  obs[3] = False              # a row without observations
  mb = {"tokens": tokens, "attn_mask": attn, "response_mask": resp, "obs_mask": obs,
        "advantages": rng.normal(size=(B, T)).astype(np.float32) * resp,
        "logprob_old": np.zeros((B, T), np.float32)}
  spec = credit.get_policy_loss("ppo_clip")
  fields = ("advantages", "logprob", "logprob_old", "response_mask")

  def loss(coef):
    fn = train.make_rl_loss(graphdef, rest, loss_spec=spec, loss_fields=fields, loss_kwargs={},
                            kl_coef=0.0, kl_kind="k3", entropy_coef=0.0, chunk_size=None,
                            obs_ce_coef=coef)
    return jax.jit(fn)(params, mb)

  (base, m0), (with_ce, m1) = loss(0.0), loss(0.5)
  logprob, _ = jax.jit(lambda p: score_tokens(train.merge_model(graphdef, p, rest), tokens, attn,
                                              chunk_size=None, return_entropy=False))(params)
  want = observation_ce_loss(logprob=logprob, obs_mask=obs, coef=0.5)
  np.testing.assert_allclose(with_ce, base + want.loss, rtol=1e-5)
  assert "obs_tokens" not in m0 and float(m1["obs_tokens"]) == obs.sum()
  fn = train.make_rl_loss(graphdef, rest, loss_spec=spec, loss_fields=fields, loss_kwargs={},
                          kl_coef=0.0, kl_kind="k3", entropy_coef=0.0, chunk_size=None,
                          obs_ce_coef=1.0)
  grads = jax.jit(jax.grad(lambda p: fn(p, dict(mb, advantages=np.zeros((B, T), np.float32)))[0]))(
      params)
  assert float(jnp.sqrt(sum(jnp.sum(g ** 2) for g in jax.tree.leaves(grads)))) > 0


# --------------------------------------------------------------------------
# Group-aligned minibatches (`epoch_permutation`, `make_minibatch_sgd(group_size=...)`).
# --------------------------------------------------------------------------

_NB, _G, _M = 24, 4, 3  # 6 groups of 4 rows, 3 minibatches of 2 groups


def _whole_groups(idx, group_size):
  """Whether every minibatch (row of `idx`) holds each of its groups' rows (row // G) whole."""
  return all((np.unique(row // group_size, return_counts=True)[1] == group_size).all()
             for row in idx)


def test_group_aligned_minibatches_hold_whole_groups_and_every_row_once():
  seen = set()
  for seed in range(5):
    key = jax.random.fold_in(jax.random.key(7), seed)
    idx = np.asarray(train.epoch_permutation(key, _NB, num_minibatches=_M, group_size=_G)
                     ).reshape(_M, -1)      # minibatch m: the m-th slice
    np.testing.assert_array_equal(np.sort(idx.ravel()), np.arange(_NB))  # each row once
    assert _whole_groups(idx, _G)
    blocks = idx.reshape(_M, -1, _G)       # a group's rows stay together, in order
    np.testing.assert_array_equal(blocks - blocks[..., :1], np.broadcast_to(np.arange(_G),
                                                                           blocks.shape))
    seen.add(tuple(blocks[..., 0].ravel() // _G))
  assert len(seen) > 1                     # the group order is shuffled, by the key


def test_row_shuffle_is_the_default_and_unchanged():
  # Without group_size the permutation is the one the sgd always used, bit for bit, and it
  # splits groups; the policy losses other than a2tgpo and slate_step keep it.
  key = jax.random.key(3)
  idx = np.asarray(train.epoch_permutation(key, _NB, num_minibatches=_M)).reshape(_M, -1)
  np.testing.assert_array_equal(idx.ravel(), np.asarray(jax.random.permutation(key, _NB)))
  assert not _whole_groups(idx, _G)
  assert [n for n in credit.list_policy_losses()
          if credit.get_policy_loss(n).whole_groups] == ["a2tgpo", "slate_step"]


def test_minibatches_of_whole_groups_refused_when_groups_do_not_split():
  key = jax.random.key(0)
  with pytest.raises(ValueError, match=r"num_minibatches=4 must divide the number of groups"):
    train.epoch_permutation(key, _NB, num_minibatches=4, group_size=_G)  # 6 groups
  with pytest.raises(ValueError, match="not a whole number"):
    train.epoch_permutation(key, _NB, num_minibatches=2, group_size=5)
  with pytest.raises(ValueError, match="positive int"):
    train.make_minibatch_sgd(lambda p, b: (0.0, {}), optax.sgd(0.1), epochs=1,
                             num_minibatches=2, group_size=0)


def test_sgd_uses_group_aligned_minibatches():
  # The loss sees each minibatch: metric `whole` is 1 when every group id in it has all of
  # its G rows there. Shuffling groups gives 1 on every step; shuffling rows does not.
  def loss_fn(w, mb):
    same = (mb["group_id"][:, None] == mb["group_id"][None, :]).sum(1)
    return jnp.sum(w ** 2) * jnp.mean(mb["x"]), {"whole": jnp.all(same == _G).astype(
        jnp.float32)}

  batch = {"group_id": np.arange(_NB, dtype=np.int32) // _G,
           "x": np.linspace(0.5, 1.5, _NB, dtype=np.float32)}
  tx = optax.sgd(0.1)
  w = jnp.ones(2)
  for gs, want in ((_G, 1.0), (None, None)):
    sgd = jax.jit(train.make_minibatch_sgd(loss_fn, tx, epochs=2, num_minibatches=_M,
                                           group_size=gs))
    _, _, m = sgd(w, tx.init(w), batch, jax.random.key(1))
    assert (float(m["whole"]) == want) if want else float(m["whole"]) < 1.0


def test_a2tgpo_on_group_aligned_minibatches_equals_its_full_batch_terms():
  # The per-token a2tgpo loss on each group-aligned minibatch is the full batch's for those
  # rows (ĩ per group); on the row-shuffled minibatches of the same key it is not.
  from tests.contract_fields import B, G, make_fields
  b = make_fields(2)
  args = {k: b[k] for k in ("logprob_old", "advantages", "response_mask", "gold_logprob_turns",
                            "gold_logprob_prompt", "step_mask", "turn_id", "group_id")}
  args["logprob"] = args["logprob_old"] + np.float32(0.15)
  tok = jax.jit(jax.vmap(lambda a: credit.get_policy_loss("a2tgpo").token_fn(**a).loss))
  full = np.asarray(tok({k: v[None] for k, v in args.items()}))[0]
  key = jax.random.key(5)
  for gs, equal in ((G, True), (None, False)):
    idx = np.asarray(train.epoch_permutation(key, B, num_minibatches=2, group_size=gs)
                     ).reshape(2, -1)
    got = np.asarray(tok({k: v[idx] for k, v in args.items()}))
    assert np.allclose(got, full[idx], rtol=1e-6, atol=1e-7) == equal


def test_rl_update_passes_group_size_only_to_whole_group_losses(monkeypatch):
  seen = []
  monkeypatch.setattr(train, "make_row_sets_sgd",
                      lambda *a, **kw: seen.append(dict(kw["group_sizes"])) or (lambda *x: None))

  def make(name, num_minibatches, group_size=None):
    spec = credit.get_policy_loss(name)
    terms = train.policy_terms(loss_spec=spec, loss_fields=tuple(sorted(spec.needs)),
                               loss_kwargs={}, kl_coef=0.0, kl_kind="k3", entropy_coef=0.0)
    return train.make_update(None, None, optax.sgd(0.1),
                             row_sets=[train.RowSet(train.MAIN, group_size=group_size)],
                             terms=terms, ppo_epochs=1, num_minibatches=num_minibatches,
                             chunk_size=None)

  make("a2tgpo", 2, group_size=4)
  make("ppo_clip", 2, group_size=4)
  make("a2tgpo", 1)                        # one minibatch is the whole batch
  assert seen == [{"main": 4}, {"main": None}, {"main": None}]
  with pytest.raises(ValueError, match="'a2tgpo' needs whole prompt groups"):
    make("a2tgpo", 2)


def test_the_runner_refuses_minibatches_that_split_groups_for_a2tgpo(tmp_path):
  """The runner passes group_size to the update for a whole-groups loss (a2tgpo), and refuses
  before any file a minibatch count that cannot hold whole prompt groups."""
  import importlib
  from experiments import loop, producers
  c = importlib.import_module("experiments.configs.igpo_lookup").get_config("tiny")
  c.estimator, c.policy_loss, c.mesh = "a2tgpo", "a2tgpo", "data=1"
  c.num_minibatches = 3  # 4 prompts per step
  wd = tmp_path / "run"
  with pytest.raises(producers.SetupError, match="must divide prompts_per_step=4"):
    loop.run(c, str(wd))
  assert not wd.exists()
