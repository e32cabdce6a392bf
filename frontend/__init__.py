"""plait: structured-generation programs for LLMs.

import plait

@plait.program
def extract(s, doc):
    s += plait.system("Extract the people named in the text.")
    s += plait.user(doc)
    s += plait.assistant(plait.gen("people", json_schema=People, max_tokens=256))

state = extract.run(doc="...")
print(state["people"])
"""

from plait.clients.base import Backend
from plait.clients.http import HttpBackend
from plait.clients.local import LocalBackend
from plait.clients.openai import OpenAIBackend
from plait.context import get_default_backend, set_default_backend
from plait.dsl import assistant, gen, select, system, user
from plait.interpreter import ProgramError
from plait.program import Program, program
from plait.runtime import Runtime
from plait.state import ForkGroup, ProgramState

__all__ = [
    "Backend",
    "ForkGroup",
    "HttpBackend",
    "LocalBackend",
    "OpenAIBackend",
    "Program",
    "ProgramError",
    "ProgramState",
    "Runtime",
    "assistant",
    "gen",
    "get_default_backend",
    "program",
    "select",
    "set_default_backend",
    "system",
    "user",
]
__version__ = "0.1.0"
