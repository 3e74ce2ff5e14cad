"""The spec reference (docs/spec.md): every field of a spec, read from the pydantic models that validate it,
one table per section: its dotted path, type, default and help text. `python -m orchestrator.reference`
prints it; tests/test_docs.py holds the page to it. It lives in the orchestrator because a spec's
`search` and `study` sections are validated here (a trial's code never imports the orchestrator)."""

from __future__ import annotations

import re
import types
import typing
from typing import Any, Literal

import annotated_types
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from orchestrator.spec import SearchConfig
from orchestrator.study import StudyConfig
from trainables.config import TrialConfig

BOUNDS = {
    annotated_types.Gt: (">", "gt"),
    annotated_types.Ge: (">=", "ge"),
    annotated_types.Lt: ("<", "lt"),
    annotated_types.Le: ("<=", "le"),
}
ROOTS = (  # (section path, model, where it is defined, what it is)
    ("", TrialConfig, "trainables/config.py", "The trial, every spec's fields"),
    ("search", SearchConfig, "orchestrator/spec.py", "`search`, a sweep's section"),
    ("study", StudyConfig, "orchestrator/study.py", "`study`, a study's section"),
)


def bounds(metadata: list) -> str:
    """` >= 2, <= 1024` from a field's annotated-types constraints (other metadata, validators, say nothing)."""
    found = [f"{BOUNDS[type(m)][0]} {getattr(m, BOUNDS[type(m)][1])}" for m in metadata if type(m) in BOUNDS]
    found += [f"{b}" for m in metadata if isinstance(m, FieldInfo) for b in [bounds(m.metadata).strip()] if b]
    return f" {', '.join(found)}" if found else ""


def type_name(annotation: Any, sections: dict[type, str]) -> str:
    """A field's type as a spec writer reads it: YAML values of a Literal, `null` for None, a section's path."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None):
        return "null"
    if origin is Literal:
        return " | ".join(yaml_value(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a, sections) for a in args)
    if origin is typing.Annotated:
        return type_name(args[0], sections) + bounds(list(args[1:]))
    if origin is not None:
        return f"{origin.__name__}[{', '.join(type_name(a, sections) for a in args)}]"
    if annotation in sections:
        return f"section `{sections[annotation]}`"
    return getattr(annotation, "__name__", str(annotation))


def yaml_value(value: Any) -> str:
    """A value as one would write it in a spec (a section's values as a YAML mapping)."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    text = yaml.safe_dump(value, default_flow_style=True, width=float("inf"), sort_keys=False).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def default(field: FieldInfo, instance: BaseModel | None, name: str) -> Any:
    """The field's default: its value in the section's own default (the root's defaults resolved), else its
    declared default; PydanticUndefined when the field is required."""
    if instance is not None:
        return getattr(instance, name)
    if field.default_factory is not None:
        return field.default_factory()
    return field.default


def models_in(annotation: Any) -> list[type[BaseModel]]:
    """The section models a field's type holds (a sub-section, an optional one, a mapping of them)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in typing.get_args(annotation) for m in models_in(a)]


def escape(text: str) -> str:
    """Text for a table cell: pipes escaped, and `<` outside code spans (`<think>` is no HTML tag)."""
    parts = text.replace("|", "\\|").replace("\n", " ").split("`")
    return "`".join(part if i % 2 else re.sub(r"<(?=[A-Za-z/!?])", r"\\<", part) for i, part in enumerate(parts))


def row(path: str, field: FieldInfo, value: Any, sections: dict[type, str]) -> str:
    shown = "required" if value is PydanticUndefined else f"`{escape(yaml_value(value))}`"
    kind, limits = type_name(field.annotation, sections), bounds(field.metadata)
    kind = kind.removesuffix(" | null") + limits + " | null" if kind.endswith(" | null") else kind + limits
    kind = escape(kind)
    return f"| `{path}` | {kind} | {shown} | {escape(field.description or '')} |"


def section(path: str, model: type[BaseModel], instance: BaseModel | None, sections: dict[type, str]) -> list[str]:
    """The markdown of one section's table, then of the sections it holds that are not drawn yet."""
    sections.setdefault(model, path)
    children, rows = [], []
    for name, field in model.model_fields.items():
        value = default(field, instance, name)
        nested = [m for m in models_in(field.annotation) if m not in sections]
        if isinstance(value, BaseModel) and type(value) in nested:
            children.append((f"{path}.{name}".lstrip("."), type(value), value))
            continue
        for sub in nested:
            suffix = {dict: ".<name>", list: "[]"}.get(typing.get_origin(field.annotation), "")
            sections[sub] = f"{path}.{name}{suffix}".lstrip(".")
            children.append((sections[sub], sub, None))
        rows.append(row(f"{path}.{name}".lstrip("."), field, value, sections))
    lines = heading(path, model) + (
        ["| field | type | default | description |", "|---|---|---|---|", *rows, ""] if rows else []
    )
    return lines + [line for child in children for line in section(*child, sections)]


def heading(path: str, model: type[BaseModel]) -> list[str]:
    doc = " ".join((model.__doc__ or "").split("\n\n")[0].split())
    return [f"#### `{path}`" if path else "#### top level", "", *([doc, ""] if doc else [])]


def markdown() -> str:
    """docs/spec.md's reference: a part per root (trial, search, study), a table per section."""
    lines = []
    for path, model, source, what in ROOTS:
        instance = model() if path == "" else None  # a trial's defaults, resolved (a search needs its space)
        lines += [f"### {what} ({model.__name__}, {source})", ""]
        lines += section(path, model, instance, {})
    return "\n".join(lines).rstrip("\n") + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
