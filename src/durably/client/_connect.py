"""Connecting to Temporal the way every Temporal tool does."""

from __future__ import annotations

from typing import Any

from temporalio.client import Client
from temporalio.envconfig import ClientConfig
from temporalio.runtime import Runtime

from durably._converter import durable_converter
from durably.codec import EncryptionCodec
from durably.errors import DurablyError

__all__ = ["connect_temporal"]

DEFAULT_TARGET = "localhost:7233"


async def connect_temporal(
    target: str | None = None,
    namespace: str | None = None,
    *,
    profile: str | None = None,
    encryption: EncryptionCodec | None = None,
    runtime: Runtime | None = None,
) -> Client:
    """A client from the arguments, else `TEMPORAL_*` variables and the config file.

    Arguments win over the environment, which wins over the config file
    (`temporalio.envconfig`); with nothing set, the local dev server.
    `profile` names the config file's profile (else `TEMPORAL_PROFILE`, else
    `default`). Payloads are converted by pydantic and, with `encryption`,
    encrypted. `runtime` is Temporal's (e.g. one serving metrics,
    `durably.telemetry.metrics_runtime`); by default the process's.
    """
    try:
        config: dict[str, Any] = dict(ClientConfig.load_client_connect_config(profile=profile))
    except RuntimeError as err:  # the SDK's ConfigError: an unreadable file, an unknown profile
        raise DurablyError(
            f"cannot read the Temporal config ({err}). Check the config file "
            "($TEMPORAL_CONFIG_FILE, else temporalio/temporal.toml in your user config "
            "directory) and the profile named by --profile or $TEMPORAL_PROFILE."
        ) from err
    if target:
        config["target_host"] = target
    if namespace:
        config["namespace"] = namespace
    config.setdefault("target_host", DEFAULT_TARGET)
    try:
        return await Client.connect(
            **config, data_converter=durable_converter(None, encryption), runtime=runtime
        )
    except RuntimeError as err:  # what the SDK raises when it cannot connect
        raise DurablyError(
            f"cannot connect to Temporal at {config['target_host']} ({err}). Start a local "
            "server with `durably dev`, or point --target (or TEMPORAL_ADDRESS, or your "
            "Temporal config profile) at your cluster."
        ) from err
