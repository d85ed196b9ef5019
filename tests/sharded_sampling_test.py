"""Sharded generation: on 8 host devices (tests/conftest.py) every sampling path draws, token for
token, what it draws on one device, with its rows on the mesh's batch axes.

The mesh has all three axes (data, FSDP, tensor), so the batch is split four ways and the
parameters are placed by the model's logical rules (`credit.models.shard_model`); the samplers
take the mesh from the parameters. Row counts the batch axes do not divide are padded by the
samplers (6 prompts on 4 batch shards)."""
import functools

import jax
import numpy as np
from flax import nnx

from credit import parallel, trees
from credit.envs.rollout import MultiTurnSampler
from credit.models import Decoder, shard_model, tiny_config
from credit.sampling import Sampler
from credit.tasks import CharTokenizer
from tests.multiturn_test import LAYOUT, ScriptEnv
from tests.tiny_decoder import scaled_tiny_decoder

TOK = CharTokenizer()
V = TOK.vocab_size
MAX_NEW = 8


@functools.lru_cache(maxsize=None)
def _mesh():
  return parallel.make_mesh("data=2,fsdp=2,tensor=2")


@functools.lru_cache(maxsize=None)
def _models(name="policy"):
  """(the model on one device, a copy placed on the 8-device mesh)."""
  if name == "policy":
    one = scaled_tiny_decoder(V)
  else:  # a teacher: another architecture and seed than the policy
    one = Decoder(tiny_config("llama", vocab_size=V), rngs=nnx.Rngs(7))
  placed = nnx.clone(one)
  shard_model(placed, _mesh())
  return one, placed


def _prompts(n=6, width=7, seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(3, V, (n, width)).astype(np.int32)
  mask = np.ones((n, width), bool)
  mask[1, :4] = False  # rows of different lengths
  mask[n - 2, :2] = False
  return tokens, mask


def _assert_rows_sharded(x):
  assert x.sharding.is_equivalent_to(parallel.batch_sharding(_mesh(), x.ndim), x.ndim), (
      x.sharding)
  assert x.sharding.spec[0] == ("data", "fsdp")


def _sample(name, **kw):
  one, placed = _models(name)
  out = [Sampler(m, pad_id=TOK.pad_id, stop_tokens=(TOK.eos_id,))(
      nnx.state(m), key=jax.random.key(3), max_new_tokens=MAX_NEW, temperature=1.0, **kw)
      for m in (one, placed)]
  return out


def _assert_same(a, b, fields=("tokens", "response_mask", "logprob_sampler", "logprob_raw")):
  for f in fields:
    x, y = np.asarray(getattr(a, f)), np.asarray(getattr(b, f))
    if x.dtype.kind == "f":
      np.testing.assert_allclose(x, y, atol=2e-5, err_msg=f)
    else:
      np.testing.assert_array_equal(x, y, err_msg=f)


def test_single_turn_one_device_equals_eight():
  tokens, mask = _prompts()
  a, b = _sample("policy", prompt_tokens=tokens, prompt_mask=mask, num_samples=2)
  _assert_same(a, b)
  assert a.tokens.shape == (12, 7 + MAX_NEW)
  for x in (b.tokens, b.response_mask, b.logprob_sampler):
    _assert_rows_sharded(x)


def test_teacher_sampling_one_device_equals_eight():
  # A second model (the teacher / CSO's expert) samples on the mesh its parameters live on.
  tokens, mask = _prompts(seed=1)
  a, b = _sample("teacher", prompt_tokens=tokens, prompt_mask=mask, num_samples=2)
  _assert_same(a, b)
  _assert_rows_sharded(b.tokens)


def test_tree_sampling_one_device_equals_eight():
  # Two rounds of branches grown on one device, each branch prefilling its prefix, and on the
  # mesh as the runner grows them: every branch continues its parent's kept cache (roots' in
  # round 1, round 1's in round 2). 6 prompts: 6 prefixes in round 2, padded to 8 on the 4
  # batch shards (their parent rows too).
  tokens, mask = _prompts(n=6, seed=2)
  grown, sharded = [], []
  for m, reuse in zip(_models("policy"), (False, True)):
    sampler = Sampler(m, pad_id=TOK.pad_id, stop_tokens=(TOK.eos_id,))
    kw = dict(max_new_tokens=MAX_NEW, temperature=1.0)
    out = sampler(nnx.state(m), prompt_tokens=tokens, prompt_mask=mask, key=jax.random.key(4),
                  num_samples=2, keep_cache=reuse, **kw)
    out, kept = out if reuse else (out, None)
    h = parallel.to_host(out._asdict())
    B = h["tokens"].shape[0]
    roots = trees.TreeRollout(
        tokens=h["tokens"], response_mask=h["response_mask"], path_mask=h["response_mask"],
        prompt_mask=h["prompt_mask"], logprob_sampler=h["logprob_sampler"],
        logprob_raw=h["logprob_raw"], group_id=h["group_id"],
        parent_id=np.full(B, -1, np.int32), prefix_len=np.zeros(B, np.int32),
        depth=np.zeros(B, np.int32))

    def sample_fn(prefix, pmask, budget, key, parent=None, sampler=sampler, state=nnx.state(m),
                  kw=kw):
      more = {} if parent is None else dict(parent=parent[0], parent_rows=parent[1],
                                            keep_cache=True)
      res = sampler(state, prompt_tokens=prefix, prompt_mask=pmask, key=key, num_samples=2,
                    max_new_tokens_per_row=budget, **kw, **more)
      sharded.append((res[0] if parent is not None else res).tokens)
      return res

    tree, _ = trees.grow_tree(roots, sample_fn, num_groups=6, branches=2, points=2, depth=2,
                              criterion="surprisal", max_new_tokens=MAX_NEW,
                              key=jax.random.key(5), cache=kept)
    grown.append(tree)
  a, b = grown
  assert (a.depth == 2).any()  # branches of branches were added
  _assert_same(a, b, fields=("tokens", "response_mask", "path_mask", "parent_id",
                             "prefix_len", "logprob_sampler"))
  _assert_rows_sharded(sharded[-2])  # round 1 on the mesh: 2 points x 2 branches x 6 groups


def test_multi_turn_one_device_equals_eight():
  # 2 prompts x 3 episodes: one prefill per prompt (`shared_run`), padded to 4 on the mesh.
  outs, states = [], []
  for m in _models("policy"):
    ms = MultiTurnSampler(m, tokenizer=TOK, layout=LAYOUT)
    run_turn = ms._run_turn

    def spy(*args, run_turn=run_turn, **kw):
      st = run_turn(*args, **kw)
      states.append(st)
      return st

    ms._run_turn = spy
    envs = [ScriptEnv(i // 3) for i in range(6)]
    outs.append(ms(nnx.state(m), envs, key=jax.random.key(6), group_id=np.arange(6) // 3,
                   temperature=1.0))
  a, b = outs
  _assert_same(a, b, fields=("tokens", "response_mask", "obs_mask", "turn_id",
                             "logprob_sampler", "reward", "step_mask"))
  _assert_rows_sharded(states[-1].tokens_BL)
  _assert_rows_sharded(states[-1].cache.valid)
