"""Multi-turn episodes through a checkpoint's chat template, end to end (issue 42, item 1).

A tiny random Qwen2 checkpoint and a byte-level BPE tokenizer trained here on the lookup
task's text, with a Qwen2.5-style ChatML template whose tool role renders observations as a
user turn in `<tool_response>` tags. transformers' `apply_chat_template` is the reference:
the demonstration episodes of the warm-up are exactly its rendering of the conversation, and
the sampled episodes' prompts and observation blocks are its tokens, with `response_mask` on
the policy's tokens only and `obs_mask` on every template and observation token after them.
"""
import importlib
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from credit.envs import Lookup  # noqa: E402
from credit.envs.chat import ChatTurns, turn_template  # noqa: E402
from credit.envs.rollout import MultiTurnSampler, demonstration_episode, encode_episode  # noqa: E402,E501
from credit.models import hf_tokenizer  # noqa: E402
from experiments import loop  # noqa: E402
from tests.hf_checkpoints import write_bpe_tokenizer, write_qwen2_model  # noqa: E402

TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'tool' %}"
    "{{ '<|im_start|>user\n<tool_response>\n' + message['content'] + "
    "'\n</tool_response><|im_end|>\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
MODEL_VOCAB = 384
TASK_KW = {"min_hops": 1, "max_hops": 2, "num_distractors": 4, "demo_early_answer": 0.7}


def _messages(prompt, actions, observations):
  msgs = [{"role": "user", "content": prompt}]
  for k, a in enumerate(actions):
    msgs.append({"role": "assistant", "content": a})
    if k < len(observations):
      msgs.append({"role": "tool", "content": observations[k]})
  return msgs


def _train_tokenizer(d):
  task = Lookup(**TASK_KW)
  corpus = []
  for e in task.generate(np.random.default_rng(0), 300):
    prompt, actions, observations = demonstration_episode(task, e)
    corpus += [prompt, *actions, *observations]
  corpus += ["<tool_response>\n</tool_response>\nuser\nassistant\nerror: tool failed"] * 20
  return write_bpe_tokenizer(d, corpus, vocab_size=360, chat_template=TEMPLATE,
                             model_max_length=1024, max_vocab=MODEL_VOCAB)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
  d = tmp_path_factory.mktemp("qwen2_lookup")
  ids = _train_tokenizer(d)
  write_qwen2_model(d, ids, vocab_size=MODEL_VOCAB, max_positions=1024)
  return d, ids


def _config(d):
  c = importlib.import_module("experiments.configs.igpo_lookup").get_config("tiny")
  c.mesh = "data=1"
  c.init_from = str(d)
  c.max_action_tokens = 12
  c.max_observation_tokens = 40
  c.max_new_tokens = 160
  return c


def _hf_ids(hf_tok, messages, generation_prompt):
  out = hf_tok.apply_chat_template(messages, add_generation_prompt=generation_prompt,
                                   tokenize=True)
  return list(out["input_ids"] if hasattr(out, "keys") else out)


def test_chat_turns_use_the_template_tool_role(ckpt):
  d, ids = ckpt
  tok = hf_tokenizer.TaskTokenizer(hf_tokenizer.load_tokenizer(d), chat_template=True)
  turns = turn_template(tok)
  assert isinstance(turns, ChatTurns) and turns is turn_template(tok)  # built once
  assert turns.role == "tool" and turns.stop_id == ids["<|im_end|>"]
  assert turns.observation_head == "\n<|im_start|>user\n<tool_response>\n"
  assert turns.observation_tail == "\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
  block = turns.observation_ids("ann boss: bob", 64)
  assert turns.observation_text(block) == "ann boss: bob"
  cut = turns.observation_ids("ann boss: bob " * 20, 30)  # the content is cut, not the template
  assert len(cut) == 30 and cut[-len(turns._tail_ids):] == turns._tail_ids
  # The character tokenizer's plain turns: the bytes the engine always produced.
  from credit.tasks import CharTokenizer
  ch = CharTokenizer()
  plain = turn_template(ch)
  assert plain.prompt_ids("ab?") == ch.encode("ab?", add_bos=True)
  assert plain.action_ids("x(y)") == ch.encode("x(y)", add_eos=True)
  assert plain.observation_ids("ann boss: bob", 5) == ch.encode("ann b")
  # The HF wrapper takes the character tokenizer's encode signature.
  assert tok.encode("ann", add_bos=True) == tok.encode("ann")
  assert tok.encode("ann", add_eos=True) == tok.encode("ann") + [tok.eos_id]


def test_lookup_runs_end_to_end_through_the_chat_template(ckpt, tmp_path, monkeypatch):
  d, ids = ckpt
  eos = ids["<|im_end|>"]
  hf_tok = transformers.AutoTokenizer.from_pretrained(d)
  c = _config(d)
  data = loop.build_data(c)
  turns = turn_template(data.tokenizer)

  # Warm-up demonstrations: exactly transformers' rendering of the conversation.
  b = next(loop._sft_batches(data, c, np.random.default_rng(0)))
  lay = loop.turn_layout(c, data)
  limits = loop.producers.env_limits(c, data.tokenizer)
  n_demo = 0
  for e in data.train[:8]:
    prompt, actions, observations = demonstration_episode(data.task, e, limits)
    ep = encode_episode(data.tokenizer, lay, prompt, actions, observations)
    want = _hf_ids(hf_tok, _messages(prompt, actions, observations), False)
    n = int((ep["prompt_mask"] | ep["response_mask"] | ep["obs_mask"]).sum())
    # transformers ends the last assistant turn with "<|im_end|>\n"; the episode stops at the
    # policy's stop token.
    assert ep["tokens"][:n].tolist() == want[:n] and want[n:] == hf_tok.encode("\n")
    assert ep["tokens"][ep["response_mask"]].tolist() == sum(
        (hf_tok.encode(a) + [eos] for a in actions), [])
    n_demo += 1
  assert n_demo == 8 and b["response_mask"].any()

  played = []
  real_play = MultiTurnSampler._play

  def spy_play(self, *args, **kw):
    out = real_play(self, *args, **kw)
    played.append(out)
    return out

  monkeypatch.setattr(MultiTurnSampler, "_play", spy_play)
  wd = tmp_path / "run"
  loop.run(c, str(wd))
  assert played

  head, tail = turns._head_ids, turns._tail_ids
  rows = blocks = 0
  for out in played:
    assert not (out.response_mask & out.obs_mask).any()
    assert not ((out.prompt_mask | out.response_mask) & out.obs_mask).any()
    for b in range(out.tokens.shape[0]):
      t = traj = out.trajectories[b]
      row, n = out.tokens[b], int(out.lengths[b])
      valid = out.prompt_mask[b] | out.response_mask[b] | out.obs_mask[b]
      assert valid[:n].all() and not valid[n:].any()
      assert row[out.prompt_mask[b]].tolist() == _hf_ids(
          hf_tok, [{"role": "user", "content": traj.prompt}], True)
      # Walk the row: action k (turn_id == k), then observation k = head + content + tail.
      j = int(out.prompt_mask[b].sum())
      for k, action in enumerate(t.actions):
        a = np.flatnonzero(out.turn_id[b] == k)
        assert a.size and a[0] == j and (np.diff(a) == 1).all()
        assert (out.response_mask[b, a]).all()
        a_ids = row[a].tolist()
        stops = [i for i, x in enumerate(a_ids) if x in data.tokenizer.stop_ids]
        assert stops in ([], [len(a_ids) - 1])  # a turn ends at its first stop token
        assert action == hf_tok.decode(a_ids[:len(a_ids) - len(stops)], skip_special_tokens=True)
        j = a[-1] + 1
        if k < len(t.observations):
          m = j + np.flatnonzero(~out.obs_mask[b, j:])[0] if (~out.obs_mask[b, j:]).any() else n
          block = row[j:m].tolist()
          if len(block) >= len(head) + len(tail):
            assert block[:len(head)] == head and block[len(block) - len(tail):] == tail
            text = hf_tok.decode(block, skip_special_tokens=False)
            ref = hf_tok.apply_chat_template(
                [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"},
                 {"role": "tool", "content": t.observations[k]}], add_generation_prompt=True,
                tokenize=False)
            assert ref.endswith("<|im_end|>" + text)
            blocks += 1
          j = m
      rows += 1
  assert rows >= 2 * c.prompts_per_step * c.group_size and blocks >= rows

  # samples.jsonl: the template's prompt; response_ids = a played row's policy tokens.
  with open(wd / "samples.jsonl") as f:
    samples = [json.loads(line) for line in f]
  assert samples
  index = {}
  for out in played:
    for b in range(out.tokens.shape[0]):
      index.setdefault(tuple(out.tokens[b][out.response_mask[b]].tolist()), []).append((out, b))
  for s in samples:
    assert s["prompt"].startswith("<|im_start|>user\n")
    assert s["prompt"].endswith("<|im_end|>\n<|im_start|>assistant\n")
    task_prompt = s["prompt"][len("<|im_start|>user\n"):-len("<|im_end|>\n<|im_start|>assistant\n")]
    assert s["prompt"] == hf_tok.apply_chat_template(
        [{"role": "user", "content": task_prompt}], add_generation_prompt=True, tokenize=False)
    matches = index[tuple(s["response_ids"])]
    assert any(out.trajectories[b].prompt == task_prompt for out, b in matches)
    assert len(s["advantages"]) == len(s["response_ids"])
