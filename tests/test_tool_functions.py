"""Tools as plain typed functions: schemas from signatures, calls with named arguments.

The schemas are written out literally: they feed the registration
fingerprint, so a change in how they are generated (a pydantic upgrade, a
change here) must show up as a failing test, not as workers that no longer
agree on a fingerprint.
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any, Literal, Optional

import pytest
import structlog
from pydantic import BaseModel, Field, ValidationError

from durably import (
    Agent,
    AgentRegistration,
    DurableClient,
    RegistrationError,
    ScriptedModel,
    Tool,
    ToolContext,
    tool,
)
from durably.messages import AssistantMessage, ModelRequest
from durably.models import last_tool_results, tool_call

from .conftest import Runtimes


class Address(BaseModel):
    street: str
    city: str = "Paris"


class Refund(BaseModel):
    refund_id: str
    amount_cents: int


class Order(BaseModel):
    order_id: str


@tool
async def refund(
    ctx: ToolContext,
    order_id: str,
    amount_cents: int = 0,
    reason: Optional[str] = None,  # noqa: UP045
) -> Refund:
    """Refund an order, in full or in part.

    Only orders paid by card can be refunded.

    Args:
        order_id: The order to refund, e.g. "A-1".
        amount_cents: How much to refund, in cents;
            0 refunds the whole order.
        reason (str): Why, in the customer's words.

    Returns:
        The refund.
    """
    return Refund(refund_id=f"R-{order_id}", amount_cents=amount_cents)


@tool
async def ship(
    to: Address,
    items: list[str],
    speed: Literal["standard", "express"] = "standard",
    weight_kg: float = 1.5,
    gift: bool = False,
    note: str | None = None,
) -> str:
    """Ship items to an address."""
    return f"{len(items)} item(s) to {to.city}"


@tool
async def now() -> str:
    """The current time."""
    return "12:00"


@tool
async def look_up(args: Order, ctx: ToolContext) -> Refund:
    """Look up an order's refund."""
    return Refund(refund_id="R-1", amount_cents=0)


def context() -> ToolContext:
    return ToolContext(
        operation_id="run/first/tool:1:c1",
        run_id="run",
        agent_id="shop",
        agent_version="1",
        attempt=1,
        abort_signal=asyncio.Event(),
        logger=structlog.get_logger(),
        _heartbeat=lambda *details: None,
    )


async def call(t: Tool[Any], arguments: dict[str, Any]) -> Any:
    """Run a tool as the tool activity does: validate, then `execute(args, ctx)`."""
    return await t.execute(t.input_model.model_validate(arguments), context())


class TestPinnedSchemas:
    def test_plain_function_schema_has_docstring_descriptions_and_no_titles(self) -> None:
        assert refund.description == (
            "Refund an order, in full or in part.\n\nOnly orders paid by card can be refunded."
        )
        assert refund.input_schema == {
            "properties": {
                "order_id": {"description": 'The order to refund, e.g. "A-1".', "type": "string"},
                "amount_cents": {
                    "default": 0,
                    "description": "How much to refund, in cents; 0 refunds the whole order.",
                    "type": "integer",
                },
                "reason": {
                    "anyOf": [{"type": "string"}, {"type": "null"}],
                    "default": None,
                    "description": "Why, in the customer's words.",
                },
            },
            "required": ["order_id"],
            "type": "object",
        }
        assert refund.output_model is Refund

    def test_plain_function_schema_with_a_nested_model_literal_list_and_defaults(self) -> None:
        assert ship.description == "Ship items to an address."
        assert ship.input_schema == {
            "$defs": {
                "Address": {
                    "properties": {
                        "street": {"title": "Street", "type": "string"},
                        "city": {"default": "Paris", "title": "City", "type": "string"},
                    },
                    "required": ["street"],
                    "title": "Address",
                    "type": "object",
                }
            },
            "properties": {
                "to": {"$ref": "#/$defs/Address"},
                "items": {"items": {"type": "string"}, "type": "array"},
                "speed": {
                    "default": "standard",
                    "enum": ["standard", "express"],
                    "type": "string",
                },
                "weight_kg": {"default": 1.5, "type": "number"},
                "gift": {"default": False, "type": "boolean"},
                "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
            },
            "required": ["to", "items"],
            "type": "object",
        }
        assert list(ship.input_schema["properties"]) == [
            "to",
            "items",
            "speed",
            "weight_kg",
            "gift",
            "note",
        ]
        assert ship.output_model is None

    def test_a_function_without_arguments_has_an_empty_object_schema(self) -> None:
        assert now.input_schema == {"properties": {}, "type": "object"}

    def test_model_form_schema_is_what_pydantic_writes_titles_included(self) -> None:
        """The model form is unchanged, so fingerprints pinned before the plain form hold."""
        assert look_up.input_schema == Order.model_json_schema()
        assert look_up.input_schema == {
            "properties": {"order_id": {"title": "Order Id", "type": "string"}},
            "required": ["order_id"],
            "title": "Order",
            "type": "object",
        }
        assert look_up.description == "Look up an order's refund."

    def test_registration_fingerprint_of_plain_function_tools_is_pinned(self) -> None:
        agent = Agent(
            id="shop",
            model=ScriptedModel(["ok"]),
            instructions="Help customers.",
            tools=[refund, ship, now, look_up],
        )
        registration = AgentRegistration(agent, version="1")
        assert registration.fingerprint == "155db4ba15b54de0475aeca87eb37567"


class TestForms:
    def test_a_lone_model_parameter_is_the_model_form_wherever_the_context_is(self) -> None:
        @tool
        async def first(ctx: ToolContext, args: Order) -> str:
            """First."""
            return args.order_id

        @tool
        async def alone(args: Order) -> str:
            """Alone."""
            return args.order_id

        assert first.input_model is Order
        assert alone.input_model is Order

    async def test_model_form_with_an_unannotated_context_is_called_as_before(self) -> None:
        async def legacy(args: Order, ctx) -> str:  # type: ignore[no-untyped-def]
            """Legacy."""
            return f"{args.order_id} {ctx.operation_id}"

        t = tool(legacy)
        assert t.input_model is Order
        assert t.execute is legacy
        assert await call(t, {"order_id": "A-1"}) == "A-1 run/first/tool:1:c1"

    def test_a_model_parameter_beside_others_is_a_nested_argument(self) -> None:
        @tool
        async def gift(order: Order, message: str) -> str:
            """Gift."""
            return message

        assert gift.input_schema["properties"] == {
            "order": {"$ref": "#/$defs/Order"},
            "message": {"type": "string"},
        }

    def test_context_may_be_optional_and_is_never_in_the_schema(self) -> None:
        @tool
        async def count(n: int, ctx: ToolContext | None = None) -> str:
            """Count."""
            return str(n)

        assert count.input_schema == {
            "properties": {"n": {"type": "integer"}},
            "required": ["n"],
            "type": "object",
        }


class TestDocstrings:
    def test_sections_after_args_are_left_out_of_the_description(self) -> None:
        @tool
        async def pay(amount: int) -> str:
            """Pay.

            Args:
                amount: In cents.

            Raises:
                ToolError: When the card is refused.

            Examples:
                pay(100)
            """
            return ""

        assert pay.description == "Pay."
        assert pay.input_schema["properties"]["amount"] == {
            "description": "In cents.",
            "type": "integer",
        }

    def test_a_description_set_on_the_field_wins_over_the_docstring(self) -> None:
        @tool
        async def pay(
            amount: Annotated[int, Field(ge=1, description="Cents, at least 1.")],
            note: str = Field("", description="Shown on the receipt."),
        ) -> str:
            """Pay.

            Args:
                amount: In cents.
                note: A note.
            """
            return ""

        assert pay.input_schema["properties"] == {
            "amount": {"description": "Cents, at least 1.", "minimum": 1, "type": "integer"},
            "note": {"default": "", "description": "Shown on the receipt.", "type": "string"},
        }

    def test_documenting_the_context_is_allowed(self) -> None:
        @tool
        async def pay(ctx: ToolContext, amount: int) -> str:
            """Pay.

            Args:
                ctx: The call's context.
                amount: In cents.
            """
            return ""

        assert list(pay.input_schema["properties"]) == ["amount"]

    def test_an_args_entry_naming_no_parameter_is_rejected(self) -> None:
        with pytest.raises(RegistrationError, match=r"describes \['amout'\], which the function"):

            @tool
            async def pay(amount: int) -> str:
                """Pay.

                Args:
                    amout: In cents.
                """
                return ""

    def test_an_unreadable_args_entry_is_rejected(self) -> None:
        with pytest.raises(RegistrationError, match="write each parameter as `name: description`"):

            @tool
            async def pay(amount: int) -> str:
                """Pay.

                Args:
                    amount -- in cents
                """
                return ""


class TestRejectedSignatures:
    def test_unannotated_parameter(self) -> None:
        with pytest.raises(RegistrationError, match="annotate parameter 'amount' with its type"):

            @tool
            async def pay(ctx: ToolContext, amount) -> str:  # type: ignore[no-untyped-def]
                return ""

    def test_var_positional_and_var_keyword(self) -> None:
        with pytest.raises(RegistrationError, match=r"`\*ids` cannot be described to a model"):

            @tool
            async def pay(*ids: str) -> str:
                return ""

        with pytest.raises(RegistrationError, match=r"`\*orders` cannot be described"):

            @tool
            async def many(*orders: Order) -> str:
                return ""

        with pytest.raises(RegistrationError, match=r"`\*\*extra` cannot be described"):

            @tool
            async def refund(order_id: str, **extra: str) -> str:
                return ""

    def test_positional_only_parameter(self) -> None:
        with pytest.raises(RegistrationError, match="'order_id' is positional-only"):

            @tool
            async def pay(order_id: str, /, amount: int) -> str:
                return ""

    def test_names_pydantic_reserves(self) -> None:
        async def dump(json: str) -> str:
            return json

        async def describe(schema: str) -> str:
            return schema

        async def pick(model_id: str) -> str:
            return model_id

        for fn, name in ((dump, "json"), (describe, "schema"), (pick, "model_id")):
            with pytest.raises(RegistrationError, match=f"'{name}' clashes with a pydantic"):
                tool(fn)
        with pytest.raises(RegistrationError, match="starts with '_'"):

            @tool
            async def pay(_amount: int) -> str:
                return ""

    def test_two_context_parameters(self) -> None:
        with pytest.raises(RegistrationError, match="all annotated ToolContext; keep one"):

            @tool
            async def pay(a: ToolContext, b: ToolContext) -> str:
                return ""

    def test_an_annotation_that_cannot_be_resolved(self) -> None:
        with pytest.raises(RegistrationError, match="cannot resolve its annotations"):

            @tool
            async def pay(amount: Money) -> str:  # type: ignore[name-defined]  # noqa: F821
                return ""

    def test_a_type_without_a_json_schema(self) -> None:
        with pytest.raises(RegistrationError, match="cannot become a JSON schema"):

            @tool
            async def wait(event: asyncio.Event) -> str:
                return ""

    def test_sync_functions_are_still_rejected(self) -> None:
        def pay(amount: int) -> str:
            return ""

        with pytest.raises(TypeError, match="tools must be `async def`"):
            tool(pay)  # type: ignore[arg-type]


class TestCalls:
    async def test_arguments_reach_parameters_by_name_and_defaults_apply(self) -> None:
        seen: dict[str, Any] = {}

        @tool
        async def pay(
            order_id: str, ctx: ToolContext, amount: int = 5, to: Address | None = None
        ) -> str:
            seen.update(order_id=order_id, amount=amount, to=to, op=ctx.operation_id)
            return "paid"

        assert await call(pay, {"order_id": "A-1", "to": {"street": "Rue 1"}}) == "paid"
        assert seen == {
            "order_id": "A-1",
            "amount": 5,
            "to": Address(street="Rue 1"),
            "op": "run/first/tool:1:c1",
        }

    async def test_a_positional_only_context_is_passed_by_position(self) -> None:
        @tool
        async def pay(ctx: ToolContext, /, amount: int) -> str:
            return f"{ctx.attempt}:{amount}"

        assert await call(pay, {"amount": 3}) == "1:3"

    def test_a_bad_argument_type_fails_validation_before_the_function_runs(self) -> None:
        with pytest.raises(ValidationError) as err:
            refund.input_model.model_validate({"order_id": "A-1", "amount_cents": "lots"})
        assert [e["loc"] for e in err.value.errors()] == [("amount_cents",)]

    async def test_a_plain_str_result_is_sent_as_its_text(self) -> None:
        value = await call(ship, {"to": {"street": "Rue 1"}, "items": ["a", "b"]})
        assert value == "2 item(s) to Paris"
        assert ship.validate_output(value) == "2 item(s) to Paris"


def echo_results(request: ModelRequest) -> AssistantMessage:
    return AssistantMessage(
        content=json.dumps(
            [{"error": r.is_error, "content": r.content} for r in last_tool_results(request)]
        )
    )


class TestEndToEnd:
    async def test_a_plain_function_tool_runs_in_a_worker_with_the_models_arguments(
        self, client: DurableClient, runtimes: Runtimes
    ) -> None:
        """Named arguments and defaults reach the function; a bad type reaches the model."""
        calls: list[tuple[str, int, str]] = []

        @tool
        async def refund_order(ctx: ToolContext, order_id: str, amount_cents: int = 0) -> str:
            """Refund an order.

            Args:
                order_id: The order.
                amount_cents: How much; 0 is everything.
            """
            calls.append((order_id, amount_cents, ctx.agent_id))
            return f"refunded {amount_cents or 'all'} of {order_id}"

        agent = Agent(
            id="refunds",
            model=ScriptedModel(
                [
                    [
                        tool_call("refund_order", call_id="a", order_id="A-1"),
                        tool_call("refund_order", call_id="b", order_id="A-2", amount_cents="x"),
                    ],
                    echo_results,
                ]
            ),
            instructions="Refund orders.",
            tools=[refund_order],
        )
        await runtimes.start([AgentRegistration(agent, version="1")])
        run = await client.start_run("refunds", "refund A-1 and A-2")
        seen = json.loads((await run.result()).output or "")

        assert calls == [("A-1", 0, "refunds")]
        assert seen[0] == {"error": False, "content": "refunded all of A-1"}
        assert seen[1]["error"] is True
        assert seen[1]["content"].startswith(
            "invalid arguments for 'refund_order': amount_cents: Input should be a valid integer"
        )


def test_one_model_described_as_one_argument_is_refused_saying_which_form_it_is() -> None:
    """`(ctx, to: Address)` is the model form: the schema is Address's fields, so a
    docstring describing `to` as one argument would mislead the model."""

    with pytest.raises(RegistrationError, match="takes one pydantic model, 'to'"):

        @tool
        async def send(ctx: ToolContext, to: Address) -> str:
            """Send a parcel.

            Args:
                to: Where it goes.
            """
            return "sent"
