"""durably's search attributes on a namespace: which are missing, and registering them.

`durably dev` and `durably setup` register them; a worker checks them as it
starts (`check_on_start`). The failure this prevents: on a namespace without
them Temporal refuses to start a run, and a run started anyway (by an older
client, or before one attribute was added) fails its workflow task at every
status change, over and over, while the worker looks healthy. The check
turns that into one message naming `durably setup`, before any run is taken.

Temporal Cloud does not open the operator service to namespace credentials.
There the missing attributes are found through visibility instead (a query
naming an attribute the namespace lacks is refused), and registered with
`tcld` or the Cloud UI: `registration_steps` says how.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import structlog
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from durably.contract import SEARCH_ATTRIBUTES
from durably.errors import SearchAttributesMissingError

__all__ = [
    "Survey",
    "check_on_start",
    "refused",
    "register_missing",
    "registration_steps",
    "setup_command",
    "survey",
    "survey_by_visibility",
]

_log = structlog.get_logger("durably.worker")

_KEYWORD = IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD
# What a server answers when these credentials may not use a service
# (Temporal Cloud, a self-hosted cluster's authorizer) or it has no such
# service (Temporal's time-skipping test server).
_REFUSALS = frozenset({RPCStatusCode.PERMISSION_DENIED, RPCStatusCode.UNIMPLEMENTED})
_PROBE_VALUE = "durably-search-attribute-probe"


@dataclass(frozen=True)
class Survey:
    """Which of durably's search attributes `namespace` lacks.

    `mistyped` maps an attribute registered with another type than Keyword
    to that type. `listed` is False when the operator service refused and
    visibility queries found the missing ones (they cannot see types).
    """

    namespace: str
    missing: tuple[str, ...]
    mistyped: dict[str, str] = field(default_factory=dict)
    listed: bool = True

    @property
    def complete(self) -> bool:
        return not self.missing and not self.mistyped


def refused(err: RPCError) -> bool:
    """Whether the server refuses these credentials the service, or has none."""
    return err.status in _REFUSALS


async def survey(client: Client) -> Survey | None:
    """What `client`'s namespace holds of durably's search attributes.

    Asks the operator service, else (refused) visibility; None when neither
    tells. Any other error (an unknown namespace, an unreachable server)
    raises `RPCError`.
    """
    try:
        return await _listed(client)
    except RPCError as err:
        if not refused(err):
            raise
    return await survey_by_visibility(client)


async def register_missing(client: Client) -> Survey:
    """Register (as Keyword) every durably search attribute the namespace lacks.

    Returns what the namespace held before. Raises `RPCError` when the
    operator service refuses (`refused(err)`: Temporal Cloud) or fails.
    """
    before = await _listed(client)
    if before.missing:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(
                namespace=client.namespace,
                search_attributes=dict.fromkeys(before.missing, _KEYWORD),
            )
        )
    return before


async def check_on_start(client: Client) -> None:
    """Stop a worker whose namespace lacks durably's search attributes.

    Raises `SearchAttributesMissingError` naming them and `durably setup`.
    When the server will not say (credentials without operator or
    visibility rights), logs a warning and lets the worker start; an
    unknown namespace is left to the worker, which reports it.
    """
    try:
        found = await survey(client)
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND:
            _log.warning(
                "could not check durably's search attributes",
                namespace=client.namespace,
                error=err.message,
            )
        return
    if found is None:
        _log.warning(
            "could not check durably's search attributes: the server refused these "
            "credentials both the operator service and visibility queries; make sure "
            f"{_names()} exist on the namespace (`durably setup` checks and says how)",
            namespace=client.namespace,
        )
        return
    if found.complete:
        return
    problems = []
    if found.missing:
        problems.append(f"lacks durably's search attributes {', '.join(found.missing)}")
    problems += [
        f"has {name} registered as {kind}, where durably needs Keyword"
        for name, kind in found.mistyped.items()
    ]
    raise SearchAttributesMissingError(
        f"namespace {client.namespace!r} {'; it '.join(problems)}, so runs could not record "
        f"their status. Run `{setup_command(client)}` (connecting as this worker does, e.g. "
        "with the same --profile), then start the worker again; on Temporal Cloud it prints "
        "the tcld or Cloud UI steps."
    )


def setup_command(client: Client) -> str:
    """`durably setup` with the address and namespace `client` connects to."""
    target = client.service_client.config.target_host
    return f"durably setup --target {target} --namespace {client.namespace}"


def registration_steps(namespace: str, names: Sequence[str]) -> list[str]:
    """How to register `names` where this connection may not: Cloud's steps, then others'."""
    sas = " ".join(f'--sa "{name}=Keyword"' for name in names)
    creates = " ".join(f"--name {name} --type Keyword" for name in names)
    return [
        "On Temporal Cloud, register them with tcld (or ask an account admin to):",
        f"  tcld namespace search-attributes add --namespace {namespace} {sas}",
        f"or in the Cloud UI: Namespaces > {namespace} > Edit > Custom Search Attributes, "
        f"add {', '.join(names)}, each of type Keyword, and save.",
        "On a self-hosted cluster, run `durably setup` with credentials that may use the "
        "operator service, or have an operator run:",
        f"  temporal operator search-attribute create --namespace {namespace} {creates}",
    ]


async def _listed(client: Client) -> Survey:
    listed = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=client.namespace)
    )
    registered = dict(listed.custom_attributes)
    return Survey(
        client.namespace,
        missing=tuple(k.name for k in SEARCH_ATTRIBUTES if k.name not in registered),
        mistyped={
            k.name: _type_name(registered[k.name])
            for k in SEARCH_ATTRIBUTES
            if registered.get(k.name, _KEYWORD) != _KEYWORD
        },
    )


async def survey_by_visibility(client: Client) -> Survey | None:
    """One visibility query per attribute: the server refuses one naming an unknown one."""
    missing = []
    for key in SEARCH_ATTRIBUTES:
        try:
            await client.count_workflows(f'{key.name} = "{_PROBE_VALUE}"')
        except RPCError as err:
            if refused(err):
                return None
            if err.status == RPCStatusCode.INVALID_ARGUMENT and key.name in err.message:
                missing.append(key.name)
                continue
            raise
    return Survey(client.namespace, missing=tuple(missing), listed=False)


def _type_name(value: int) -> str:
    """`INDEXED_VALUE_TYPE_KEYWORD_LIST` as `KeywordList`."""
    name = IndexedValueType.Name(value).removeprefix("INDEXED_VALUE_TYPE_")  # type: ignore[arg-type]
    return "".join(part.capitalize() for part in name.split("_"))


def _names() -> str:
    return ", ".join(k.name for k in SEARCH_ATTRIBUTES)
