"""Why a value does not fit a JSON schema, in one line: what an operator or a model
reads when a resolution, a tool's arguments or its result do not fit."""

from __future__ import annotations

from typing import Any

import jsonschema

__all__ = ["schema_problem", "validator"]


def validator(schema: dict[str, Any]) -> Any:
    """A validator for `schema`, by the draft it names (`$schema`; else the newest), after
    checking the schema itself (`jsonschema.SchemaError` if it is not one)."""
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    return validator_class(schema)


def schema_problem(validator: Any, value: Any) -> str | None:
    """The best-matching error of `validator` (a `jsonschema` validator) on `value`, as
    `path: message`, or None if the value fits."""
    error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "(root)"
    return f"{where[:100]}: {error.message[:300]}"
