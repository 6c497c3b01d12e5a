"""A whole work order run by an OpenAI Agents SDK agent through the AWL gateway.

    .venv/bin/python examples/openai_agents_agent.py [--home DIR] [--manager auto|none]

The agent's MCP server is the gateway for the order (``awl.integrations.openai_agents``):
its reads pass through to ``examples/outbox_server.py``, its email is held. The report is
drafted from the call log, the manager approves, and the commit sends the email once.

With ``OPENAI_API_KEY`` set it runs a real model (``AWL_EXAMPLE_MODEL``, default
``gpt-5-mini``); without one, a scripted ``agents.models.interface.Model`` follows the
script in ``examples/agent_order.py`` and tracing is off, so it runs here with no network.
See that file for the options and exit codes.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator, Mapping
from typing import Any

from agent_order import INSTRUCTIONS, FinalStep, Setting, main, scripted_step
from agents import Agent, Runner, set_tracing_disabled
from agents.items import ModelResponse, TResponseInputItem, TResponseStreamEvent
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from awl.integrations import Attempt
from awl.integrations.openai_agents import gateway_server


class ScriptedModel(Model):
    """An Agents SDK model that follows the shared script instead of calling an API."""

    def __init__(self, rework_reason: str | None) -> None:
        self.rework_reason = rework_reason
        self.turn = 0

    async def get_response(self, system_instructions: str | None,
                           input: str | list[TResponseInputItem], *args: Any,
                           **kwargs: Any) -> ModelResponse:
        items: list[Any] = [] if isinstance(input, str) else list(input)
        names = {item.get("call_id"): item.get("name") for item in items
                 if isinstance(item, Mapping) and item.get("type") == "function_call"}
        results = [(str(names.get(item.get("call_id"))), str(item.get("output")))
                   for item in items
                   if isinstance(item, Mapping) and item.get("type") == "function_call_output"]
        step = scripted_step(results, self.rework_reason)
        self.turn += 1
        if isinstance(step, FinalStep):
            output: Any = ResponseOutputMessage(
                id=f"msg_{self.turn}", type="message", role="assistant", status="completed",
                content=[ResponseOutputText(type="output_text", text=step.text,
                                            annotations=[])])
        else:
            output = ResponseFunctionToolCall(
                id=f"fc_{self.turn}", call_id=f"call_{self.turn}", type="function_call",
                name=step.name, arguments=json.dumps(step.arguments), status="completed")
        return ModelResponse(output=[output], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError("the scripted model does not stream; use Runner.run")


def model_for(attempt: Attempt) -> Model | str:
    """A real model when a key is set, else the scripted one (and no trace export)."""
    if os.environ.get("OPENAI_API_KEY"):
        return os.environ.get("AWL_EXAMPLE_MODEL", "gpt-5-mini")
    set_tracing_disabled(True)
    return ScriptedModel(attempt.rework_reason)


async def run_agent(setting: Setting, order_id: str, attempt: Attempt) -> str:
    """One attempt: the agent, with the gateway as its only MCP server."""
    prompt = f"Do the work order {order_id}: {attempt.order.order.goal}"
    if attempt.rework_reason:
        prompt += f"\nThe manager sent the last attempt back: {attempt.rework_reason}"
    async with gateway_server(order_id, setting.config, home=setting.home) as server:
        agent = Agent(name="clerk", instructions=INSTRUCTIONS, mcp_servers=[server],
                      model=model_for(attempt))
        result = await Runner.run(agent, prompt)
    return str(result.final_output)


if __name__ == "__main__":
    sys.exit(main(run_agent, "A work order run by an OpenAI Agents SDK agent through the "
                             "gateway."))
