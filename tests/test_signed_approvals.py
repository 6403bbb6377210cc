"""Who may approve: a signed decision from an allowed approver, checked worker-side.

Temporal gives workflow code no caller identity that cannot be forged, so a
`responder` is whatever the caller typed. For tools with `approvers`, every
decision must carry a token signed by a key the worker holds; the run
records a decision only after the worker checked the token and the
allow-list, and the key never reaches history.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
from typing import Any, ClassVar

import pytest
from pydantic import BaseModel
from temporalio.testing import WorkflowEnvironment

from durably import (
    Agent,
    AgentRegistration,
    DurableClient,
    Interaction,
    InvalidResponseError,
    ModelRequest,
    RegistrationError,
    RunHandle,
    RunStatus,
    ScriptedModel,
    ToolContext,
    tool,
)
from durably.approvals import ENV_KEYS, ApprovalKeys
from durably.messages import AssistantMessage
from durably.models import last_tool_results, tool_call

from .conftest import Runtimes, binary, cli, record_history, wait_for_interaction

KEYS = ApprovalKeys({"k1": b"k" * 32})
OTHER_KEYS = ApprovalKeys({"k1": b"o" * 32})


class Payment(BaseModel):
    to: str
    cents: int


def _results(request: ModelRequest) -> AssistantMessage:
    return AssistantMessage(
        content=json.dumps([[r.is_error, r.content] for r in last_tool_results(request)])
    )


class Bank:
    def __init__(self) -> None:
        self.paid: list[str] = []

    def registration(self, **options: Any) -> AgentRegistration:
        bank = self

        @tool(requires_approval=True)
        async def pay(args: Payment, ctx: ToolContext) -> str:
            """Send money."""
            bank.paid.append(args.to)
            return f"paid {args.to}"

        agent = Agent(
            id="treasury",
            model=ScriptedModel([tool_call("pay", call_id="c1", to="bob", cents=5), _results]),
            instructions="",
            tools=[pay],
        )
        return AgentRegistration(agent, version="1", approvers={"pay": ["alice"]}, **options)


async def _waiting(
    client: DurableClient, runtimes: Runtimes, bank: Bank
) -> tuple[RunHandle, Interaction]:
    await runtimes.start([bank.registration()], approval_keys=KEYS)
    run = await client.start_run("treasury", "pay bob")
    snap = await wait_for_interaction(run, "approval:1:c1")
    assert snap.interaction is not None
    return run, snap.interaction


class TestSignedApprovals:
    async def test_an_allowed_approver_with_a_valid_token_approves_and_the_call_runs(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        bank = Bank()
        run, interaction = await _waiting(client, runtimes, bank)
        assert interaction.signed is True
        assert interaction.operation_id is not None
        assert interaction.operation_id.endswith("/tool:1:c1")

        response = KEYS.response(interaction, approved=True, approver="alice")
        accepted = await run.respond("approval:1:c1", response, responder="alice")

        assert accepted.approved is True
        result = await asyncio.wait_for(run.result(), 30)
        assert json.loads(result.output or "") == [[False, "paid bob"]]
        assert bank.paid == ["bob"]
        history = await client.temporal.get_workflow_handle(run.run_id).fetch_history()
        key_material = base64.b64encode(b"k" * 32)
        assert all(key_material not in e.SerializeToString() for e in history.events)
        await record_history(client, run.run_id, "completed_after_a_signed_approval")

    @pytest.mark.parametrize(
        "case",
        ["no token", "approver not allowed", "foreign key", "token for another decision"],
    )
    async def test_a_decision_without_a_valid_token_is_rejected_and_nothing_runs(
        self, client: DurableClient, runtimes: Runtimes, case: str
    ) -> None:
        bank = Bank()
        run, interaction = await _waiting(client, runtimes, bank)
        responder = "alice"
        response: dict[str, Any] = {"type": "tool-approval", "approved": True}
        if case == "approver not allowed":
            responder = "mallory"
            response = KEYS.response(interaction, approved=True, approver="mallory")
        elif case == "foreign key":
            response = OTHER_KEYS.response(interaction, approved=True, approver="alice")
        elif case == "token for another decision":  # alice denied; the token is replayed
            denied = KEYS.response(interaction, approved=False, approver="alice")
            response = {**denied, "approved": True}
        expected = {
            "no token": "needs a signed decision",
            "approver not allowed": "'mallory' may not decide on tool 'pay'",
            "foreign key": "does not match this decision",
            "token for another decision": "does not match this decision",
        }[case]

        with pytest.raises(InvalidResponseError, match=expected):
            await run.respond("approval:1:c1", response, responder=responder)

        snap = await wait_for_interaction(run, "approval:1:c1")  # still waiting
        assert [e.type for e in snap.events if e.type in ("approved", "denied")] == []
        assert bank.paid == []
        signed = KEYS.response(interaction, approved=False, approver="alice", reason="no")
        await run.respond("approval:1:c1", signed, responder="alice")
        result = await asyncio.wait_for(run.result(), 30)
        assert json.loads(result.output or "") == [[True, "denied: no"]]
        assert bank.paid == []

    async def test_a_forged_signal_is_recorded_as_rejected_and_the_run_keeps_waiting(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        bank = Bank()
        run, interaction = await _waiting(client, runtimes, bank)
        forged = OTHER_KEYS.response(interaction, approved=True, approver="alice")
        handle = client.temporal.get_workflow_handle(run.run_id)

        await handle.signal(
            "respond_signal",
            {"interaction_id": "approval:1:c1", "response": forged, "responder": "alice"},
        )

        async with asyncio.timeout(10):
            while True:
                snap = await run.snapshot()
                rejected = [e for e in snap.events if e.type == "response_rejected"]
                if rejected:
                    break
                await asyncio.sleep(0.05)
        assert "does not match this decision" in (rejected[0].detail or "")
        assert snap.status == RunStatus.WAITING and bank.paid == []
        good = KEYS.response(interaction, approved=True, approver="alice")
        await handle.signal(
            "respond_signal",
            {"interaction_id": "approval:1:c1", "response": good, "responder": "alice"},
        )
        await asyncio.wait_for(run.result(), 30)
        assert bank.paid == ["bob"]

    async def test_a_worker_without_keys_refuses_a_registration_that_names_approvers(
        self, client: DurableClient, runtimes: Runtimes, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.delenv("DURABLY_APPROVAL_KEYS", raising=False)
        monkeypatch.delenv("DURABLY_APPROVAL_KEYS_FILE", raising=False)
        with pytest.raises(RegistrationError, match="holds no approval keys"):
            await runtimes.start([Bank().registration()])


class TestApprovalKeys:
    INTERACTION: ClassVar[dict[str, Any]] = {
        "id": "approval:1:c1",
        "type": "tool-approval",
        "operation": "tool:1:c1",
        "tool": "pay",
        "args": {},
        "args_digest": "d" * 32,
        "operation_id": "run/first/tool:1:c1",
    }

    def test_keys_rotate_the_first_signs_and_every_key_verifies(self) -> None:
        old = ApprovalKeys({"2025": b"a" * 32})
        rotated = ApprovalKeys({"2026": b"b" * 32, "2025": b"a" * 32})
        interaction = self.INTERACTION
        token = old.sign(interaction, approved=True, approver="alice")

        assert rotated.signing_key_id == "2026"
        check = {
            "operation_id": "run/first/tool:1:c1",
            "interaction_id": "approval:1:c1",
            "args_digest": "d" * 32,
            "approved": True,
            "approver": "alice",
        }
        assert rotated.problem(token, **check) is None
        assert "does not hold" in (
            old.problem(rotated.sign(interaction, approved=True, approver="alice"), **check) or ""
        )
        assert rotated.problem(token, **{**check, "operation_id": "run/other/tool:1:c1"})

    def test_a_token_binds_the_reason_and_a_garbled_token_is_refused_not_raised(self) -> None:
        interaction = self.INTERACTION
        token = KEYS.sign(interaction, approved=False, approver="alice", reason="over budget")
        check = {
            "operation_id": "run/first/tool:1:c1",
            "interaction_id": "approval:1:c1",
            "args_digest": "d" * 32,
            "approved": False,
            "approver": "alice",
        }

        assert KEYS.problem(token, **check, reason="over budget") is None
        assert KEYS.problem(token, **check, reason="fine, pay it twice")  # the model reads it
        assert "not a durably approval token" in (KEYS.problem("v1.k1.é", **check) or "")

    def test_keys_come_from_the_environment_and_never_show_in_repr(self) -> None:
        material = ApprovalKeys.generate_key()
        keys = ApprovalKeys.from_env({"DURABLY_APPROVAL_KEYS": f"k1:{material}"})

        assert keys is not None and material not in repr(keys)
        assert ApprovalKeys.from_env({}) is None
        with pytest.raises(Exception, match="at least 32 random bytes"):
            ApprovalKeys.parse("k1:" + base64.b64encode(b"short").decode())


class TestCli:
    async def test_durably_approve_signs_with_the_key_in_its_environment(
        self, env: WorkflowEnvironment, client: DurableClient, runtimes: Runtimes
    ) -> None:
        bank = Bank()
        run, _ = await _waiting(client, runtimes, bank)
        target = env.client.service_client.config.target_host
        approve = ("approve", run.run_id, "--as", "alice", "--target", target)
        without_key = {k: v for k, v in os.environ.items() if not k.startswith("DURABLY_APPROVAL")}

        refused = await cli(binary("durably"), *approve, env=without_key)
        assert refused.returncode == 1 and "takes only signed decisions" in refused.stderr
        assert bank.paid == []

        key = base64.b64encode(b"k" * 32).decode()
        done = await cli(binary("durably"), *approve, env={**without_key, ENV_KEYS: f"k1:{key}"})

        assert done.returncode == 0, done.stderr
        await asyncio.wait_for(run.result(), 30)
        assert bank.paid == ["bob"]

    async def test_durably_approval_key_prints_a_key_workers_accept(self) -> None:
        done = await cli(binary("durably"), "approval-key", "--id", "2026-12")

        assert done.returncode == 0, done.stderr
        keys = ApprovalKeys.parse(done.stdout.strip())
        assert keys.signing_key_id == "2026-12"
