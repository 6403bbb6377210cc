"""How `@tool` reads a function: its form, its input model and its docstring.

A tool's input schema goes into the registration fingerprint, which every
worker must compute identically and which recorded runs pin. So what is
built here from a plain function must depend only on the function itself:
no titles made up from its name, no order other than the signature's, and
every mistake (a missing annotation, `**kwargs`, a parameter pydantic cannot
hold) refused when the tool is defined, with what to change, rather than
found when a model first calls it.

Two forms (see `durably.tool`):

- **model form**: besides the context, exactly one parameter, annotated with
  a pydantic `BaseModel` subclass, e.g. `(args: RefundArgs, ctx: ToolContext)`.
  The model is the input model, unchanged. For compatibility,
  `(args: RefundArgs, ctx)` with an unannotated second parameter is this form
  too.
- **plain form**: anything else, e.g. `(ctx: ToolContext, order_id: str,
  amount_cents: int = 0)`. The input model is built from the parameters.

The context is the parameter annotated `ToolContext` (or `ToolContext | None`),
in any position, and is never part of the schema.
"""

from __future__ import annotations

import inspect
import re
import types
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Union, get_args, get_origin, get_type_hints

from pydantic import BaseModel, Field, PydanticUserError, create_model

from durably.errors import RegistrationError

__all__ = ["Docstring", "ToolSignature", "parse_docstring", "read_signature"]

Execute = Callable[[Any, Any], Coroutine[Any, Any, Any]]

# Google-style section headers; the first one ends the description.
_SECTIONS = frozenset(
    {
        "args",
        "arguments",
        "parameters",
        "params",
        "keyword args",
        "keyword arguments",
        "other parameters",
        "returns",
        "return",
        "yields",
        "yield",
        "raises",
        "raise",
        "examples",
        "example",
        "notes",
        "note",
        "attributes",
        "see also",
        "warnings",
        "warning",
        "warns",
        "todo",
        "references",
    }
)
_ARG_SECTIONS = frozenset({"args", "arguments", "parameters", "params"})
_HEADER = re.compile(r"([A-Za-z][A-Za-z ]*):\s*")
_ITEM = re.compile(r"(?P<name>\*{0,2}[A-Za-z_]\w*)\s*(?:\([^)]*\))?\s*:(?:\s+(?P<text>.*))?")


@dataclass(frozen=True)
class Docstring:
    """A docstring split into its description and its `Args:` entries."""

    description: str
    params: Mapping[str, str]


def parse_docstring(doc: str, where: str) -> Docstring:
    """Read a cleaned (`inspect.getdoc`) Google-style docstring.

    The description is the text before the first section header (`Args:`,
    `Returns:`, `Raises:`, ...: a known name alone on an unindented line,
    ending in a colon). In `Args:` (or `Arguments:`, `Parameters:`,
    `Params:`), each entry starts on a line at the section's indentation as
    `name: text` or `name (type): text`; deeper-indented lines continue it.
    Lines are joined with single spaces. An entry line that does not read
    so, or a name given twice, is a `RegistrationError` naming `where`.
    """
    lines = doc.splitlines()
    description: list[str] = []
    params: dict[str, str] = {}
    i = 0
    while i < len(lines) and _section(lines[i]) is None:
        description.append(lines[i])
        i += 1
    while i < len(lines):
        section = _section(lines[i])
        i += 1
        body: list[str] = []
        while i < len(lines) and (not lines[i].strip() or lines[i][:1].isspace()):
            body.append(lines[i])
            i += 1
        if section in _ARG_SECTIONS:
            for name, text in _arg_entries(body, where):
                if name in params:
                    raise RegistrationError(
                        f"{where}: the docstring describes parameter {name!r} twice; keep one entry"
                    )
                params[name] = text
        while i < len(lines) and _section(lines[i]) is None:
            i += 1  # unindented text after a section belongs to nothing we read
    return Docstring(description="\n".join(description).strip(), params=params)


def _section(line: str) -> str | None:
    match = _HEADER.fullmatch(line)
    if match is None or match.group(1).lower() not in _SECTIONS:
        return None
    return match.group(1).lower()


def _arg_entries(body: list[str], where: str) -> list[tuple[str, str]]:
    entries: list[tuple[str, list[str]]] = []
    indent: int | None = None
    for line in body:
        if not line.strip():
            continue
        depth = len(line) - len(line.lstrip())
        if indent is None:
            indent = depth
        if depth > indent and entries:
            entries[-1][1].append(line.strip())
            continue
        match = _ITEM.fullmatch(line.strip()) if depth == indent else None
        if match is None:
            raise RegistrationError(
                f"{where}: cannot read {line.strip()!r} in the docstring's Args section; "
                "write each parameter as `name: description` (continuation lines indented "
                "deeper)"
            )
        entries.append((match.group("name").lstrip("*"), [match.group("text") or ""]))
    return [(name, " ".join(t for t in text if t)) for name, text in entries]


# -- signatures -----------------------------------------------------------


class _Arguments(BaseModel):
    """Base of the input models built from plain functions.

    Their schemas carry no `title` pydantic derives from a name (the
    model's, from the function; each property's, from the parameter): the
    tool name already says it, such titles are noise to the model, and
    pydantic versions differ in when they add them (2.7 adds the model's
    after `json_schema_extra` runs), so they are removed from the finished
    schema. A title set with `Field(title=...)` stays; nested models keep
    their own schemas in `$defs`, exactly as in the model form. A property
    that refers to a model and has a description (a documented model
    parameter) is written `{"$ref": ..., "description": ...}`, as pydantic
    2.9 and later write it, never `{"allOf": [{"$ref": ...}], ...}` as 2.7
    and 2.8 did.
    """

    @classmethod
    def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
        schema = super().model_json_schema(*args, **kwargs)
        schema.pop("title", None)
        properties = schema.get("properties", {})
        for name, field in cls.model_fields.items():
            key = field.alias or name
            prop = properties.get(key)
            if not isinstance(prop, dict):
                continue
            if field.title is None:
                prop.pop("title", None)
            only = prop.get("allOf")
            if isinstance(only, list) and len(only) == 1 and list(only[0]) == ["$ref"]:
                rest = {k: v for k, v in prop.items() if k != "allOf"}
                properties[key] = {"$ref": only[0]["$ref"], **rest}
        return schema


@dataclass(frozen=True)
class ToolSignature:
    """What `@tool` builds from a function.

    `execute` calls the function as `execute(args, ctx)`; for the model form
    with the usual `(args, ctx)` shape it is the function itself.
    `description` is the docstring (model form: all of it, as before; plain
    form: the text before its first section).
    """

    input_model: type[BaseModel]
    execute: Execute
    description: str


def read_signature(fn: Callable[..., Any], context: type) -> ToolSignature:
    """The form, input model and caller of tool function `fn`.

    `context` is the `ToolContext` class (passed in: tools.py imports this
    module). Raises `RegistrationError` for a signature a tool cannot have.
    """
    where = f"@tool {getattr(fn, '__qualname__', repr(fn))}"
    params = list(inspect.signature(fn).parameters.values())
    try:
        hints = get_type_hints(fn, include_extras=True)
    except Exception as err:  # NameError, TypeError: an annotation that cannot be evaluated
        raise RegistrationError(
            f"{where}: cannot resolve its annotations ({type(err).__name__}: {err}); "
            "import or define every type it names at module level"
        ) from err
    doc = inspect.getdoc(fn) or ""
    bare = {name: _strip_annotated(hint) for name, hint in hints.items()}

    ctx = [p for p in params if _is_context(bare.get(p.name), context)]
    if len(ctx) > 1:
        raise RegistrationError(
            f"{where}: parameters {[p.name for p in ctx]} are all annotated ToolContext; keep one"
        )
    ctx_param = ctx[0] if ctx else None
    if ctx_param is not None and ctx_param.kind in _VARIADIC:
        raise RegistrationError(
            f"{where}: the context parameter {ctx_param.name!r} must be a single named "
            "parameter, e.g. `ctx: ToolContext`"
        )
    others = [p for p in params if p is not ctx_param]

    if (
        len(params) == 2
        and all(p.kind in _POSITIONAL for p in params)
        and _is_model(bare.get(params[0].name))
        and (params[1] is ctx_param or params[1].annotation is inspect.Parameter.empty)
    ):
        # `(args: Model, ctx)`, the one shape tools had before the plain form: called as is.
        model: type[BaseModel] = bare[params[0].name]
        return ToolSignature(input_model=model, execute=fn, description=doc)
    if len(others) == 1 and others[0].kind not in _VARIADIC and _is_model(bare.get(others[0].name)):
        model = bare[others[0].name]
        if others[0].name in parse_docstring(doc, where).params:
            raise RegistrationError(
                f"{where}: takes one pydantic model, {others[0].name!r}, so the model's fields "
                f"are the tool's arguments, but the docstring's Args section describes "
                f"{others[0].name!r} as one argument. Describe the fields on the model "
                "(Field(description=...)), or add a parameter to take the model as one argument"
            )
        return ToolSignature(
            input_model=model,
            execute=_caller(fn, params, ctx_param, model_param=others[0].name),
            description=doc,
        )
    return _plain(fn, where, params, others, ctx_param, hints, doc)


_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
_RESERVED = frozenset(n for n in dir(BaseModel) if not n.startswith("_"))


def _plain(
    fn: Callable[..., Any],
    where: str,
    params: list[inspect.Parameter],
    others: list[inspect.Parameter],
    ctx_param: inspect.Parameter | None,
    hints: Mapping[str, Any],
    doc: str,
) -> ToolSignature:
    for p in others:
        _check_parameter(where, p, hints)
    docstring = parse_docstring(doc, where)
    known = {p.name for p in params}
    unknown = sorted(set(docstring.params) - known)
    if unknown:
        raise RegistrationError(
            f"{where}: the docstring's Args section describes {unknown}, which the function "
            f"does not take (its parameters: {[p.name for p in params]}); fix the names"
        )
    fields: dict[str, Any] = {}
    for p in others:
        annotation = hints[p.name]
        text = docstring.params.get(p.name)
        if text:
            # First, so a description the annotation or default sets wins over the docstring.
            annotation = _described(annotation, text)
        default = ... if p.default is inspect.Parameter.empty else p.default
        fields[p.name] = (annotation, default)
    try:
        model: type[BaseModel] = create_model(
            getattr(fn, "__name__", "tool"),
            __base__=_Arguments,
            __module__=getattr(fn, "__module__", None) or __name__,
            **fields,
        )
        model.model_json_schema()
    except (PydanticUserError, TypeError, ValueError, NameError) as err:
        raise RegistrationError(
            f"{where}: its parameters cannot become a JSON schema ({err}); use types pydantic "
            "can validate and describe (str, int, float, bool, lists, dicts, Literal, "
            "pydantic models, ...), or declare a pydantic model and take it as the only "
            "argument"
        ) from err
    return ToolSignature(
        input_model=model,
        execute=_caller(fn, params, ctx_param, model_param=None),
        description=docstring.description,
    )


def _check_parameter(where: str, p: inspect.Parameter, hints: Mapping[str, Any]) -> None:
    if p.kind in _VARIADIC:
        star = "*" if p.kind is inspect.Parameter.VAR_POSITIONAL else "**"
        raise RegistrationError(
            f"{where}: `{star}{p.name}` cannot be described to a model; declare each argument "
            "as a named, annotated parameter"
        )
    if p.kind is inspect.Parameter.POSITIONAL_ONLY:
        raise RegistrationError(
            f"{where}: parameter {p.name!r} is positional-only, but a tool is called with "
            "named arguments; remove the `/`"
        )
    if p.name not in hints:
        raise RegistrationError(
            f"{where}: annotate parameter {p.name!r} with its type (e.g. `{p.name}: str`); "
            "the annotation becomes the schema the model sees (the context parameter must "
            "be annotated `ToolContext`)"
        )
    if p.name.startswith("_"):
        raise RegistrationError(
            f"{where}: parameter {p.name!r} starts with '_', which pydantic does not allow "
            "for a field; rename it"
        )
    if p.name in _RESERVED or p.name.startswith("model_"):
        raise RegistrationError(
            f"{where}: parameter {p.name!r} clashes with a pydantic BaseModel attribute; "
            "rename it, or keep the name the model sees by declaring a pydantic model with "
            f"`Field(alias={p.name!r})` and taking that model as the only argument"
        )


def _caller(
    fn: Callable[..., Any],
    params: list[inspect.Parameter],
    ctx_param: inspect.Parameter | None,
    *,
    model_param: str | None,
) -> Execute:
    """`execute(args, ctx)` calling `fn` with the context and the model (model form)
    or each field as a named argument (plain form)."""

    async def execute(args: BaseModel, ctx: Any) -> Any:
        positional: list[Any] = []
        named: dict[str, Any] = {}
        for p in params:
            if p is ctx_param:
                value = ctx
            elif model_param is not None:
                value = args
            else:
                value = getattr(args, p.name)
            if p.kind is inspect.Parameter.POSITIONAL_ONLY:
                positional.append(value)
            else:
                named[p.name] = value
        return await fn(*positional, **named)

    execute.__name__ = getattr(fn, "__name__", "execute")
    execute.__qualname__ = getattr(fn, "__qualname__", execute.__name__)
    return execute


def _strip_annotated(hint: Any) -> Any:
    while get_origin(hint) is Annotated:
        hint = get_args(hint)[0]
    return hint


def _is_model(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, BaseModel)


def _is_context(hint: Any, context: type) -> bool:
    if hint is context:
        return True
    if get_origin(hint) in (Union, types.UnionType):
        return set(get_args(hint)) == {context, type(None)}
    return False


def _described(annotation: Any, text: str) -> Any:
    doc_field = Field(description=text)
    if get_origin(annotation) is Annotated:
        inner, *metadata = get_args(annotation)
        return Annotated[(inner, doc_field, *metadata)]
    return Annotated[annotation, doc_field]
