"""The vLLM generation engine (V1 engine, V1 model runner), with the same interface as `HFEngine`.

What: `VLLMEngine(model_path).generate(prompts, n, spec) -> RolloutBatch` and
`update_weights(state_dict, version)`, backed by an in-process `vllm.LLM`.

Why this shape:
- The per-token schedule (EAD or fixed) is a V1 logits processor, `ScheduledTemperatureProcessor`,
  fed per request through `SamplingParams.extra_args`; it calls `trainables.rollout.ead.tau_table`,
  so its temperatures are exactly the pure schedule's (and HFEngine's). vLLM's own temperature stays
  1.0 for every schedule, `fixed` included: one code path, and the division happens at the same
  point as in HFEngine (temperature, then top_p).
- The processor declares itself argmax-invariant (dividing by tau > 0 keeps the argmax), so the V1
  sampler runs it after its own temperature and before top-k/top-p; with
  `logprobs_mode="processed_logprobs"` the returned log-prob of each sampled token is then taken
  from the distribution it was sampled from, which is what TIS needs (`behaviour_logprobs`).
- Weights are replaced through the worker's `reload_weights` (layer-wise reload), from a worker
  extension method called by name: on CPU, vLLM pre-packs linear weights after loading, so writing
  into the parameters alone (`model.load_weights`) would leave the packed copies stale; a tied LM
  head is re-tied by hand (vLLM 0.32 leaves it on the old embedding). The prefix cache is reset after
  an update, else prompts would reuse KV computed with the old weights.
- On GPUs the weights may come through vLLM's own weight transfer engine instead
  (`rollout.weight_transfer: nccl | ipc`; `init_weight_transfer`, `transfer_weights`): a NCCL
  broadcast of packed buckets, or CUDA IPC handles from the colocated learner; vLLM reloads them
  layer by layer. The senders are push.NcclPush and push.IpcPush.
- vLLM is imported lazily, so this module imports without it; the processor class is built on first
  access (module `__getattr__`), which keeps it importable by name in vLLM's engine-core process.
"""

from __future__ import annotations

import os
import random
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from trainables.rollout.ead import SCHEDULES, tau_table
from trainables.rollout.types import RolloutBatch, SamplingSpec

# Keys of SamplingParams.extra_args read by the processor.
SCHEDULE_KEY = "temperature_schedule"  # a key of SCHEDULES
PARAMS_KEY = "schedule_params"  # keyword arguments of that schedule
STEP_KEY = "learner_step"  # the RL step s (EAD's step-aware decay)

_PROCESSOR_CLASS = None


def check_schedule_args(args: dict) -> None:
    """A request's schedule arguments (SamplingParams.extra_args), refused with a reason when malformed."""
    if SCHEDULE_KEY not in args:
        return
    if args[SCHEDULE_KEY] not in SCHEDULES:
        raise ValueError(f"unknown temperature schedule {args[SCHEDULE_KEY]!r}; known: {sorted(SCHEDULES)}")
    if not isinstance(args.get(PARAMS_KEY, {}), dict) or not isinstance(args.get(STEP_KEY, 0), int):
        raise ValueError(f"{PARAMS_KEY} must be a dict and {STEP_KEY} an int")


def move_row(rows: dict, a: int, b: int, *, swap: bool) -> None:
    """A batch row's state moved from a to b (vLLM's `BatchUpdate.moved`), or the two swapped."""
    entry_a, entry_b = rows.pop(a, None), rows.pop(b, None)
    if entry_a is not None:
        rows[b] = entry_a
    if swap and entry_b is not None:
        rows[a] = entry_b


def row_temperatures(rows: dict, batch_size: int) -> list[float]:
    """Each batch row's tau at the token it samples now (its output's length indexes its table); 1 for an
    unscheduled row, which x / 1 leaves exactly as it is."""
    tau = [1.0] * batch_size
    for row, (taus, output_ids) in rows.items():
        tau[row] = taus[min(len(output_ids), len(taus) - 1)]
    return tau


def _build_processor_class():
    """The V1 logits processor applying a request's schedule to its next token (built lazily)."""
    from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

    class ScheduledTemperatureProcessor(LogitsProcessor):
        """Divides the logits of each scheduled request by tau_t, t = tokens it has generated so far.

        Per batch row it keeps (tau table, output token list). The table holds the request's schedule
        at every position it can sample (`tau_table`, shared by the requests of one schedule); the
        list is the request's running output list, passed by reference in `BatchUpdate.added` and
        appended to by the model runner (with async scheduling, a placeholder -1 per token in
        flight), so its length at `apply` is the index t of the token being sampled: 0 for the
        first generated token. A decode step is then one lookup per row and one division.
        """

        @classmethod
        def validate_params(cls, sampling_params) -> None:
            check_schedule_args(sampling_params.extra_args or {})

        def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool):
            self.max_model_len = vllm_config.model_config.max_model_len  # the cap when max_tokens is None
            self.rows: dict[int, tuple[tuple[float, ...], list[int]]] = {}  # batch row -> (taus, output ids)

        def is_argmax_invariant(self) -> bool:
            # True places it after vLLM's temperature (1.0) and before top-k/top-p, on the random
            # sampling path only: the order HFEngine uses. Greedy requests are not rescaled, which
            # changes nothing for them.
            return True

        def update_state(self, batch_update: BatchUpdate | None) -> None:
            if batch_update is None:
                return
            # Documented order: removed, added, moved.
            for index in batch_update.removed:
                self.rows.pop(index, None)
            for index, params, _prompt_ids, output_ids in batch_update.added:
                args = params.extra_args or {}
                if SCHEDULE_KEY in args:
                    taus = tau_table(
                        args[SCHEDULE_KEY],
                        args.get(PARAMS_KEY, {}),
                        int(args.get(STEP_KEY, 0)),
                        params.max_tokens or self.max_model_len,
                    )
                    self.rows[index] = (taus, output_ids)  # keep the reference: it grows in place
                else:
                    self.rows.pop(index, None)  # a new request may take a scheduled one's row
            for a, b, direction in batch_update.moved:
                move_row(self.rows, a, b, swap=direction == MoveDirectionality.SWAP)

        def apply(self, logits: torch.Tensor) -> torch.Tensor:
            if not self.rows:
                return logits
            tau = row_temperatures(self.rows, logits.shape[0])
            return logits.div_(torch.tensor(tau, dtype=logits.dtype, device=logits.device)[:, None])

    ScheduledTemperatureProcessor.__module__ = __name__
    ScheduledTemperatureProcessor.__qualname__ = "ScheduledTemperatureProcessor"
    return ScheduledTemperatureProcessor


def __getattr__(name: str):
    # PEP 562: `ScheduledTemperatureProcessor` exists once asked for, so vLLM (and pickle, in the
    # engine-core process) can import it by name while this module still imports without vLLM.
    global _PROCESSOR_CLASS
    if name == "ScheduledTemperatureProcessor":
        if _PROCESSOR_CLASS is None:
            _PROCESSOR_CLASS = _build_processor_class()
        return _PROCESSOR_CLASS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _checkpoint_names(model_path: Path) -> set[str]:
    """Tensor names of the HF checkpoint: what a full weight update must provide."""
    from safetensors import safe_open

    names: set[str] = set()
    for file in sorted(model_path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            names.update(f.keys())
    return names


class RolloutWorkerExtension:
    """Mixed into vLLM's worker class (`LLM(worker_extension_cls=...)`), called by name through
    `collective_rpc`: names and bytes cross vLLM's RPC to its engine-core and worker processes,
    where tensors nested in arguments arrive as lists and callables need insecure pickling."""

    def load_rollout_weights(self, weights: list[tuple[str, torch.Tensor]] | bytes) -> bool:
        """Load HF-named weights; returns whether a tied LM head was re-tied.

        weights: (name, tensor) pairs in-process, safetensors bytes across processes.
        `reload_weights` loads in checkpoint format and redoes vLLM's post-load processing (weight
        packing) layer by layer. vLLM skips `lm_head.*` when the embeddings are tied, so that reload
        loads nothing into the LM head and puts its old kernel tensors back ("ParallelLMHead:
        Failed to load weights"); on CPU they include a GEMM-packed copy of the old embedding.
        Re-tying and re-running the head's post-load processing makes the logits use the new weights.
        """
        if isinstance(weights, bytes):
            from safetensors.torch import load

            weights = list(load(weights).items())
        self.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
        model = self.get_model()
        if not getattr(getattr(model, "config", None), "tie_word_embeddings", False):
            return False
        model.lm_head.weight = model.model.embed_tokens.weight
        model.lm_head.quant_method.process_weights_after_loading(model.lm_head)
        return True


class VLLMEngine:
    """A vLLM `LLM` in this process, generating with `SamplingSpec`s; weights replaceable in place.

    dtype: the engine's weights and activations (float32 on CPUs without AVX512-BF16, where bf16 is
    slow). multiprocessing: run vLLM's engine core in its own process (vLLM's default); off by
    default, so a Ray actor holding the engine has no child processes and weight updates need no
    serialization. Other keyword arguments go to `vllm.LLM` (e.g. enforce_eager, max_model_len).
    """

    def __init__(
        self,
        model_path: str | Path,
        *,
        dtype: torch.dtype | str = torch.float32,
        seed: int = 0,
        multiprocessing: bool = False,
        weight_transfer: str | None = None,
        **llm_kwargs,
    ):
        # Read by vLLM when the LLM is built: set before it. The processor is written against the
        # V1 model runner's interface; model runner V2 (default where vLLM finds Triton) has another.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if multiprocessing else "0"
        os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
        from transformers import AutoTokenizer
        from vllm import LLM

        # Weights cross a process boundary as safetensors bytes (nested tensors do not survive vLLM's
        # RPC): to an engine core of its own, or to the tensor-parallel workers.
        self.serialize_weights = multiprocessing or llm_kwargs.get("tensor_parallel_size", 1) > 1
        self.asleep = False
        self.model_path = Path(model_path)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        if self.tokenizer.pad_token_id is None:  # as trainables.data.bootstrap.load_policy
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self._names = _checkpoint_names(self.model_path)
        dtype_name = str(dtype).removeprefix("torch.")
        if weight_transfer:  # vLLM's weight transfer engine, "nccl" or "ipc" (`transfer_weights`)
            from vllm.config import WeightTransferConfig

            llm_kwargs["weight_transfer_config"] = WeightTransferConfig(backend=weight_transfer)
        self.llm = LLM(
            model=str(self.model_path),
            dtype=dtype_name,
            seed=seed,
            logits_processors=[__getattr__("ScheduledTemperatureProcessor")],
            logprobs_mode="processed_logprobs",  # log-probs after the processor, temperature, top_p
            worker_extension_cls=f"{__name__}.RolloutWorkerExtension",
            **llm_kwargs,
        )
        self.weight_version = 0

    def _sampling_params(self, spec: SamplingSpec, n: int, seed: int):
        from vllm import SamplingParams

        return SamplingParams(
            n=n,
            temperature=1.0,  # the schedule's tau is applied by the processor, for every schedule
            top_p=spec.top_p,
            top_k=0,
            max_tokens=spec.max_new_tokens,
            seed=seed,  # the n samples get seed, seed + 1, ... (vLLM's parallel sampling)
            logprobs=0,  # only the sampled token's log-prob
            detokenize=False,  # texts are decoded below, exactly as HFEngine does
            extra_args={SCHEDULE_KEY: spec.schedule, PARAMS_KEY: dict(spec.params), STEP_KEY: int(spec.step)},
        )

    def generate(self, prompts: list[list[int]], n: int, spec: SamplingSpec) -> RolloutBatch:
        if self.asleep:
            raise RuntimeError("the engine sleeps without weights; push the learner's weights first (update_weights)")
        from vllm.inputs import TokensPrompt

        start = time.perf_counter()
        # One request per prompt, its base seed drawn from spec.seed: reproducible for one spec,
        # independent streams across prompts (seeds base..base+n-1 would overlap for nearby bases).
        rng = random.Random(spec.seed)
        params = [self._sampling_params(spec, n, rng.getrandbits(62)) for _ in prompts]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
        responses, logprobs, reasons = [], [], []
        for out in outputs:  # in prompt order
            for completion in sorted(out.outputs, key=lambda c: c.index):  # sample j of the prompt
                ids = list(completion.token_ids)  # includes the EOS when emitted
                if completion.finish_reason not in ("stop", "length"):
                    raise RuntimeError(f"vLLM finished a request with {completion.finish_reason!r}")
                responses.append(ids)
                logprobs.append([step[token].logprob for step, token in zip(completion.logprobs, ids)])
                # "stop": an EOS ended it (no stop strings are set; vLLM also stops at the extra EOS
                # ids of the model's generation_config.json); "length": max_new_tokens or max_model_len.
                reasons.append(completion.finish_reason)
        return RolloutBatch.decoded(
            self.tokenizer,
            prompts,
            responses,
            logprobs,
            reasons,
            n,
            self.weight_version,
            {"generate": time.perf_counter() - start},
        )

    def update_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> int:
        """Load a full state dict (names as in the learner's HF module) and record its version."""
        given = set(state_dict)
        optional = {"lm_head.weight"} - self._names  # tied: in the module's state dict, not the checkpoint
        missing, unexpected = sorted(self._names - given), sorted(given - self._names - optional)
        if missing or unexpected:
            raise ValueError(
                f"weight update does not match the engine's model: missing={missing[:3]} "
                f"unexpected={unexpected[:3]}; learner and rollout must load the same model"
            )
        weights = [
            (name, tensor.detach().to("cpu").contiguous()) for name, tensor in state_dict.items() if name in self._names
        ]
        if self.serialize_weights:
            from safetensors.torch import save

            weights = save(dict(weights))
        with self._replacing_weights(version):
            self.llm.collective_rpc("load_rollout_weights", args=(weights,))
        return version

    def init_weight_transfer(self, init_info: dict) -> set[str]:
        """Set up vLLM's weight transfer engine (nccl: join the learner's group, as ranks
        init_info["rank_offset"]...); returns the tensor names `transfer_weights` expects."""
        self.llm.init_weight_transfer_engine({"init_info": init_info})
        return set(self._names)

    def transfer_weights(self, update_info: dict, version: int) -> int:
        """Receive the learner's weights through vLLM's weight transfer engine (nccl: its broadcast of
        these tensors, in this order; ipc: CUDA IPC handles of them), reloaded layer by layer."""
        with self._replacing_weights(version):
            self.llm.start_weight_update()
            self.llm.update_weights({"update_info": update_info})
            self.llm.finish_weight_update()
        return version

    @contextmanager
    def _replacing_weights(self, version: int):
        if self.asleep:  # colocated: weight memory back first, the KV cache once the weights are in
            self.llm.wake_up(tags=["weights"])
        yield
        if self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        self.llm.reset_prefix_cache()  # cached prompt KV was computed with the old weights
        self.weight_version = version

    def sleep(self) -> None:
        """Free the GPU memory for a colocated learner (vLLM sleep mode, GPUs only): level 2 drops the
        weights as well as the KV cache, since the next weight update replaces them anyway."""
        self.llm.sleep(level=2)
        self.asleep = True
