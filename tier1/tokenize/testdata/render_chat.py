"""Reference chat-template renderer for tier1/tokenize's TestOracle.

Renders each case with Python's Jinja2 set up as Hugging Face transformers'
apply_chat_template sets it up (the code vLLM's /v1/chat/completions runs):
a sandboxed environment with trim_blocks and lstrip_blocks, the
loopcontrols extension, a tojson filter that keeps non-ASCII text, and the
raise_exception and strftime_now globals.

    python3 render_chat.py <chats.json>   # [{"template", "vars", "messages",
                                          #   "add_generation_prompt"}]
Output (stdout): a JSON list of the rendered prompts.
"""

import json
import sys
from datetime import datetime

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


def main():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    with open(sys.argv[1], encoding="utf-8") as f:
        cases = json.load(f)
    compiled = {}
    out = []
    for c in cases:
        source = c["template"]
        if source not in compiled:
            compiled[source] = env.from_string(source)
        out.append(compiled[source].render(
            messages=c["messages"], tools=None, documents=None,
            add_generation_prompt=c["add_generation_prompt"], **(c.get("vars") or {})))
    json.dump(out, sys.stdout, ensure_ascii=False)


main()
