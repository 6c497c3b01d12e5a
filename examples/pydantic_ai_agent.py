"""A whole work order run by a PydanticAI agent through the AWL gateway.

    .venv/bin/python examples/pydantic_ai_agent.py [--home DIR] [--manager auto|none]

The agent's toolset is the gateway for the order (``awl.integrations.pydantic_ai``): its
reads pass through to ``examples/outbox_server.py``, its email is held. The report is
drafted from the call log, the manager approves, and the commit sends the email once.

With ``OPENAI_API_KEY`` set it runs a real model (``AWL_EXAMPLE_MODEL``, any PydanticAI
model name, default ``openai:gpt-5-mini``, whose provider needs the ``openai`` package: the
``openai-agents`` extra brings it, or ``pip install "pydantic-ai-slim[openai]"``). Without
a key, PydanticAI's own ``FunctionModel`` follows the script in ``examples/agent_order.py``,
so it runs here with no network. See that file for the options and exit codes.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from agent_order import INSTRUCTIONS, FinalStep, Setting, main, scripted_step
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models import Model
from pydantic_ai.models.function import AgentInfo, FunctionModel

from awl.integrations import Attempt
from awl.integrations.pydantic_ai import gateway_toolset


def scripted_model(rework_reason: str | None) -> FunctionModel:
    """PydanticAI's test model, following the shared script."""
    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        results = [(part.tool_name, str(part.content)) for message in messages
                   for part in getattr(message, "parts", ()) if isinstance(part, ToolReturnPart)]
        step = scripted_step(results, rework_reason)
        if isinstance(step, FinalStep):
            return ModelResponse(parts=[TextPart(step.text)])
        return ModelResponse(parts=[ToolCallPart(step.name, step.arguments)])
    return FunctionModel(respond)


def model_for(attempt: Attempt) -> Model | str:
    """A real model when a key is set, else the scripted one."""
    if os.environ.get("OPENAI_API_KEY"):
        return os.environ.get("AWL_EXAMPLE_MODEL", "openai:gpt-5-mini")
    return scripted_model(attempt.rework_reason)


async def run_agent(setting: Setting, order_id: str, attempt: Attempt) -> str:
    """One attempt: the agent, with the gateway as its only toolset."""
    prompt = f"Do the work order {order_id}: {attempt.order.order.goal}"
    if attempt.rework_reason:
        prompt += f"\nThe manager sent the last attempt back: {attempt.rework_reason}"
    with (setting.home / "gateway.log").open("a", encoding="utf-8") as log:
        toolset: Any = gateway_toolset(order_id, setting.config, home=setting.home,
                                       log_file=log)
        agent = Agent(model_for(attempt), instructions=INSTRUCTIONS, toolsets=[toolset])
        result = await agent.run(prompt)
    return str(result.output)


if __name__ == "__main__":
    sys.exit(main(run_agent, "A work order run by a PydanticAI agent through the gateway."))
