"""The OGER trajectory encoder (eq. 1) on the real packaged MiniLM, offline: shapes, sense, long-text
modes, and the offline cache (memory, disk, invalidation, batched warm-up)."""

import math
import os

import pytest
import torch

from trainables.rewards.embed import (
    LONG_TEXT_MODES,
    TrajectoryEncoder,
    packaged_encoder_path,
    split_windows,
)
from trainables.rewards.oger import cosine_matrix

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local folder must never reach for the hub

SHORT = ["The answer is 12 because 3 times 4 is 12.", "Adding the two numbers gives 7.", "x = 5"]
# ~160 tokens of baking, then ~650 of arithmetic: the opening window alone misses most of the text
LONG = "To bake bread, mix flour, water, yeast and salt, knead the dough and let it rise. " * 8 + " ".join(
    f"Step {i}: add {i} to the running total, which becomes {i * (i + 1) // 2}." for i in range(1, 50)
)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("embed_cache")


@pytest.fixture(scope="module")
def encoder(cache_dir):
    return TrajectoryEncoder(cache_dir=cache_dir, batch_size=8)


@pytest.fixture(scope="module")
def chunk_encoder():
    return TrajectoryEncoder(long_text="chunk", batch_size=8)


def test_packaged_path_is_a_model_folder():
    path = packaged_encoder_path()
    assert path.is_dir() and (path / "modules.json").is_file()


# -- encode ----------------------------------------------------------------------------------------


def test_encode_shape_dtype_and_determinism(encoder):
    emb = encoder.encode(SHORT)
    assert emb.shape == (3, 384) and emb.dtype == torch.float32 and encoder.dimension == 384
    assert torch.equal(emb, encoder.encode(SHORT))
    assert encoder.encode([]).shape == (0, 384)


def test_paraphrases_are_closer_than_an_unrelated_sentence(encoder):
    emb = encoder.encode(
        [
            "The total is 12, since 3 times 4 equals 12.",
            "Multiplying 3 by 4 gives 12, so the answer is 12.",
            "The cat slept on the warm windowsill all afternoon.",
        ]
    )  # [3, 384]
    sim = cosine_matrix(emb, emb)  # [3, 3]
    assert sim[0, 1] > sim[0, 2] + 0.3 and sim[0, 1] > sim[1, 2] + 0.3


def test_name_carries_model_and_mode(encoder, chunk_encoder):
    assert encoder.name != chunk_encoder.name
    assert "truncate" in encoder.name and "chunk" in chunk_encoder.name


# -- long texts: truncate vs chunk -----------------------------------------------------------------


def test_split_windows_hand_worked(encoder):
    pieces = split_windows("one two  three four five", encoder.model.tokenizer, window=2)
    assert pieces == ["one two", "three four", "five"]
    assert split_windows("one two", encoder.model.tokenizer, window=2) == ["one two"]


def test_long_text_windows_cover_it_and_fit(encoder):
    tok = encoder.model.tokenizer
    window = encoder.model.max_seq_length - tok.num_special_tokens_to_add(pair=False)  # 254
    n_tokens = len(tok(LONG, add_special_tokens=False, verbose=False)["input_ids"])
    pieces = split_windows(LONG, tok, window)
    assert n_tokens > 3 * window and len(pieces) == math.ceil(n_tokens / window)
    assert all(len(tok(p, add_special_tokens=False)["input_ids"]) <= window for p in pieces)
    assert "".join(pieces).replace(" ", "") == LONG.replace(" ", "")  # nothing lost or repeated


def test_chunk_is_the_mean_of_its_window_embeddings(encoder, chunk_encoder):
    window = encoder.model.max_seq_length - 2
    reference = encoder.encode(split_windows(LONG, encoder.model.tokenizer, window)).mean(dim=0)  # [384]
    torch.testing.assert_close(chunk_encoder.encode([LONG])[0], reference, atol=1e-5, rtol=1e-4)


def test_chunk_differs_from_truncate_on_long_text_only(encoder, chunk_encoder):
    truncated, chunked = encoder.encode([LONG, *SHORT]), chunk_encoder.encode([LONG, *SHORT])  # [4, 384]
    assert cosine_matrix(truncated[:1], chunked[:1]).item() < 0.95
    torch.testing.assert_close(chunked[1:], truncated[1:], atol=1e-5, rtol=1e-4)


# -- offline cache ---------------------------------------------------------------------------------


def test_offline_cache_memory_then_disk_then_invalidation(encoder, cache_dir):
    texts = ["Teacher one: 3 * 4 = 12, so \\boxed{12}.", "Teacher two: 4 + 4 + 4 = 12. \\boxed{12}"]
    before = encoder.texts_encoded
    first = encoder.encode_offline("prompt-7", texts)
    assert first.shape == (2, 384) and encoder.texts_encoded == before + 2

    hits = encoder.cache_hits
    torch.testing.assert_close(encoder.encode_offline("prompt-7", texts), first)
    assert encoder.texts_encoded == before + 2 and encoder.cache_hits == hits + 1

    fresh = TrajectoryEncoder(cache_dir=cache_dir)  # a new process, say, after a restart
    torch.testing.assert_close(fresh.encode_offline("prompt-7", texts), first)
    assert (fresh.texts_encoded, fresh.cache_hits, fresh.cache_misses) == (0, 1, 0)

    changed = [texts[0], texts[1].replace("12", "13")]
    fresh.encode_offline("prompt-7", changed)
    assert (fresh.texts_encoded, fresh.cache_misses) == (2, 1)
    assert not list(cache_dir.glob("*.tmp"))  # atomic writes leave no temp files


def test_cache_names_depend_on_encoder_key_and_texts(encoder, chunk_encoder):
    name = encoder.cache_file_name("k", ["a", "b"])
    assert name == encoder.cache_file_name("k", ["a", "b"])
    others = {
        encoder.cache_file_name("k2", ["a", "b"]),
        encoder.cache_file_name("k", ["a", "c"]),
        encoder.cache_file_name("k", ["b", "a"]),
        chunk_encoder.cache_file_name("k", ["a", "b"]),
    }
    assert name not in others and len(others) == 4


def test_warm_offline_encodes_exactly_the_missing_texts_in_one_pass(encoder, monkeypatch):
    items = {
        "w-0": ["first teacher, prompt 0", "second teacher, prompt 0"],
        "w-1": ["only teacher, prompt 1"],
        "w-2": ["a", "b", "c"],
    }
    encoder.encode_offline("w-0", items["w-0"])  # already cached
    calls = []
    real_encode = encoder.encode

    def counting_encode(texts, **kwargs):
        calls.append(list(texts))
        return real_encode(texts, **kwargs)

    monkeypatch.setattr(encoder, "encode", counting_encode)
    before, misses = encoder.texts_encoded, encoder.cache_misses
    encoder.warm_offline(items)
    assert calls == [items["w-1"] + items["w-2"]]  # one pass over the missing texts only
    assert encoder.texts_encoded == before + 4 and encoder.cache_misses == misses + 2

    encoded = encoder.texts_encoded
    warmed = encoder.encode_offline("w-2", items["w-2"])
    assert encoder.texts_encoded == encoded
    torch.testing.assert_close(warmed, real_encode(items["w-2"]), atol=1e-5, rtol=1e-4)
    encoder.warm_offline(items)  # all present now: nothing to run
    assert len(calls) == 1


# -- errors at the edge ----------------------------------------------------------------------------


def test_bad_model_path_is_one_line(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError) as err:
        TrajectoryEncoder(str(missing))
    assert "\n" not in str(err.value) and str(missing) in str(err.value) and "folder" in str(err.value)


def test_bad_long_text_mode_lists_the_choices():
    with pytest.raises(ValueError) as err:
        TrajectoryEncoder(long_text="average")
    message = str(err.value)
    assert "\n" not in message and "'average'" in message
    assert all(mode in message for mode in LONG_TEXT_MODES)
