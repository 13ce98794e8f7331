"""Agents written with other frameworks and SDKs, each a behavior and (through
agents/examples/client_mode.py) a client-mode script; docs/writing-an-agent.md has the table of
what works with what.  They leave the answer's length to the gateway (the model entry's
``default_max_tokens``, cut to the room the context leaves), so one agent fits tiny-arith's 256
positions and a chat model's 8k alike.
"""
