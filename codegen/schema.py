"""Schema stage: manifest JSON -> the `Problem`s of its shape, against `manifest.schema.json`.

The schema (docs/MANIFEST.md describes it) says which keys exist where and what kind of value each
holds, for both dialects; the loader (manifest.py) runs only on a manifest that fits it, so a
missing key or a value of the wrong kind is a located problem here and never a KeyError there.
jsonschema does the checking; this module turns its errors into our messages: the JSON pointer of
the offending key or value, unknown keys with the closest known one, and for a value that may take
several forms (`anyOf`) the errors of the form whose JSON type the value has.
"""

from __future__ import annotations

import functools
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator, ValidationError

from .ir import Origin
from .problems import Problem, closest

SCHEMA_PATH = Path(__file__).with_name("manifest.schema.json")

_JSON_TYPES = {
    "object": "an object",
    "array": "an array",
    "string": "a string",
    "number": "a number",
    "integer": "an integer",
    "boolean": "a boolean",
    "null": "null",
}


@functools.cache
def schema() -> dict:
    return json.loads(SCHEMA_PATH.read_text())


@functools.cache
def _validator(definition: str | None = None) -> Draft202012Validator:
    """The manifest schema's validator, or with `definition` that of one of its `$defs` (the
    shared files' `shared`), its references resolved in the same document."""
    if definition is None:
        return Draft202012Validator(schema())
    whole = schema()
    return Draft202012Validator(
        {"$schema": whole["$schema"], "$defs": whole["$defs"], "$ref": f"#/$defs/{definition}"}
    )


def schema_problems(
    data: Any, source: str, definition: str | None = None, included_by: str | None = None
) -> list[Problem]:
    """Every way `data` (read from `source`) does not fit the schema, each once: the manifest
    schema, or with `definition` one of its `$defs` ("shared": a shared file, which the manifest
    `included_by` includes)."""
    root = Origin(source, "", included_by)
    validator = _validator(definition)
    found = [problem for error in validator.iter_errors(data) for problem in _problems_of(error, root)]
    return list(dict.fromkeys(found))


def _problems_of(error: ValidationError, root: Origin) -> list[Problem]:
    origin = root.child(*error.absolute_path)
    kind = error.validator
    if kind in ("anyOf", "oneOf"):
        return _problems_of_the_fitting_form(error, root)
    if kind == "required":
        return [
            Problem(origin.child(key), "required key is missing")
            for key in error.validator_value
            if key not in error.instance
        ]
    if kind == "additionalProperties" and error.validator_value is False:
        return _unknown_keys(error, origin)
    if kind == "pattern" and "propertyNames" in list(error.absolute_schema_path)[-3:]:  # a key, not a value
        return [
            Problem(
                origin.child(error.instance),
                f"the key `{error.instance}` is not {_title(error.schema, 'valid here')}",
            )
        ]
    return [Problem(origin, _message(error))]


def _message(error: ValidationError) -> str:
    kind, value = error.validator, error.instance
    if kind == "type":
        expected = _title(error.schema, " or ".join(_JSON_TYPES[t] for t in _as_list(error.validator_value)))
        return f"expected {expected}, got {_json_type(value)}"
    if kind == "enum":
        options = ", ".join(repr(option) for option in error.validator_value)
        suggestion = (
            closest(value, [str(o) for o in error.validator_value]) if isinstance(value, str) else None
        )
        hint = f"; did you mean {suggestion!r}?" if suggestion else ""
        return f"{_title(error.schema, 'the value')} must be one of {options}, got {value!r}{hint}"
    if kind == "pattern":
        return f"expected {_title(error.schema, 'a string matching ' + error.validator_value)}, got {value!r}"
    return error.message  # minItems, minimum: jsonschema's own words are clear


def _problems_of_the_fitting_form(error: ValidationError, root: Origin) -> list[Problem]:
    """A value with several allowed forms: the problems of the one form whose JSON type it has;
    when no form (or more than one) has its type, that it has none of the forms."""
    by_form: dict[int, list[ValidationError]] = defaultdict(list)
    for sub in error.context:
        by_form[sub.relative_schema_path[0]].append(sub)
    fitting = [subs for subs in by_form.values() if not any(_wrong_type_here(sub, error) for sub in subs)]
    if len(fitting) == 1:
        return [problem for sub in fitting[0] for problem in _problems_of(sub, root)]
    origin = root.child(*error.absolute_path)
    return [
        Problem(
            origin,
            f"expected {_title(error.schema, 'another kind of value')}, got {_json_type(error.instance)}",
        )
    ]


def _wrong_type_here(sub: ValidationError, parent: ValidationError) -> bool:
    return sub.validator == "type" and len(sub.absolute_path) == len(parent.absolute_path)


def _unknown_keys(error: ValidationError, origin: Origin) -> list[Problem]:
    known = list(error.schema.get("properties", {}))
    problems = []
    for key in error.instance:
        if key in known:
            continue
        suggestion = closest(key, known)
        message = (
            f"unknown key `{key}`; did you mean `{suggestion}`?"
            if suggestion
            else f"unknown key `{key}`; keys here: {', '.join(known)}"
        )
        problems.append(Problem(origin.child(key), message))
    return problems


def _title(subschema: Any, fallback: str) -> str:
    return subschema.get("title", fallback) if isinstance(subschema, dict) else fallback


def _as_list(value: Any) -> list:
    return value if isinstance(value, list) else [value]


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    names = {dict: "an object", list: "an array", str: "a string", type(None): "null"}
    return names.get(type(value), type(value).__name__)
