"""The runner on a Hugging Face checkpoint: its tokenizer end to end (issue 9, item 1).

A tiny random Qwen2 checkpoint with a byte-level BPE tokenizer trained here on arithmetic
text (ChatML template, `<|im_end|>` eos, generation_config stop ids); transformers is the
reference for the prompt ids, the decoded responses and the exported directory.
"""
import importlib
import json
import os
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from experiments import loop, producers  # noqa: E402
from tests.hf_checkpoints import write_bpe_tokenizer, write_qwen2_model  # noqa: E402

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
          "message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
MODEL_VOCAB = 320
SYSTEM = "Answer with the number."


def _train_tokenizer(d):
  rng = np.random.default_rng(0)
  corpus = [f"{a}+{b}={a + b}" for a, b in rng.integers(0, 100, (2000, 2))]
  corpus += [f"Compute {a}-{b}. {SYSTEM}" for a, b in rng.integers(0, 100, (200, 2))]
  return write_bpe_tokenizer(d, corpus, vocab_size=300, chat_template=CHATML,
                             model_max_length=256, max_vocab=MODEL_VOCAB)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
  d = tmp_path_factory.mktemp("qwen2_bpe")
  ids = _train_tokenizer(d)
  write_qwen2_model(d, ids, vocab_size=MODEL_VOCAB, max_positions=256)
  return d, ids


def tiny(**overrides):
  c = importlib.import_module("experiments.configs.grpo_arithmetic").get_config("tiny")
  c.mesh = "data=1"
  c.max_new_tokens = 6
  for k, v in overrides.items():
    c[k] = v
  return c


def _hf_prompt(hf_tok, prompt, system=SYSTEM):
  messages = [{"role": "system", "content": system}] if system else []
  out = hf_tok.apply_chat_template(messages + [{"role": "user", "content": f"Compute {prompt}"}],
                                   add_generation_prompt=True, tokenize=True)
  return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)


def test_runner_uses_the_checkpoint_tokenizer_end_to_end(ckpt, tmp_path, monkeypatch):
  d, ids = ckpt
  hf_tok = transformers.AutoTokenizer.from_pretrained(d)
  c = tiny(init_from=str(d), system_prompt=SYSTEM, prompt_template="Compute {prompt}")
  c.task_kwargs.demo_carry_error = 0.0  # demonstrations = gold answers, compared below
  eos = ids["<|im_end|>"]

  # SFT demonstrations: the same template, the response, then eos.
  data = loop.build_data(c)
  assert data.tokenizer.stop_ids == (eos, ids["<|endoftext|>"])
  assert data.tokenizer.pad_id == ids["<|endoftext|>"]
  b = next(loop._sft_batches(data, c, np.random.default_rng(0)))
  demos = {tuple(_hf_prompt(hf_tok, e["prompt"])): data.task.demonstration(e) for e in data.train}
  for row, pm, rm in zip(b["tokens"], b["attn_mask"], b["response_mask"]):
    prompt, resp = tuple(row[pm & ~rm].tolist()), row[rm].tolist()
    assert prompt in demos
    assert resp == hf_tok.encode(demos[prompt], add_special_tokens=False) + [eos]

  seen = {"contexts": [], "decoded": []}
  context, verify = loop._context, producers.verify_rows

  def spy_context(run, rs):
    ctx = context(run, rs)
    seen["contexts"].append(ctx)
    return ctx

  def spy_verify(s, examples, tokens, response_mask, repeat):
    texts, reward = verify(s, examples, tokens, response_mask, repeat)
    seen["decoded"].append((np.asarray(tokens), np.asarray(response_mask), texts))
    return texts, reward

  def spy_setup(config, workdir):
    runner, rs = real_setup(config, workdir)
    seen["sampler"] = runner.setup.sampler
    return runner, rs

  real_setup = loop.setup
  monkeypatch.setattr(loop, "setup", spy_setup)
  monkeypatch.setattr(loop, "_context", spy_context)
  monkeypatch.setattr(producers.signals, "verify_rows", spy_verify)  # the verifier stage's
  wd = tmp_path / "run"
  loop.run(c, str(wd))

  assert seen["sampler"].stop_tokens == (eos, ids["<|endoftext|>"])
  assert seen["sampler"].pad_id == ids["<|endoftext|>"]
  assert len(seen["contexts"]) == 2 and len(seen["decoded"]) == 2
  for ctx in seen["contexts"]:  # the prompt ids the rollout is fed
    for prompt, toks, mask in zip(ctx.examples["prompt"], ctx.prompt_tokens, ctx.prompt_mask):
      assert toks[mask].tolist() == _hf_prompt(hf_tok, prompt)
  n_checked = 0
  for tokens, response_mask, texts in seen["decoded"]:
    for row, m, text in zip(tokens, response_mask, texts):
      resp = row[m].tolist()
      assert all(t < MODEL_VOCAB for t in resp)
      if eos in resp:
        resp = resp[:resp.index(eos)]
      assert text == hf_tok.decode(resp, skip_special_tokens=True)
      n_checked += 1
  assert n_checked == 2 * c.prompts_per_step * c.group_size

  # samples.jsonl shows the prompt as rendered by the chat template (specials included).
  with open(wd / "samples.jsonl") as f:
    samples = [json.loads(line) for line in f]
  assert samples
  for s in samples:
    task_prompt = s["prompt"].split("Compute ", 1)[1].split("<|im_end|>", 1)[0]
    assert s["prompt"] == hf_tok.decode(_hf_prompt(hf_tok, task_prompt),
                                        skip_special_tokens=False)
    assert s["prompt"].startswith("<|im_start|>system") and s["prompt"].endswith("assistant\n")
    assert s["response"] == hf_tok.decode(
        [t for t in s["response_ids"] if t != eos], skip_special_tokens=True)

  out = wd / "hf_policy"
  for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
    assert (out / f).exists(), f
  tok2 = transformers.AutoTokenizer.from_pretrained(out)
  model2 = transformers.AutoModelForCausalLM.from_pretrained(out)
  prompt_ids = _hf_prompt(tok2, "12+3=")
  assert prompt_ids == _hf_prompt(hf_tok, "12+3=")
  gen = model2.generate(torch.tensor([prompt_ids]), max_new_tokens=3, min_new_tokens=3,
                        do_sample=False)
  assert gen.shape == (1, len(prompt_ids) + 3)


def test_plain_prompts_without_the_chat_template(ckpt):
  d, _ = ckpt
  hf_tok = transformers.AutoTokenizer.from_pretrained(d)
  data = loop.build_data(tiny(init_from=str(d), chat_template="false"))
  prompt = data.train[0]["prompt"]
  toks, mask = loop.tasks_lib.encode_prompts(data.tokenizer, [prompt], data.max_prompt_len)
  assert toks[0][mask[0]].tolist() == hf_tok(prompt)["input_ids"]


def _variant(ckpt, tmp_path, *, config=None, drop=()):
  """A copy of the checkpoint (weights linked) with config.json edits or files removed."""
  d, _ = ckpt
  v = tmp_path / "variant"
  v.mkdir()
  for f in os.listdir(d):
    if f in drop:
      continue
    if f.endswith(".safetensors"):
      (v / f).symlink_to(d / f)
    else:
      shutil.copyfile(d / f, v / f)
  if config:
    hf = json.loads((v / "config.json").read_text())
    (v / "config.json").write_text(json.dumps(dict(hf, **config)))
  return str(v)


@pytest.mark.parametrize("edit,change,match", [
    ({"config": {"vocab_size": 200}}, {}, "the model's embedding only 200"),
    ({"config": {"max_position_embeddings": 16}}, {}, "exceeds the model's context"),
    ({"drop": ("tokenizer.json",)}, {}, "no tokenizer.json"),
    ({}, {"chat_template": "maybe"}, "auto \\| true \\| false"),
    ({}, {"chat_template": "false", "system_prompt": "Be brief."}, "system prompt"),
    ({}, {"prompt_template": "Compute"}, "no \\{prompt\\}"),
])
def test_bad_checkpoint_setup_is_refused_before_any_output(ckpt, tmp_path, edit, change, match):
  wd = tmp_path / "w"
  with pytest.raises(loop.SetupError, match=match):
    loop.run(tiny(init_from=_variant(ckpt, tmp_path, **edit), **change), str(wd))
  assert not wd.exists()
