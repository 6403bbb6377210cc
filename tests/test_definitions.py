"""Definitions are checked when they are made, with messages that say what to do."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

import durably
from durably import (
    Agent,
    AgentRegistration,
    AgentRegistry,
    ModelRetry,
    RegistrationError,
    ScriptedModel,
    ToolContext,
    tool,
)


class Query(BaseModel):
    q: str


class Hits(BaseModel):
    hits: list[str]


@tool
async def search_kb(args: Query, ctx: ToolContext) -> Hits:
    """Search the knowledge base."""
    return Hits(hits=[])


def agent(instructions: str = "Help.") -> Agent:
    return Agent(
        id="support", model=ScriptedModel(["ok"]), instructions=instructions, tools=[search_kb]
    )


class TestTool:
    def test_tool_takes_name_description_and_schemas_from_the_function(self) -> None:
        assert search_kb.name == "search_kb"
        assert search_kb.description == "Search the knowledge base."
        assert search_kb.input_schema["properties"] == {"q": {"title": "Q", "type": "string"}}
        assert search_kb.output_model is Hits

    def test_tool_with_an_unannotated_parameter_is_rejected_with_what_to_change(self) -> None:
        with pytest.raises(RegistrationError, match="annotate parameter 'args' with its type"):

            @tool
            async def bad(args, ctx: ToolContext) -> str:  # type: ignore[no-untyped-def]
                return ""

    def test_sync_tool_is_rejected(self) -> None:
        def sync(args: Query, ctx: ToolContext) -> str:
            return ""

        with pytest.raises(TypeError, match="tools must be `async def`"):
            tool(sync)  # type: ignore[arg-type]

    def test_tool_names_providers_would_reject_are_rejected_when_defined(self) -> None:
        async def run(args: Query, ctx: ToolContext) -> str:
            """Run."""
            return ""

        assert tool(name="search_kb-2")(run).name == "search_kb-2"
        for name in ("héllo", "x²", "two words", "a" * 65):
            with pytest.raises(ValueError, match="1 to 64 ASCII letters, digits"):
                tool(name=name)(run)


class TestAgentRegistration:
    def test_tool_recovery_naming_a_missing_tool_is_a_registration_error(self) -> None:
        with pytest.raises(
            RegistrationError,
            match=r"tool_recovery names \['create_ticket'\], which the agent does not have",
        ):
            AgentRegistration(agent(), version="1", tool_recovery={"create_ticket": "idempotent"})

    def test_unknown_policy_is_rejected(self) -> None:
        with pytest.raises(RegistrationError, match="unknown recovery policy"):
            AgentRegistration(agent(), version="1", tool_recovery={"search_kb": "sometimes"})  # type: ignore[dict-item]

    def test_tools_not_named_are_manual_with_one_attempt(self) -> None:
        pin = AgentRegistration(agent(), version="1").pin()
        assert pin.tools["search_kb"].recovery == "manual"
        assert pin.tools["search_kb"].retry.max_attempts == 1
        assert pin.tools["search_kb"].heartbeat_timeout_s == 10

    def test_fingerprint_changes_with_instructions_and_policies_only(self) -> None:
        base = AgentRegistration(agent(), version="1")
        assert base.fingerprint == AgentRegistration(agent(), version="1").fingerprint
        assert base.fingerprint != AgentRegistration(agent("Be terse."), version="1").fingerprint
        safe = AgentRegistration(agent(), version="1", tool_recovery={"search_kb": "safe"})
        assert base.fingerprint != safe.fingerprint
        retry = AgentRegistration(agent(), version="1", model_retry=ModelRetry(max_attempts=3))
        assert base.fingerprint != retry.fingerprint

    def test_a_model_identity_that_is_not_plain_json_is_a_registration_error(self) -> None:
        """str() of a set or an object can differ between workers; the fingerprint must not."""
        from durably import OpenAIChatModel

        model = OpenAIChatModel("gpt-4o-mini", api_key="k", extra_body={"tags": {"a", "b"}})
        odd = Agent(id="odd", model=model, instructions="", tools=[])
        with pytest.raises(RegistrationError, match="identity must be plain JSON"):
            AgentRegistration(odd, version="1")

    def test_model_retry_needs_a_positive_attempt_count(self) -> None:
        with pytest.raises(RegistrationError, match="max_attempts must be at least 1"):
            ModelRetry(max_attempts=0)

    def test_duplicate_tool_names_are_rejected(self) -> None:
        with pytest.raises(RegistrationError, match=r"several tools named \['search_kb'\]"):
            Agent(
                id="a", model=ScriptedModel(["ok"]), instructions="", tools=[search_kb, search_kb]
            )


class TestRegistry:
    def test_a_batch_with_one_bad_entry_registers_nothing(self) -> None:
        registry = AgentRegistry()
        good = AgentRegistration(agent(), version="1")
        with pytest.raises(RegistrationError, match="nothing was registered"):
            registry.register([good, good])
        assert registry.all() == []

    def test_a_registered_version_is_never_replaced(self) -> None:
        registry = AgentRegistry([AgentRegistration(agent(), version="1")])
        with pytest.raises(RegistrationError, match="registrations are never replaced"):
            registry.register([AgentRegistration(agent("changed"), version="1")])
        found = registry.get("support", "1")
        assert found is not None and found.agent.instructions == "Help."

    def test_newest_version_wins_in_natural_order(self) -> None:
        registry = AgentRegistry([AgentRegistration(agent(), version=v) for v in ("2", "10", "9")])
        newest = registry.get("support")
        assert newest is not None and newest.version == "10"


def test_public_api_matches_the_spec() -> None:
    """Every name SPEC.md section 2 and 12 promise is exported and importable."""
    promised = {
        "tool",
        "Tool",
        "ToolContext",
        "ToolError",
        "Agent",
        "AgentRegistration",
        "ModelRetry",
        "Model",
        "FunctionModel",
        "ScriptedModel",
        "DurableClient",
        "DurableRuntime",
        "RunHandle",
        "RunSnapshot",
        "DurablyPlugin",
        "DurablyError",
        "RegistrationError",
        "DurableConflictError",
        "InteractionConflictError",
        "InvalidResponseError",
        "RunFailedError",
        "RunCancelledError",
        "RunClosedError",
        "RunNotFoundError",
        # The typed operator API: what a snapshot holds, what a person or operator sends.
        "Interaction",
        "ToolInterrupted",
        "VersionMissing",
        "VersionIncompatible",
        "OtherAttention",
        "Approval",
        "Denial",
        "Answer",
        "JsonResolution",
        "ErrorResolution",
        "RerunResolution",
        "tool_call",
        "final",
    }
    assert promised <= set(durably.__all__)
    assert sorted(durably.__all__) == sorted(durably._EXPORTS)  # every export is importable
    for name in durably.__all__:
        assert getattr(durably, name) is not None
