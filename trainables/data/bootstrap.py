"""The embedded default policy: a tiny Qwen2 and its BPE tokenizer, built from the project itself.

Nothing is downloaded. The tokenizer is trained on the built-in task's text, the model is
warm-started by a short supervised pass on teacher solutions of the easiest level only, so the base
is partly able and RL has room to improve it. The result is a normal Hugging Face model folder,
cached under ``cache_dir/models/<key>`` where the key hashes the configuration and the seed.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from trainables.data.arithmetic import LEVELS, SYSTEM_PROMPT, TEACHERS, make_splits, teacher_dataset, teacher_solution
from trainables.data.cache import build_once
from trainables.data.prompts import prompt_ids
from trainables.names import TINY_MAX_POSITIONS
from trainables.progress import progress

BOOTSTRAP_VERSION = 6  # bump when the recipe below changes, so stale caches are not reused
EOS = "<|endoftext|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
# Warm-start sequences are cut after this many response tokens: an over-long solution is learned as
# rambling past any sensible max_new_tokens, and the batch stays short enough to train fast.
SFT_MAX_RESPONSE_TOKENS = 96
_BOXED_ANSWER = re.compile(r"\\boxed\{([^{}]*)\}")


def cache_key(cfg) -> str:  # cfg: the spec's model.tiny section (trainables.config.TinyModelConfig)
    blob = json.dumps({"cfg": cfg.model_dump(), "v": BOOTSTRAP_VERSION}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def ensure_tiny_model(cfg, cache_dir: str | Path) -> Path:
    """Return the folder of the tiny model for cfg, building it once (safe across processes)."""
    return build_once(
        Path(cache_dir) / "models" / f"tiny-qwen2-{cache_key(cfg)}", lambda staging: build_tiny_model(cfg, staging)
    )


def _corpus(cfg, seed: int) -> list[str]:
    """Tokenizer corpus: prompts and teacher solutions of every level, so any level tokenises well."""
    problems, _ = make_splits(seed + 1, sorted(LEVELS), train_size=400, val_size=1)
    rows = teacher_dataset(problems, seed, wrong_rate=0.0, overlong_rate=0.0)
    return [SYSTEM_PROMPT] + [r["question"] for r in rows] + [r["solution"] for r in rows]


def build_tokenizer(cfg, seed: int) -> PreTrainedTokenizerFast:
    # Byte-level BPE with single digits, as Qwen and Llama do: arithmetic needs digit tokens.
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.vocab_size,
        special_tokens=[EOS, *ROLE_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(cfg, seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(cfg, tokenizer: PreTrainedTokenizerFast, seed: int) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=TINY_MAX_POSITIONS,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    return Qwen2ForCausalLM(config)


def unbox(solution: str) -> str:
    """The same solution with its final answer written plainly: "\\boxed{42}" -> "42"."""
    return _BOXED_ANSWER.sub(r"\1", solution)


class SFTStream:
    """Warm-start batches: teacher solutions drawn afresh at every step, imperfect at the configured
    rates. Fresh draws make a habit (rambling on, a wrong last step) a rate the base learns, not a
    property of particular problems it memorises; RL then has a real habit to unlearn."""

    def __init__(self, cfg, tokenizer, seed: int):
        self.cfg, self.tokenizer = cfg, tokenizer
        self.problems, _ = make_splits(seed + 2, cfg.sft_levels, train_size=cfg.sft_examples, val_size=1)
        self.prompts = [prompt_ids(tokenizer, p) for p in self.problems]  # the builtin template
        self.rng = random.Random(seed)

    def example(self) -> tuple[list[int], int]:
        """(token ids, prompt length) of one teacher solution to one warm-start problem."""
        i = self.rng.randrange(len(self.problems))
        text, _ = teacher_solution(
            self.rng.choice(list(TEACHERS)),
            self.problems[i],
            self.rng,
            wrong_rate=self.cfg.sft_wrong_rate,
            overlong_rate=self.cfg.sft_overlong_rate,
        )
        if self.rng.random() < self.cfg.sft_unboxed_rate:
            text = unbox(text)
        response = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
        return self.prompts[i] + response[:SFT_MAX_RESPONSE_TOKENS], len(self.prompts[i])

    def batch(self) -> list[tuple[list[int], int]]:
        return [self.example() for _ in range(self.cfg.sft_batch_size)]


def _collate(batch: list[tuple[list[int], int]], pad_id: int) -> tuple[torch.Tensor, ...]:
    width = max(len(ids) for ids, _ in batch)
    input_ids = torch.full((len(batch), width), pad_id)  # [B, L]
    labels = torch.full((len(batch), width), -100)  # loss only on response tokens
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    for i, (ids, prompt_len) in enumerate(batch):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        labels[i, prompt_len : len(ids)] = torch.tensor(ids[prompt_len:])
        attention[i, : len(ids)] = 1
    return input_ids, labels, attention


def sequence_mean_nll(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean over sequences of each sequence's mean token NLL: logits [B, L, V], labels long[B, L].

    Every solution counts once, however long: a token mean would let the over-long ones dominate.
    """
    nll = torch.nn.functional.cross_entropy(
        logits[:, :-1].transpose(1, 2), labels[:, 1:], ignore_index=-100, reduction="none"
    )  # [B, L-1]: position j predicts token j + 1
    counted = (labels[:, 1:] != -100).float()  # [B, L-1]
    return ((nll * counted).sum(1) / counted.sum(1).clamp(min=1)).mean()


def build_tiny_model(cfg, out_dir: Path) -> None:
    """Tokenizer, model, short supervised warm start (cosine lr), saved as a HF folder."""
    seed = cfg.seed
    tokenizer = build_tokenizer(cfg, seed)
    model = build_model(cfg, tokenizer, seed)
    stream = SFTStream(cfg, tokenizer, seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.sft_lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 10) * 0.5 * (1 + math.cos(math.pi * s / cfg.sft_steps))
    )
    model.train()
    bar = progress(range(cfg.sft_steps), desc="warm-starting the tiny policy", unit="step")
    for _ in bar:
        input_ids, labels, attention = _collate(stream.batch(), tokenizer.pad_token_id)
        loss = sequence_mean_nll(model(input_ids=input_ids, attention_mask=attention).logits, labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        bar.set_postfix(loss=f"{loss.item():.3f}")
    model.eval()
    out_dir.mkdir(parents=True)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    (out_dir / "bootstrap.json").write_text(
        json.dumps({"config": cfg.model_dump(), "version": BOOTSTRAP_VERSION, "teachers": list(TEACHERS)}, indent=2)
    )
