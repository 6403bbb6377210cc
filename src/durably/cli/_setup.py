"""`durably setup`: prepare a namespace for durably's runs.

Registers durably's search attributes (`durably.contract.SEARCH_ATTRIBUTES`)
through the operator service; running it again changes nothing. Where the
operator service is closed to these credentials (Temporal Cloud), it finds
which attributes are missing through visibility and prints the `tcld` and
Cloud UI steps that register exactly those.
"""

from __future__ import annotations

from rich.text import Text
from temporalio.client import Client
from temporalio.service import RPCError

from durably._search_attributes import (
    Survey,
    refused,
    register_missing,
    registration_steps,
    survey,
)
from durably.cli._connection import Connection, command
from durably.cli._terminal import console, safe
from durably.contract import SEARCH_ATTRIBUTES
from durably.errors import DurablyError, SearchAttributesMissingError


@command
async def setup(*, conn: Connection) -> None:
    """Register durably's search attributes on the namespace (safe to run again).

    Needs credentials that may use Temporal's operator service. On Temporal
    Cloud, which registers search attributes only through tcld or its UI, it
    prints those steps for the attributes still missing.
    """
    client = (await conn.client()).temporal
    namespace = client.namespace
    try:
        before = await register_missing(client)
    except RPCError as err:
        if not refused(err):
            raise DurablyError(
                f"cannot register durably's search attributes on namespace {namespace!r}: "
                f"{err.message}"
            ) from err
        await _without_operator(client, err)
        return
    present = [k.name for k in SEARCH_ATTRIBUTES if k.name not in before.missing]
    if before.missing:
        console.print(
            safe(f"Registered {', '.join(before.missing)} (Keyword) on namespace {namespace!r}.")
        )
    if present:
        console.print(safe(f"Already registered on namespace {namespace!r}: {', '.join(present)}."))
    _refuse_mistyped(before)
    console.print(Text("The namespace is ready for durably's workers.", style="green"))


async def _without_operator(client: Client, err: RPCError) -> None:
    """The operator service refused: say what is missing and how to register it."""
    namespace = client.namespace
    found = await survey(client)
    if found is not None and found.complete:
        console.print(
            safe(
                f"durably's search attributes are all registered on namespace {namespace!r} "
                "(checked through visibility: these credentials may not use the operator "
                "service)."
            )
        )
        return
    if found is not None:
        _refuse_mistyped(found)
        missing = list(found.missing)
        known = f"Namespace {namespace!r} lacks {', '.join(missing)}."
    else:
        missing = [k.name for k in SEARCH_ATTRIBUTES]
        known = (
            f"Could not tell which of {', '.join(missing)} namespace {namespace!r} already "
            "has (tcld refuses ones it has: leave those out)."
        )
    console.print(
        safe(
            "The server refused to register search attributes with these credentials "
            f"({err.message}). {known}"
        )
    )
    for line in registration_steps(namespace, missing):
        console.print(safe(line))
    raise SearchAttributesMissingError(
        f"durably's search attributes are not all registered on namespace {namespace!r}; "
        "follow the steps above, then run `durably setup` again to check."
    )


def _refuse_mistyped(found: Survey) -> None:
    if found.mistyped:
        wrong = ", ".join(f"{name} is {kind}" for name, kind in found.mistyped.items())
        raise SearchAttributesMissingError(
            f"on namespace {found.namespace!r}, {wrong}, where durably needs Keyword. A "
            "search attribute's type cannot change: remove it (`temporal operator "
            "search-attribute remove`; on Temporal Cloud, through support), then run "
            "`durably setup` again."
        )
