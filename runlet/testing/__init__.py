"""Test helpers: a scripted model, so agents can be tested without a network.

::

    from runlet.testing import ScriptedModel, call

    model = ScriptedModel([
        call("refund", order_id="123"),     # turn 1: the model calls a tool
        "Refunded.",                        # turn 2: the final answer
    ])
    agent = Agent("support", "Be helpful.", model, tools=(refund_tool,))
    result = await Runtime().run(agent, "Refund order 123")
    assert model.requests[1].messages[-1].content == "Refunded order 123."

A script item can be a ``str`` (a final answer), a :class:`~runlet.ToolCall` (made with
:func:`call`) or a list of them (parallel calls), a :class:`~runlet.Message`, a
:class:`~runlet.ModelResponse`, or a function of the :class:`~runlet.ModelRequest`
returning any of those (sync or async). Instead of a list, the whole script can be one
such function, consulted for every request.

:func:`store_conformance_tests` turns a store factory into a pytest test class that checks
a :class:`~runlet.DurableCheckpointStore` implementation against Runlet's guarantees.
"""

from __future__ import annotations

import sys as _sys

if "pytest" in _sys.modules:
    # Under pytest, the suite's failed checks show their values (as a test module's do),
    # which pytest does only for the modules it rewrites.
    _sys.modules["pytest"].register_assert_rewrite(f"{__name__}._conformance")

from ._conformance import AgeLeases as AgeLeases
from ._conformance import SecondHandle as SecondHandle
from ._conformance import StoreFactory as StoreFactory
from ._conformance import store_conformance_tests as store_conformance_tests
from ._scripted import ScriptedModel as ScriptedModel
from ._scripted import ScriptExhaustedError as ScriptExhaustedError
from ._scripted import ScriptItem as ScriptItem
from ._scripted import call as call

__all__ = [
    "AgeLeases",
    "ScriptExhaustedError",
    "ScriptItem",
    "ScriptedModel",
    "SecondHandle",
    "StoreFactory",
    "call",
    "store_conformance_tests",
]
