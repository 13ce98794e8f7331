"""A multi-turn tool task for a real chat model: multiply with a calculator.

The user asks for a 3-digit by 2-digit product, which SmolLM2-135M cannot work out in its head.
The model is offered one tool, ``calculator(expression)``, through the OpenAI ``tools=``
parameter.  An episode is up to three calls:

    user: What is 583 * 94?
    assistant: [calculator(expression="583 * 94")]     <- a tool call (the gateway parses it)
    tool: 54802                                         <- this environment answers it
    assistant: 54802                                    <- rewarded 1 if it is the product

One worked example opens every conversation (an in-context demonstration).  Untrained, the
model calls the tool in a minority of samples and answers right after it most of the time;
RL has to make it call the tool, with the right expression, and then repeat the result.

Held-out: 128 fixed problems (``validation``) and 128 others (``test``), played greedily with
the same code (``eval_episode``), never trained on.
"""
from __future__ import annotations

import ast
import json
import operator
import random
import re
from typing import Callable, Iterator

TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                   "required": ["expression"]}}}]

DEMO = [
    {"role": "user", "content": "A shelf holds 37 books. How many books are on 215 shelves?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_demo", "type": "function",
         "function": {"name": "calculator", "arguments": '{"expression": "215 * 37"}'}}]},
    {"role": "tool", "tool_call_id": "call_demo", "content": "7955"},
    {"role": "assistant", "content": "7955"},
]
MAX_CALLS = 3
ANSWER_TOKENS = 24
TOOL_REWARD = 0.2     # per-turn rewards (behavior_per_turn): a tool call that computes the product
TEMPERATURE = 0.5   # SmolLM2-135M at 1.0 rambles: 1 success in 128 against 10% greedy (docs/real-models.md)

Ask = Callable[[list, list, int], dict]     # (messages, tools, max_tokens) -> assistant message


STORIES = [
    "A box holds {b} apples. How many apples are in {a} boxes?",
    "Each ticket costs {b} dollars. How many dollars do {a} tickets cost?",
    "A train travels {b} km every hour. How many km does it travel in {a} hours?",
    "There are {a} rows of seats with {b} seats in each row. How many seats are there?",
    "A farmer plants {b} trees in each of {a} fields. How many trees does he plant?",
    "A printer prints {b} pages a minute. How many pages does it print in {a} minutes?",
]


def _problem(rng: random.Random) -> dict:
    a, b = rng.randint(100, 999), rng.randint(11, 99)
    return {"question": rng.choice(STORIES).format(a=a, b=b), "answer": str(a * b)}


def eval_tasks(split: str = "validation", n: int = 128) -> list[dict]:
    rng = random.Random({"validation": 7001, "test": 7002}[split])
    return [_problem(rng) for _ in range(n)]


def tasks(seed: int = 0) -> Iterator[dict]:
    held_out = {t["question"] for split in ("validation", "test") for t in eval_tasks(split)}
    rng = random.Random(seed)
    while True:
        task = _problem(rng)
        if task["question"] not in held_out:
            yield task


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv, ast.USub: operator.neg}


def calculate(expression: str) -> str:
    """The environment: +, -, *, / and parentheses over numbers, nothing else."""
    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.operand))
        raise ValueError("only numbers and + - * / ( )")
    try:
        result = value(ast.parse(str(expression)[:200], mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError, RecursionError) as e:
        return f"error: {e}"
    return str(int(result)) if float(result).is_integer() else f"{result:.6g}"


def score(task: dict, text: str | None) -> float:
    """1 if the first number of the final answer is the product."""
    first = re.search(r"-?\d[\d,]*", text or "")
    return 1.0 if first and first.group(0).replace(",", "") == task["answer"] else 0.0


def play(task: dict, ask: Ask) -> float:
    """One episode: the model may call the calculator; its last words are scored."""
    return episode(task, ask)["final"]


def episode(task: dict, ask: Ask) -> dict:
    """One episode with per-turn rewards (docs/algorithms.md): each call that ends in a tool
    call earns ``TOOL_REWARD`` when its expression computes the product, the last words are
    scored at the end.  Group estimators fold them into one number; PPO credits each turn."""
    messages = [*DEMO, {"role": "user", "content": task["question"]}]
    turns = []
    for _ in range(MAX_CALLS):
        reply = ask(messages, TOOLS, ANSWER_TOKENS)
        calls = reply.get("tool_calls") or []
        if not calls:
            return {"turns": turns, "final": score(task, reply.get("content"))}
        messages.append({"role": "assistant", "content": reply.get("content"), "tool_calls": calls})
        results = []
        for call in calls:
            try:
                args = json.loads(call["function"]["arguments"] or "{}")
            except json.JSONDecodeError:
                args = {}
            if not isinstance(args, dict):
                args = {}
            result = (calculate(args.get("expression", "")) if call["function"]["name"] == "calculator"
                      else f"error: no tool {call['function']['name']!r}")
            results.append(result)
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
        turns.append(TOOL_REWARD if task["answer"] in results else 0.0)
    return {"turns": turns, "final": 0.0}         # out of calls: no answer


def behavior(task: dict, llm) -> float:
    """The agent, through the ``openai`` SDK with ``tools=``."""
    return play(task, _asker(llm))


def _asker(llm, force_first: bool = False) -> Ask:
    """Ask through the ``openai`` SDK; ``force_first``: the first call must use the calculator
    (``tool_choice``: the gateway writes the call's opening, the model its expression)."""
    client, asked = llm.client(), []

    def ask(messages: list, tools: list, max_tokens: int) -> dict:
        forced = {"tool_choice": {"type": "function", "function": {"name": "calculator"}}} \
            if force_first and not asked else {}
        asked.append(1)
        reply = client.chat.completions.create(model=llm.model(), messages=messages, tools=tools,
                                               max_tokens=max_tokens, temperature=TEMPERATURE, **forced)
        return reply.choices[0].message.model_dump(exclude_none=True)
    return ask


def eval_episode(task: dict, chat) -> float:
    """Held-out: the same episode, answered greedily by the learner's weights."""
    return play(task, lambda messages, tools, max_tokens: chat(messages, tools, max_tokens))


def behavior_per_turn(task: dict, llm) -> dict:
    """``behavior`` with per-turn rewards, ``{"turns": [...], "final": r}``, whose first call must
    use the calculator, so every episode has a turn to credit: was the expression right?"""
    return episode(task, _asker(llm, force_first=True))
