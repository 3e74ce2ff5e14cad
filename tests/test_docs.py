"""The generated parts of docs/ are the code's own output: a page that differs from its generator is stale."""

from __future__ import annotations

import re
from pathlib import Path

from orchestrator.reference import markdown

SPEC = Path(__file__).parent.parent / "docs" / "spec.md"


def test_the_spec_reference_is_generated_from_the_models():
    text = SPEC.read_text()
    block = re.search(r"<!-- spec: python -m orchestrator.reference -->\n(.*?)<!-- /spec -->", text, re.S)
    assert block is not None, "docs/spec.md lost its <!-- spec: python -m orchestrator.reference --> block"
    assert block.group(1) == markdown(), (
        "docs/spec.md's reference is stale: replace the block with the output of `python -m orchestrator.reference`"
    )


def test_the_reference_names_every_field_of_a_spec():
    """Each leaf field of the trial, search and study models has its row, by its dotted path."""
    reference = markdown()
    for path in (
        "rollout.overlap",
        "rollout.decoding.ead.tau_max",
        "model.tiny.sft_unboxed_rate",
        "offline.files[].columns",
        "validation.decoding",
        "search.confirm.spending",
        "search.space.<name>.loguniform",
        "search.scheduler.name",
        "study.arms",
        "name",
    ):
        assert f"| `{path}` |" in reference, path


def test_a_row_has_the_fields_type_default_and_help():
    assert (
        "| `rollout.group_size` | int >= 2, <= 1024 | `8` | N rollouts per prompt (the GRPO group). |"
        in markdown().splitlines()
    )
    assert "| `search.space` | dict[str, section `search.space.<name>`] | required |" in markdown()
