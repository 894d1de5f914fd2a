"""HTTP model adapters for hosted and local model APIs.

Each adapter lives in its own module, so importing this package costs nothing and needs
no optional dependency; import the adapter you use::

    from runlet.providers.openai import OpenAIChatModel     # Chat Completions, and any
                                                            # OpenAI-compatible server
    from runlet.providers.anthropic import AnthropicModel   # the Anthropic Messages API

The adapters need ``httpx``: install it with ``pip install "runlet[http]"``. What they
share, :class:`RetryPolicy`, is importable from here without it.
"""

from __future__ import annotations

from ._retry import RetryPolicy as RetryPolicy

__all__ = ["RetryPolicy"]  # the adapters need httpx: import their modules by name

RetryPolicy.__module__ = __name__
