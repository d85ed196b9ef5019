"""Tiny Hugging Face checkpoints made by the tests: a byte-level BPE tokenizer trained on a
given corpus (Qwen2's pre-tokenizer, ChatML specials, a chat template) and a random Qwen2
model over it, written into a directory as `from_pretrained` reads them. Nothing is
downloaded."""
import json

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def write_bpe_tokenizer(d, corpus, *, vocab_size: int, chat_template: str,
                        model_max_length: int, max_vocab: int) -> dict:
  """Trains the tokenizer on `corpus`, writes tokenizer.json and tokenizer_config.json into
  `d`; returns {special: id}."""
  import tokenizers
  from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers
  tok = tokenizers.Tokenizer(models.BPE())
  # Qwen2's pre-tokenizer (one digit per pre-token), which transformers' Qwen2Tokenizer
  # also installs when it loads a qwen2 directory.
  tok.normalizer = normalizers.NFC()
  tok.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(tokenizers.Regex(QWEN2_SPLIT), behavior="isolated"),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  tok.decoder = decoders.ByteLevel()
  tok.train_from_iterator(corpus, trainers.BpeTrainer(
      vocab_size=vocab_size, special_tokens=SPECIALS,
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  assert tok.get_vocab_size() <= max_vocab
  tok.save(str(d / "tokenizer.json"))
  (d / "tokenizer_config.json").write_text(json.dumps({
      "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
      "pad_token": "<|endoftext|>", "bos_token": None, "chat_template": chat_template,
      "model_max_length": model_max_length}))
  return {s: tok.token_to_id(s) for s in SPECIALS}


def write_qwen2_model(d, ids: dict, *, vocab_size: int, max_positions: int) -> None:
  """A one-layer random Qwen2 (every parameter random: biases and norms too) and its
  generation_config (both stop ids) into `d`."""
  import torch
  import transformers
  torch.manual_seed(0)
  cfg = transformers.Qwen2Config(
      vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
      eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
  model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
  with torch.no_grad():
    for p in model.parameters():
      torch.nn.init.normal_(p, mean=0.0, std=0.3)
  model.save_pretrained(d)
  (d / "generation_config.json").write_text(json.dumps(
      {"eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
       "pad_token_id": ids["<|endoftext|>"]}))
