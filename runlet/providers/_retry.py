"""The retry policy the HTTP adapters share. Needs no httpx, so that
``runlet.providers`` can export it without the optional dependency."""

from __future__ import annotations

import random

import attrs

from .._errors import ConfigurationError

__all__ = ["RetryPolicy", "retry_policy"]


@attrs.frozen(kw_only=True)
class RetryPolicy:
    """When and how long an HTTP adapter waits before trying a failed request again.

    Both :class:`~runlet.providers.openai.OpenAIChatModel` and
    :class:`~runlet.providers.anthropic.AnthropicModel` take one as ``retry=``, so one
    policy can serve every adapter of an application::

        from runlet.providers import RetryPolicy

        patient = RetryPolicy(max_retries=6, deadline=300.0)
        model = AnthropicModel("claude-sonnet-4-5", retry=patient)

    What is retried: a 408, 409 or 429 answer, any 5xx answer (Anthropic's 529
    "overloaded" included), and a failure to connect or to read the answer. Nothing
    else, and a stream only until it has opened.

    Attributes:
        max_retries: Retries after the first attempt (0 turns retrying off).
        base_delay: Seconds; the backoff cap starts here and doubles with every retry.
        max_delay: Seconds; the backoff cap never exceeds this.
        deadline: Seconds from the first attempt after which no retry starts; a wait
            that would end past it is not begun, and the last error is raised at once.

    Raises:
        ConfigurationError: A setting is not a number of 0 or more (or, for
            *max_retries*, not an int).
    """

    max_retries: int = 3
    base_delay: float = 0.5
    max_delay: float = 8.0
    deadline: float = 60.0

    def __attrs_post_init__(self) -> None:
        if type(self.max_retries) is not int or self.max_retries < 0:
            raise ConfigurationError(
                f"max_retries must be an int of 0 or more, not {self.max_retries!r}."
            )
        for name in ("base_delay", "max_delay", "deadline"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ConfigurationError(
                    f"{name} must be a number of seconds (0 or more), not {value!r}."
                )

    def delay(self, retry: int, retry_after: float | None, rng: random.Random) -> float:
        """Seconds to wait before retry number *retry* (0 for the first retry).

        A server's ``Retry-After`` wins: it knows when it will take requests again, and
        retrying sooner only earns another 429. Otherwise "full jitter": a uniform draw
        below a cap that doubles with every retry (up to :attr:`max_delay`), so clients
        that failed together spread out.
        """
        if retry_after is not None:
            return retry_after
        # 2.0**1024 overflows a float; a cap that far up is max_delay anyway.
        cap = min(self.max_delay, self.base_delay * 2.0 ** min(retry, 1023))
        return rng.uniform(0.0, cap)


def retry_policy(
    retry: RetryPolicy | None,
    *,
    max_retries: int | None,
    base_delay: float | None,
    max_delay: float | None,
    deadline: float | None,
) -> RetryPolicy:
    """The policy an adapter was given: *retry*, or one built from the separate retry
    keywords (the older way to say the same thing), never both."""
    given: dict[str, object] = {
        "max_retries": max_retries,
        "base_delay": base_delay,
        "max_delay": max_delay,
        "deadline": deadline,
    }
    settings = [name for name, value in given.items() if value is not None]
    if retry is None:
        default = RetryPolicy()
        return RetryPolicy(
            max_retries=default.max_retries if max_retries is None else max_retries,
            base_delay=default.base_delay if base_delay is None else base_delay,
            max_delay=default.max_delay if max_delay is None else max_delay,
            deadline=default.deadline if deadline is None else deadline,
        )
    if not isinstance(retry, RetryPolicy):
        raise ConfigurationError(
            f"retry must be a runlet.providers.RetryPolicy, not {type(retry).__name__}."
        )
    if settings:
        keywords = ", ".join(
            "retry_" + name if name != "max_retries" else name for name in settings
        )
        raise ConfigurationError(
            f"Pass either retry=RetryPolicy(...) or the keywords {keywords}, not both: "
            "put those settings into the RetryPolicy."
        )
    return retry
