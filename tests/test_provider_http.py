"""The pieces the HTTP adapters share: SSE parsing, Retry-After, backoff, packaging."""

from __future__ import annotations

import importlib
import random
import sys
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

import runlet.providers
from runlet import ConfigurationError, Message, ModelError, ModelRequest
from runlet.providers._http import RetryPolicy, ServerSentEvent, SSEDecoder, parse_retry_after
from runlet.providers.anthropic import AnthropicModel
from runlet.providers.openai import OpenAIChatModel


def decode(text: str) -> list[ServerSentEvent]:
    decoder = SSEDecoder()
    events = [decoder.feed(line) for line in text.split("\n")]
    return [event for event in events if event is not None]


class TestSSEDecoder:
    def test_events_data_and_names(self) -> None:
        text = "event: ping\ndata: {}\n\ndata: a\ndata:b\n\n"
        assert decode(text) == [ServerSentEvent("ping", "{}"), ServerSentEvent("message", "a\nb")]

    def test_comments_ids_retry_and_empty_events_are_ignored(self) -> None:
        text = ": comment\n\nid: 7\nretry: 100\n\nevent: lonely\n\nfield-without-colon\ndata\n\n"
        # "data" with no colon is a data field with an empty value
        assert decode(text) == [ServerSentEvent("message", "")]

    def test_only_one_leading_space_is_dropped(self) -> None:
        assert decode("data:  two\n\n") == [ServerSentEvent("message", " two")]

    def test_event_name_resets_after_dispatch(self) -> None:
        text = "event: a\ndata: 1\n\ndata: 2\n\n"
        assert [e.event for e in decode(text)] == ["a", "message"]

    def test_unfinished_event_is_not_dispatched(self) -> None:
        assert decode("data: partial") == []

    @given(st.lists(st.text(alphabet=st.characters(exclude_characters="\r\n"), max_size=20)))
    def test_any_data_lines_round_trip(self, lines: list[str]) -> None:
        text = "".join(f"data: {line}\n" for line in lines) + "\n"
        expected = [ServerSentEvent("message", "\n".join(lines))] if lines else []
        assert decode(text) == expected


class TestRetryAfter:
    @pytest.mark.parametrize(
        ("headers", "expected"),
        [
            ({}, None),
            ({"retry-after": "3"}, 3.0),
            ({"retry-after": "0.25"}, 0.25),
            ({"retry-after": "-4"}, 0.0),
            ({"retry-after": "soon"}, None),
            ({"retry-after": "nan"}, None),
            ({"retry-after": "7", "retry-after-ms": "1500"}, 1.5),
            ({"retry-after": "7", "retry-after-ms": "junk"}, 7.0),
            ({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, 0.0),  # in the past
        ],
    )
    def test_forms(self, headers: dict[str, str], expected: float | None) -> None:
        assert parse_retry_after(headers) == expected

    def test_http_date_in_the_future(self) -> None:
        when = datetime.now(timezone.utc) + timedelta(seconds=120)
        seconds = parse_retry_after({"retry-after": format_datetime(when, usegmt=True)})
        assert seconds is not None
        assert 100 < seconds <= 120

    def test_http_date_without_zone(self) -> None:
        when = datetime.now(timezone.utc) + timedelta(seconds=120)
        text = when.strftime("%a, %d %b %Y %H:%M:%S -0000")
        seconds = parse_retry_after({"retry-after": text})
        assert seconds is not None
        assert 100 < seconds <= 120


class TestRetryPolicy:
    def test_retry_after_wins(self) -> None:
        assert RetryPolicy().delay(0, 12.5, random.Random(1)) == 12.5

    @given(st.integers(0, 40), st.integers(0, 2**32))
    def test_full_jitter_stays_under_the_cap(self, retry: int, seed: int) -> None:
        policy = RetryPolicy(base_delay=0.5, max_delay=8.0)
        delay = policy.delay(retry, None, random.Random(seed))
        assert 0.0 <= delay <= min(8.0, 0.5 * 2**retry)

    def test_jitter_spreads_delays(self) -> None:
        rng = random.Random(0)
        delays = {RetryPolicy().delay(3, None, rng) for _ in range(20)}
        assert len(delays) == 20

    @pytest.mark.parametrize(
        "kwargs",
        [
            {"max_retries": -1},
            {"max_retries": 1.5},
            {"base_delay": -0.1},
            {"max_delay": float("nan")},
            {"deadline": "60"},
        ],
    )
    def test_bad_settings(self, kwargs: dict[str, object]) -> None:
        with pytest.raises(ConfigurationError):
            RetryPolicy(**kwargs)  # type: ignore[arg-type]

    def test_adapters_check_their_retry_settings(self) -> None:
        with pytest.raises(ConfigurationError, match="max_retries"):
            OpenAIChatModel("m", max_retries=-1)
        with pytest.raises(ConfigurationError, match="deadline"):
            AnthropicModel("m", api_key="k", retry_deadline=-1)


class TestAdapters:
    def test_empty_model_name(self) -> None:
        with pytest.raises(ConfigurationError, match="model"):
            OpenAIChatModel("")

    def test_repr_shows_model_and_url_not_key(self) -> None:
        model = OpenAIChatModel("gpt-x", api_key="sk-secret", base_url="http://h/v1/")
        assert repr(model) == "OpenAIChatModel(model='gpt-x', url='http://h/v1/chat/completions')"
        anthropic = AnthropicModel("claude-x", api_key="sk-secret")
        assert "https://api.anthropic.com/v1/messages" in repr(anthropic)
        assert "secret" not in repr(anthropic)

    def test_default_urls(self) -> None:
        assert "https://api.openai.com/v1/chat/completions" in repr(OpenAIChatModel("m"))

    @pytest.mark.anyio
    async def test_options_that_are_not_json(self) -> None:
        request = ModelRequest("", (Message.user("hi"),), (), {"temperature": float("nan")})
        async with OpenAIChatModel("m", base_url="http://127.0.0.1:9/v1") as model:
            with pytest.raises(ModelError, match="cannot be sent as JSON"):
                await model.complete(request)


def test_providers_package_is_light() -> None:
    assert runlet.providers.__all__ == ["RetryPolicy", "anthropic", "openai"]
    assert runlet.providers.__doc__


@pytest.mark.parametrize("module", ["runlet.providers.openai", "runlet.providers.anthropic"])
def test_import_without_httpx_says_what_to_install(
    module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(sys.modules):
        if name.startswith("runlet.providers."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "httpx", None)
    with pytest.raises(ImportError, match=r'pip install "runlet\[http\]"'):
        importlib.import_module(module)
