"""A calculator tool for multi-turn RL (docs/agents.md).

The model gets an arithmetic problem. In a turn it may call the calculator by
writing <calc>EXPRESSION</calc>: the environment answers with a new user
message <result>VALUE</result> and the model goes on. A turn without a call
is the final answer: the episode ends with reward 1.0 when that turn holds the
right number (the sample's label), else 0.0. Every call past the third costs
0.1, so the policy learns to call the tool when it helps and stop after.

The file is imported once per worker process; Env() is made once per sample.
A sample's metadata may carry "question" (the user message; default: the
prompt) and "system" (the system message; "" for none; default: SYSTEM).
"""
import ast
import operator
import re

CALL = re.compile(r"<calc>(.*?)</calc>", re.S)
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
SYSTEM = ("Use <calc>expression</calc> to compute. "
          "Reply with only the final number when done.")
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
       ast.Div: operator.truediv, ast.USub: operator.neg, ast.UAdd: operator.pos}


def evaluate(expr):
    """+ - * / and parentheses over numbers; anything else is an error."""
    def walk(node):
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            return OPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in OPS:
            return OPS[type(node.op)](walk(node.operand))
        raise ValueError("unsupported expression")
    if len(expr) > 200:
        raise ValueError("expression too long")
    return walk(ast.parse(expr.strip(), mode="eval"))


def format_number(x):
    return str(int(x)) if float(x).is_integer() else f"{x:.6g}"


class Env:
    def __init__(self):
        self.label = None
        self.calls = 0

    def reset(self, sample):
        self.label = str(sample["label"])
        meta = sample.get("metadata") or {}
        system = meta.get("system", SYSTEM)
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": meta.get("question", sample["prompt"])})
        return messages

    def step(self, messages, completion):
        call = CALL.search(completion)
        if call is None:
            numbers = NUMBER.findall(completion)
            right = bool(numbers) and numbers[-1] == self.label
            return {"observation": None, "reward": 1.0 if right else 0.0, "done": True}
        self.calls += 1
        try:
            value = format_number(evaluate(call.group(1)))
        except (ValueError, SyntaxError, ZeroDivisionError, RecursionError) as exc:
            value = f"error: {exc}"
        cost = -0.1 if self.calls > 3 else None
        return {"observation": f"<result>{value}</result>", "reward": cost, "done": False}
