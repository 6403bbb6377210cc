"""Which Temporal cluster a command talks to, declared once for every command.

`--target`, `--namespace` and `--profile` are options of the app itself
(`connection_options`, its callback) *and* of every command that connects, so
both spellings work::

    durably --target host:7233 approve RUN --as alice
    durably approve RUN --as alice --target host:7233     # scripts and the README

Commands never declare them: an `async def` command that takes a `Connection`
parameter is made a Typer command by `command`, which puts the options in
that parameter's place and passes the `Connection` they name (the command's own
options win over the app's). Unset, they default to `TEMPORAL_ADDRESS` /
`TEMPORAL_NAMESPACE` and the Temporal config file's profile (`--profile`, else
`$TEMPORAL_PROFILE`, else `default`: address, namespace, TLS, API key), else
`localhost:7233` and `default` (`DurableClient.connect` decides).

Every command that connects encrypts with the keys in `DURABLY_ENCRYPTION_KEYS`
(or the file `DURABLY_ENCRYPTION_KEYS_FILE` names, see `durably.codec`), so it
reads and answers encrypted runs. Without keys, an encrypted payload it reads
fails with a message naming the payload's key and the variable to set.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Annotated, Any

import typer
from temporalio.client import Client

from durably.cli._terminal import run
from durably.client import DurableClient, RunHandle
from durably.codec import EncryptionCodec, KeylessCodec
from durably.contract import DEFAULT_TASK_QUEUE

Target = Annotated[
    str | None,
    typer.Option(
        "--target",
        help="Temporal address host:port. Default: $TEMPORAL_ADDRESS, the Temporal config "
        "file, else localhost:7233.",
        show_default=False,
    ),
]
Namespace = Annotated[
    str | None,
    typer.Option(
        "--namespace",
        help="Temporal namespace. Default: $TEMPORAL_NAMESPACE, the config file, else default.",
        show_default=False,
    ),
]
Profile = Annotated[
    str | None,
    typer.Option(
        "--profile",
        help="Profile of the Temporal config file ($TEMPORAL_CONFIG_FILE, else "
        "temporalio/temporal.toml in your user config directory) to connect with: address, "
        "namespace, TLS, API key. Default: $TEMPORAL_PROFILE, else default.",
        show_default=False,
    ),
]
TaskQueue = Annotated[str, typer.Option("--task-queue", help="Task queue of durably's workers.")]
RunId = Annotated[str, typer.Argument(metavar="RUN", help="The run id.")]


@dataclass(frozen=True)
class Connection:
    """The cluster the command line names; None leaves the choice to the environment."""

    target: str | None = None
    namespace: str | None = None
    profile: str | None = None

    async def client(self, task_queue: str = DEFAULT_TASK_QUEUE) -> DurableClient:
        """A client of the cluster, with the encryption keys in the environment, if any.

        Without keys, an encrypted payload it reads fails with an
        `EncryptionKeyError` naming its key and the variable to set, instead of
        the payload converter's "Unknown payload encoding" traceback.
        """
        codec = EncryptionCodec.from_env()
        durable = await DurableClient.connect(
            self.target, self.namespace, task_queue, profile=self.profile, encryption=codec
        )
        if codec is not None:
            return durable
        config = durable.temporal.config()
        config["data_converter"] = dataclasses.replace(
            config["data_converter"], payload_codec=KeylessCodec()
        )
        return DurableClient(Client(**config), task_queue=task_queue)

    async def get_run(self, run_id: str) -> RunHandle:
        """The run named on the command line."""
        return await (await self.client()).get_run(run_id)


def connection_options(
    ctx: typer.Context, target: Target = None, namespace: Namespace = None, profile: Profile = None
) -> None:
    """The app's callback: keep the options given before the command for the command."""
    ctx.obj = Connection(target, namespace, profile)


def command(func: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """A Typer command that runs the coroutine function `func` (see `run`).

    If `func` takes a `Connection`, the command takes `--target`/`--namespace`/
    `--profile` instead, in that parameter's place, and `func` gets the connection they name
    (falling back to the ones given before the command).
    """
    signature = inspect.signature(func, eval_str=True)
    wanted = [p.name for p in signature.parameters.values() if p.annotation is Connection]
    if not wanted:

        @functools.wraps(func)
        def unconnected(**options: Any) -> None:
            run(func(**options))

        return unconnected
    (name,) = wanted

    # Takes what `connection_options` takes (see `_CONNECTION_PARAMS`), then func's options.
    def connected(
        ctx: typer.Context,
        target: str | None,
        namespace: str | None,
        profile: str | None,
        **options: Any,
    ) -> None:
        before = ctx.find_object(Connection) or Connection()
        conn = Connection(
            before.target if target is None else target,
            before.namespace if namespace is None else namespace,
            before.profile if profile is None else profile,
        )
        run(func(**options, **{name: conn}))

    functools.update_wrapper(connected, func)
    params: list[inspect.Parameter] = []
    for p in signature.parameters.values():
        params += _CONNECTION_PARAMS if p.name == name else [p]
    params = [p.replace(kind=p.KEYWORD_ONLY) for p in params]
    connected.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    connected.__annotations__ = {p.name: p.annotation for p in params}
    return connected


# What `connection_options` takes (its context, --target, --namespace, --profile), once more
# for every command that connects.
_CONNECTION_PARAMS = list(inspect.signature(connection_options, eval_str=True).parameters.values())
