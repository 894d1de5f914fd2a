"""The pieces the HTTP adapters share: SSE parsing, Retry-After, backoff, packaging."""

from __future__ import annotations

import gc
import importlib
import random
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from typing import Any

import anyio
import anyio.lowlevel
import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

import runlet.providers
from runlet import (
    ConfigurationError,
    Message,
    ModelAPIError,
    ModelConnectionError,
    ModelError,
    ModelRequest,
    ModelResponseError,
)
from runlet.providers import RetryPolicy
from runlet.providers._http import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_TIMEOUT,
    HTTPModel,
    ServerSentEvent,
    SSEDecoder,
    parse_retry_after,
    sentence,
    sse_lines,
)
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


def lines_of(chunks: list[str]) -> list[str]:
    """The lines sse_lines() makes of *chunks* (it never waits here, so no event loop)."""

    async def texts() -> AsyncIterator[str]:
        for chunk in chunks:
            yield chunk

    async def every_line() -> list[str]:
        return [line async for line in sse_lines(texts())]  # type: ignore[arg-type]

    work = every_line()
    try:
        work.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    raise AssertionError("sse_lines waited")  # pragma: no cover


class TestSSELines:
    def test_only_cr_lf_and_crlf_end_a_line(self) -> None:
        # JSON strings may hold these as they are; str.splitlines() would cut there.
        others = "a\u2028b\u2029c\x85d\x0be\x0cf\x1cg\x1dh\x1ei"
        text = f"data: {others}\r\ndata: x\ry\n\n"
        assert lines_of([text]) == [f"data: {others}", "data: x", "y", ""]

    def test_a_crlf_split_between_chunks_is_one_line_break(self) -> None:
        assert lines_of(["data: 1\r", "\ndata: 2\r", "\n\r", "\n"]) == [
            "data: 1",
            "data: 2",
            "",
        ]

    def test_a_cr_then_a_chunk_of_just_lf_then_lf_is_a_blank_line(self) -> None:
        assert lines_of(["a\r", "\n", "\n"]) == ["a", ""]

    def test_the_last_line_without_a_break_is_kept(self) -> None:
        assert lines_of(["data: 1\n", "data: 2"]) == ["data: 1", "data: 2"]
        assert lines_of([]) == []
        assert lines_of(["", ""]) == []

    @given(
        st.text(alphabet="ab\r\n\u2028\x85"),
        st.lists(st.integers(0, 40), max_size=6),
    )
    def test_any_split_gives_the_lines_of_the_whole(self, text: str, cuts: list[int]) -> None:
        points = sorted({min(cut, len(text)) for cut in cuts})
        chunks = [text[i:j] for i, j in zip([0, *points], [*points, len(text)], strict=True)]
        whole = re.split(r"\r\n|\r|\n", text)
        if whole[-1] == "":
            whole.pop()
        assert lines_of(chunks) == whole


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
            ({"retry-after-ms": "-500"}, 0.0),
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
            {"max_retries": True},
            {"base_delay": -0.1},
            {"base_delay": True},
            {"max_delay": float("nan")},
            {"deadline": "60"},
        ],
    )
    def test_bad_settings(self, kwargs: dict[str, object]) -> None:
        with pytest.raises(ConfigurationError):
            RetryPolicy(**kwargs)  # type: ignore[arg-type]

    def test_zero_is_a_setting(self) -> None:
        policy = RetryPolicy(max_retries=0, base_delay=0, max_delay=0.0, deadline=0)
        assert policy.delay(0, None, Highest()) == 0.0

    def test_adapters_check_their_retry_settings(self) -> None:
        with pytest.raises(ConfigurationError, match="max_retries"):
            OpenAIChatModel("m", max_retries=-1)
        with pytest.raises(ConfigurationError, match="deadline"):
            AnthropicModel("m", api_key="k", retry_deadline=-1)

    def test_the_cap_doubles_until_max_delay(self) -> None:
        policy = RetryPolicy(base_delay=0.5, max_delay=4.0)
        caps = [policy.delay(retry, None, Highest()) for retry in range(7)]
        assert caps == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0]

    def test_the_draw_starts_at_zero(self) -> None:
        assert RetryPolicy().delay(5, None, Lowest()) == 0.0

    def test_is_public_and_keyword_only(self) -> None:
        assert RetryPolicy.__module__ == "runlet.providers"
        assert RetryPolicy() == RetryPolicy(
            max_retries=3, base_delay=0.5, max_delay=8.0, deadline=60.0
        )
        with pytest.raises(TypeError):
            RetryPolicy(3)  # type: ignore[call-arg]


class Highest(random.Random):
    """Always draws the top of the range: the backoff cap itself."""

    def uniform(self, a: float, b: float) -> float:
        return b


class Lowest(random.Random):
    def uniform(self, a: float, b: float) -> float:
        return a


class TestRetryPolicyInAdapters:
    @pytest.mark.parametrize("adapter", [OpenAIChatModel, AnthropicModel])
    def test_taken_as_retry(self, adapter: Callable[..., HTTPModel]) -> None:
        policy = RetryPolicy(max_retries=7, deadline=300.0)
        assert adapter("m", retry=policy).retry is policy

    @pytest.mark.parametrize("adapter", [OpenAIChatModel, AnthropicModel])
    def test_the_keywords_still_work(self, adapter: Callable[..., HTTPModel]) -> None:
        model = adapter("m", max_retries=1, retry_base_delay=2, retry_max_delay=3, retry_deadline=4)
        assert model.retry == RetryPolicy(max_retries=1, base_delay=2, max_delay=3, deadline=4)
        assert adapter("m").retry == RetryPolicy()
        assert adapter("m", retry_deadline=9).retry == RetryPolicy(deadline=9)

    @pytest.mark.parametrize("adapter", [OpenAIChatModel, AnthropicModel])
    def test_not_both(self, adapter: Callable[..., HTTPModel]) -> None:
        with pytest.raises(ConfigurationError, match="max_retries, retry_deadline, not both"):
            adapter("m", retry=RetryPolicy(), max_retries=1, retry_deadline=5)

    def test_not_something_else(self) -> None:
        with pytest.raises(ConfigurationError, match="RetryPolicy, not dict"):
            OpenAIChatModel("m", retry={"max_retries": 1})  # type: ignore[arg-type]


class TestAdapters:
    @pytest.mark.anyio
    @pytest.mark.parametrize("adapter", [OpenAIChatModel, AnthropicModel])
    async def test_connecting_waits_briefly_answers_long(
        self, adapter: Callable[..., HTTPModel]
    ) -> None:
        async with adapter("m") as model:
            timeout = (await model._client()).timeout
        assert (timeout.connect, timeout.read, timeout.write, timeout.pool) == (
            DEFAULT_CONNECT_TIMEOUT,
            DEFAULT_TIMEOUT,
            DEFAULT_TIMEOUT,
            DEFAULT_TIMEOUT,
        )
        assert DEFAULT_CONNECT_TIMEOUT <= 30 < DEFAULT_TIMEOUT

    @pytest.mark.anyio
    async def test_timeouts_are_configurable(self) -> None:
        async with OpenAIChatModel("m", timeout=None, connect_timeout=2.5) as model:
            timeout = (await model._client()).timeout
        assert (timeout.connect, timeout.read) == (2.5, None)

    @pytest.mark.anyio
    async def test_clients_read_the_tls_settings_once_and_off_the_event_loop(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Reading the CA bundle takes 50-100 ms: done in the event loop's thread, it would
        hold up every other task each time a client is made."""
        import threading

        from runlet.providers import _http

        made: list[bool] = []
        create = httpx.create_ssl_context

        def spy() -> Any:
            made.append(threading.current_thread() is threading.main_thread())
            return create()

        monkeypatch.setattr(httpx, "create_ssl_context", spy)
        monkeypatch.setattr(_http, "_TLS", [])
        model = OpenAIChatModel("m")
        async with anyio.create_task_group() as group:  # two first requests at once
            clients: list[httpx.AsyncClient] = []

            async def first() -> None:
                clients.append(await model._client())

            group.start_soon(first)
            group.start_soon(first)
        assert clients[0] is clients[1]  # one client, not one left behind
        await model.aclose()
        async with model:  # a new client after aclose(): the settings are not read again
            assert await model._client() is not clients[0]
        assert [False] == made  # once, and in a worker thread

    @pytest.mark.parametrize("bad", [0, -1, "5", True, float("nan")])
    def test_bad_timeouts(self, bad: Any) -> None:
        with pytest.raises(ConfigurationError, match="connect_timeout"):
            OpenAIChatModel("m", connect_timeout=bad)
        with pytest.raises(ConfigurationError, match="timeout"):
            AnthropicModel("m", timeout=bad)

    @pytest.mark.anyio
    async def test_tool_message_without_result_says_the_same_everywhere(self) -> None:
        request = ModelRequest("", (Message("tool", "x"),), (), {})
        errors = []
        for adapter in (OpenAIChatModel, AnthropicModel):
            async with adapter("m", api_key="k", base_url="http://127.0.0.1:9") as model:
                with pytest.raises(ModelError, match=r"Message\.tool") as info:
                    await model.complete(request)
                errors.append(str(info.value))
        assert errors[0] == errors[1]

    def test_empty_model_name(self) -> None:
        with pytest.raises(ConfigurationError, match="model"):
            OpenAIChatModel("")

    def test_repr_shows_model_and_url_not_key(self) -> None:
        model = OpenAIChatModel("gpt-x", api_key="sk-secret", base_url="http://h/v1/")
        assert repr(model) == "OpenAIChatModel(model='gpt-x', url='http://h/v1/chat/completions')"
        anthropic = AnthropicModel("claude-x", api_key="sk-secret")
        assert "https://api.anthropic.com/v1/messages" in repr(anthropic)
        assert "secret" not in repr(anthropic)

    @pytest.mark.parametrize(
        ("base_url", "shown"),
        [
            ("https://bob:hunter2@proxy.test/v1", "https://bob:***@proxy.test/v1"),
            ("http://:hunter2@proxy.test:8080/v1", "http://:***@proxy.test:8080/v1"),
            ("http://bob@proxy.test/v1", "http://bob@proxy.test/v1"),  # no password
            ("http://proxy.test/a:b@c/v1", "http://proxy.test/a:b@c/v1"),  # in the path
            ("http://h.test/a://b:c@d/v1", "http://h.test/a://b:c@d/v1"),  # deeper still
            # httpx reads the password up to the last "@" before the path.
            ("https://bob:p@ss@proxy.test/v1", "https://bob:***@proxy.test/v1"),
            (
                "https://me@mail.test:hunter2@proxy.test/v1",
                "https://me@mail.test:***@proxy.test/v1",
            ),
        ],
    )
    def test_repr_hides_a_password_in_the_url(self, base_url: str, shown: str) -> None:
        openai = OpenAIChatModel("m", base_url=base_url)
        assert repr(openai) == f"OpenAIChatModel(model='m', url='{shown}/chat/completions')"
        anthropic = AnthropicModel("m", api_key="k", base_url=base_url.removesuffix("/v1"))
        assert repr(anthropic).endswith(f"url='{shown.removesuffix('/v1')}/v1/messages')")
        with pytest.raises(ConfigurationError) as info:
            OpenAIChatModel("m", base_url=base_url + "?x=1")
        assert "hunter2" not in str(info.value)

    @pytest.mark.parametrize("password", ["hun?ter2", "hun#ter2"])
    def test_a_refused_base_url_hides_its_password(self, password: str) -> None:
        with pytest.raises(ConfigurationError, match="query string") as info:
            OpenAIChatModel("m", base_url=f"https://bob:{password}@proxy.test/v1")
        assert "'https://bob:***@proxy.test/v1'" in str(info.value)
        assert "ter2" not in str(info.value)

    def test_default_urls(self) -> None:
        assert "https://api.openai.com/v1/chat/completions" in repr(OpenAIChatModel("m"))

    @pytest.mark.anyio
    async def test_options_that_are_not_json(self) -> None:
        request = ModelRequest("", (Message.user("hi"),), (), {"temperature": float("nan")})
        async with OpenAIChatModel("m", base_url="http://127.0.0.1:9/v1") as model:
            with pytest.raises(ModelError, match="cannot be sent as JSON"):
                await model.complete(request)


class TestHeaders:
    def test_given_headers_replace_the_adapters_own_whatever_their_case(self) -> None:
        openai = OpenAIChatModel("m", api_key="sk-real", headers={"Authorization": "Bearer gw"})
        assert {"content-type": "application/json", "Authorization": "Bearer gw"} == (
            openai._headers
        )
        anthropic = AnthropicModel(
            "m",
            api_key="k1",
            headers={
                "X-Api-Key": "k2",
                "Anthropic-Version": "2099-01-01",
                "Content-Type": "application/json; charset=utf-8",
                "X-Extra": "1",
            },
        )
        assert {
            "Content-Type": "application/json; charset=utf-8",
            "Anthropic-Version": "2099-01-01",
            "X-Api-Key": "k2",
            "X-Extra": "1",
        } == anthropic._headers

    @pytest.mark.anyio
    async def test_each_header_goes_out_once(self) -> None:
        seen: list[httpx.Request] = []

        def answer(request: httpx.Request) -> httpx.Response:
            seen.append(request)
            return httpx.Response(200, json={"choices": [{"message": {"content": "ok"}}]})

        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
            model = OpenAIChatModel(
                "m", api_key="sk-real", http_client=client, headers={"AUTHORIZATION": "Bearer gw"}
            )
            await model.complete(ModelRequest("", (Message.user("hi"),), (), {}))
        assert ["Bearer gw"] == seen[0].headers.get_list("authorization")

    @pytest.mark.parametrize(
        "key", ["sk-abc\n", "sk-\r\nX-Evil: 1", "sk-é", "sk-\x7f", "sk-abc ", "sk-abc\t"]
    )
    def test_a_value_http_cannot_carry_is_refused_without_showing_it(self, key: str) -> None:
        for adapter in (OpenAIChatModel, AnthropicModel):
            with pytest.raises(ConfigurationError, match="HTTP does not allow") as info:
                adapter("m", api_key=key)
            assert "sk-" not in str(info.value)
        with pytest.raises(ConfigurationError, match="strings to strings"):
            OpenAIChatModel("m", headers={"x-count": 1})  # type: ignore[dict-item]
        assert "Bearer a\tb" == OpenAIChatModel("m", api_key="a\tb")._headers["authorization"]

    @pytest.mark.parametrize("name", ["X Trace", "Ünïcode", "", "x:y"])
    def test_a_header_name_http_cannot_carry_is_refused(self, name: str) -> None:
        with pytest.raises(ConfigurationError, match="is not an HTTP header name"):
            OpenAIChatModel("m", headers={name: "1"})

    @pytest.mark.anyio
    async def test_a_request_that_cannot_be_written_is_not_retried(self) -> None:
        attempts: list[int] = []

        def answer(request: httpx.Request) -> httpx.Response:
            attempts.append(1)
            raise httpx.LocalProtocolError("Illegal header value b'Bearer sk-secret '")

        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
            model = OpenAIChatModel("m", http_client=client, max_retries=3)
            with pytest.raises(ModelError, match="not retried") as info:
                await model.complete(ModelRequest("", (Message.user("hi"),), (), {}))
        assert not isinstance(info.value, ModelConnectionError)
        assert "sk-secret" not in str(info.value)  # httpx's message may quote the key
        assert [1] == attempts


# The connection left in the first loop's pool is closed when collected; asyncio warns
# about it then (closing it before the loop ends is what aclose() is for).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.parametrize(
    "backends", [("asyncio", "asyncio"), ("asyncio", "trio"), ("trio", "asyncio"), ("trio", "trio")]
)
def test_a_model_made_once_serves_one_event_loop_after_another(
    backends: tuple[str, str],
) -> None:
    # A CLI that runs asyncio.run() per command, a worker with a loop per job, a test
    # suite with a loop per test: the client (and its pooled keep-alive connection) of
    # the loop before cannot serve the next one, so the next loop gets its own.
    from _http_server import ModelServer, Reply
    from _wire import openai_completion

    with ModelServer.running(lambda seen: []) as server:
        model = OpenAIChatModel("m", api_key="k", base_url=server.url + "/v1")
        answers: list[str] = []

        async def ask(model: OpenAIChatModel) -> None:
            request = ModelRequest("", (Message.user("hi"),), (), {})
            answers.append((await model.complete(request)).message.content)

        for backend in backends:
            server.reply(Reply(json=openai_completion(f"hi from {backend}")))
            anyio.run(ask, model, backend=backend)
        clients = {seen.client for seen in server.requests}
        del model
        gc.collect()  # the first loop's connection, closed here rather than in a later test
    assert [f"hi from {backend}" for backend in backends] == answers
    assert 2 == len(clients)  # a new connection for the second loop


def test_providers_package_is_light() -> None:
    assert runlet.providers.__all__ == ["RetryPolicy"]
    assert runlet.providers.__doc__


def test_a_star_import_of_the_providers_works_without_httpx() -> None:
    # In a fresh interpreter, where nothing has imported the adapters yet.
    code = (
        "import sys; sys.modules['httpx'] = None\n"
        "from runlet.providers import *\n"
        "print(RetryPolicy.__name__)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60
    )
    assert ("RetryPolicy\n", 0) == (done.stdout, done.returncode), done.stderr


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


# -- the retry loop, on a fake clock ---------------------------------------------------------


class FakeTime:
    """A clock that only moves when the retry loop sleeps, or when a test says so."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        self.sleeps.append(delay)
        self.now += delay
        await anyio.lowlevel.checkpoint()


class Calls:
    """A mock transport's handler that answers from a list and counts the requests."""

    def __init__(self, *answers: Callable[[], httpx.Response]) -> None:
        self.answers = list(answers)
        self.count = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.count += 1
        answer = self.answers[min(self.count, len(self.answers)) - 1]
        return answer()


def status(code: int, **headers: str) -> Callable[[], httpx.Response]:
    return lambda: httpx.Response(
        code, json={"error": {"message": f"status {code}"}}, headers=headers
    )


def success() -> httpx.Response:
    return httpx.Response(
        200,
        json={"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]},
    )


REQUEST = ModelRequest("", (Message.user("Hi"),), (), {})


async def drain(model: HTTPModel) -> list[Any]:
    async with model.stream(REQUEST) as items:
        return [item async for item in items]


@pytest.fixture
def fake_time() -> FakeTime:
    return FakeTime()


class Harness:
    def __init__(self, fake_time: FakeTime) -> None:
        self.time = fake_time

    def model(self, client: httpx.AsyncClient, **kwargs: Any) -> OpenAIChatModel:
        model = OpenAIChatModel("m", base_url="http://api.test/v1", http_client=client, **kwargs)
        model._clock = self.time.clock
        model._sleep = self.time.sleep
        return model


@pytest.fixture
def harness(fake_time: FakeTime) -> Harness:
    return Harness(fake_time)


@pytest.mark.anyio
class TestRetryLoop:
    async def test_the_deadline_counts_time_spent_waiting_on_the_server(
        self, harness: Harness
    ) -> None:
        def slow_503() -> httpx.Response:
            harness.time.now += 5.0  # the server took 5 s to answer
            return status(503, **{"retry-after": "1"})()

        calls = Calls(slow_503)
        async with httpx.AsyncClient(transport=httpx.MockTransport(calls)) as client:
            model = harness.model(client, retry=RetryPolicy(max_retries=5, deadline=10.0))
            with pytest.raises(ModelAPIError, match="after 2 attempts"):
                await model.complete(REQUEST)
        # 0 s: first attempt, answered at 5 s; 6 s: second attempt, answered at 11 s,
        # and another wait would end past the 10 s deadline.
        assert calls.count == 2
        assert harness.time.sleeps == [1.0]

    async def test_a_wait_may_end_exactly_at_the_deadline(self, harness: Harness) -> None:
        calls = Calls(status(429, **{"retry-after": "5"}))
        async with httpx.AsyncClient(transport=httpx.MockTransport(calls)) as client:
            model = harness.model(client, retry=RetryPolicy(max_retries=5, deadline=10.0))
            with pytest.raises(ModelAPIError, match="after 3 attempts") as info:
                await model.complete(REQUEST)
        assert info.value.status_code == 429
        assert harness.time.sleeps == [5.0, 5.0]
        assert calls.count == 3

    async def test_backoff_keeps_growing_to_its_cap(self, harness: Harness) -> None:
        calls = Calls(status(503))
        async with httpx.AsyncClient(transport=httpx.MockTransport(calls)) as client:
            policy = RetryPolicy(max_retries=6, base_delay=0.5, max_delay=4.0, deadline=1e6)
            model = harness.model(client, retry=policy)
            model._rng = Highest()
            with pytest.raises(ModelAPIError, match="after 7 attempts"):
                await model.complete(REQUEST)
        assert harness.time.sleeps == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
        assert calls.count == 7

    async def test_max_retries_bounds_the_attempts(self, harness: Harness) -> None:
        calls = Calls(status(500))
        async with httpx.AsyncClient(transport=httpx.MockTransport(calls)) as client:
            model = harness.model(client, retry=RetryPolicy(max_retries=2, deadline=1e6))
            with pytest.raises(ModelAPIError):
                await model.complete(REQUEST)
        assert calls.count == 3
        assert len(harness.time.sleeps) == 2

    @pytest.mark.parametrize("code", [408, 409, 429, 500, 502, 503, 504, 529])
    async def test_transient_statuses_are_retried(self, harness: Harness, code: int) -> None:
        calls = Calls(status(code), success)
        async with httpx.AsyncClient(transport=httpx.MockTransport(calls)) as client:
            response = await harness.model(client).complete(REQUEST)
        assert response.message.content == "ok"
        assert calls.count == 2

    @pytest.mark.parametrize("code", [400, 401, 403, 404, 413, 422])
    async def test_other_statuses_are_not(self, harness: Harness, code: int) -> None:
        calls = Calls(status(code), success)
        async with httpx.AsyncClient(transport=httpx.MockTransport(calls)) as client:
            with pytest.raises(ModelAPIError) as info:
                await harness.model(client).complete(REQUEST)
        assert info.value.status_code == code
        assert calls.count == 1
        assert harness.time.sleeps == []

    @pytest.mark.parametrize("streaming", [False, True])
    async def test_an_error_response_is_closed_even_when_its_body_breaks(
        self, harness: Harness, streaming: bool
    ) -> None:
        bodies: list[BrokenBody] = []

        def broken_500() -> httpx.Response:
            bodies.append(BrokenBody())
            return httpx.Response(500, stream=bodies[-1])

        calls = Calls(broken_500)
        async with httpx.AsyncClient(transport=httpx.MockTransport(calls)) as client:
            model = harness.model(client, retry=RetryPolicy(max_retries=1))
            with pytest.raises(ModelConnectionError, match="ReadError"):
                await (drain(model) if streaming else model.complete(REQUEST))
        assert calls.count == 2
        assert [body.closed for body in bodies] == [True, True]

    async def test_an_undecodable_answer_is_not_retried(self, harness: Harness) -> None:
        def garbled() -> httpx.Response:
            return httpx.Response(
                200, content=b"this is not gzip", headers={"content-encoding": "gzip"}
            )

        calls = Calls(garbled)
        async with httpx.AsyncClient(transport=httpx.MockTransport(calls)) as client:
            with pytest.raises(ModelResponseError, match="could not be decoded"):
                await harness.model(client).complete(REQUEST)
        assert calls.count == 1
        assert harness.time.sleeps == []

    # When decoding fails, httpx drops its raw-bytes iterator while it is suspended;
    # trio reports that iterator when it is collected. Nothing of Runlet's is left open.
    @pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
    async def test_an_undecodable_stream_is_a_response_error(self, harness: Harness) -> None:
        def garbled_stream() -> httpx.Response:
            headers = {"content-encoding": "gzip", "content-type": "text/event-stream"}
            return httpx.Response(200, stream=Body(b"this is not gzip"), headers=headers)

        calls = Calls(garbled_stream)
        async with httpx.AsyncClient(transport=httpx.MockTransport(calls)) as client:
            with pytest.raises(ModelResponseError, match="could not be decoded"):
                await drain(harness.model(client))
        assert calls.count == 1

    async def test_a_non_stream_whose_body_breaks_is_still_refused(self, harness: Harness) -> None:
        def broken_json() -> httpx.Response:
            headers = {"content-type": "application/json"}
            return httpx.Response(200, stream=BrokenBody(), headers=headers)

        calls = Calls(broken_json)
        async with httpx.AsyncClient(transport=httpx.MockTransport(calls)) as client:
            with pytest.raises(ModelResponseError, match="does not stream"):
                await drain(harness.model(client))
        assert calls.count == 1

    async def test_too_many_redirects_is_not_retried(self, harness: Harness) -> None:
        calls = Calls(lambda: httpx.Response(307, headers={"location": "http://api.test/v1/x"}))
        transport = httpx.MockTransport(calls)
        async with httpx.AsyncClient(
            transport=transport, follow_redirects=True, max_redirects=2
        ) as client:
            with pytest.raises(ModelError, match="TooManyRedirects") as info:
                await harness.model(client).complete(REQUEST)
        assert type(info.value) is ModelError
        assert "not retried" in str(info.value)
        assert calls.count == 3  # the request and two redirects, once
        assert harness.time.sleeps == []

    async def test_a_transport_error_is_retried(self, harness: Harness) -> None:
        def refuse(request: httpx.Request) -> httpx.Response:
            raise httpx.ConnectError("refused", request=request)

        refused: list[int] = []

        def handler(request: httpx.Request) -> httpx.Response:
            refused.append(1)
            if len(refused) == 1:
                return refuse(request)
            return success()

        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            response = await harness.model(client).complete(REQUEST)
        assert response.message.content == "ok"
        assert len(refused) == 2
        assert len(harness.time.sleeps) == 1


class Body(httpx.AsyncByteStream):
    """A body the mock transport streams rather than reads ahead."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.data


class BrokenBody(httpx.AsyncByteStream):
    """An error body whose connection breaks halfway; records whether it was closed."""

    def __init__(self) -> None:
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield b'{"error": {"mess'
        raise httpx.ReadError("connection reset while reading the error body")

    async def aclose(self) -> None:
        self.closed = True


# -- error messages ---------------------------------------------------------------------------


class TestErrorMessages:
    @pytest.mark.parametrize(
        ("text", "expected"),
        [("bad key", "bad key."), ("Done.", "Done."), ("why?", "why?"), ("  x \n", "x.")],
    )
    def test_sentence(self, text: str, expected: str) -> None:
        assert sentence(text) == expected

    @pytest.mark.anyio
    @pytest.mark.parametrize(
        ("answers", "expected"),
        [
            (
                [status(401)],
                "The OpenAI Chat Completions API answered 401 Unauthorized: status 401. "
                "Check the API key and that it may use this model.",
            ),
            (
                [status(404)],
                "The OpenAI Chat Completions API answered 404 Not Found: status 404. "
                "Check base_url and the model name.",
            ),
            (
                [status(422)],
                "The OpenAI Chat Completions API answered 422 Unprocessable Entity: status 422.",
            ),
            (
                [status(503)],
                "The OpenAI Chat Completions API answered 503 Service Unavailable after 2 "
                "attempts: status 503. This is usually temporary: try again later.",
            ),
            (
                [lambda: httpx.Response(500, content=b"")],
                "The OpenAI Chat Completions API answered 500 Internal Server Error after 2 "
                "attempts: Internal Server Error. This is usually temporary: try again later.",
            ),
        ],
    )
    async def test_api_errors_read_as_sentences(
        self, harness: Harness, answers: list[Callable[[], httpx.Response]], expected: str
    ) -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(Calls(*answers))) as client:
            with pytest.raises(ModelAPIError) as info:
                await harness.model(client, max_retries=1).complete(REQUEST)
        assert str(info.value) == expected

    @pytest.mark.anyio
    @pytest.mark.parametrize(("retries", "tries"), [(1, " after 2 attempts"), (0, "")])
    async def test_connection_errors_read_as_sentences(
        self, harness: Harness, retries: int, tries: str
    ) -> None:
        def refuse(request: httpx.Request) -> httpx.Response:
            raise httpx.ConnectError("All connection attempts failed", request=request)

        async with httpx.AsyncClient(transport=httpx.MockTransport(refuse)) as client:
            with pytest.raises(ModelConnectionError) as info:
                await harness.model(client, max_retries=retries).complete(REQUEST)
        assert str(info.value) == (
            "Could not reach the OpenAI Chat Completions API at "
            f"http://api.test/v1/chat/completions{tries}: ConnectError: All "
            "connection attempts failed. Check base_url and that the server is up, then run "
            "again."
        )
        assert isinstance(info.value.__cause__, httpx.ConnectError)

    @pytest.mark.anyio
    async def test_error_messages_hide_a_password_in_the_url(self) -> None:
        def refuse(request: httpx.Request) -> httpx.Response:
            raise httpx.ConnectError("All connection attempts failed", request=request)

        async with httpx.AsyncClient(transport=httpx.MockTransport(refuse)) as client:
            model = OpenAIChatModel(
                "m", base_url="http://bob:hunter2@api.test/v1", http_client=client, max_retries=0
            )
            with pytest.raises(ModelConnectionError) as info:
                await model.complete(REQUEST)
        assert "at http://bob:***@api.test/v1/chat/completions: ConnectError" in str(info.value)
        assert "hunter2" not in str(info.value)
        # The request still goes to the URL as given, password and all.
        assert info.value.__cause__ is not None
        request = info.value.__cause__.request  # type: ignore[attr-defined]
        assert request.url.password == "hunter2"

    @pytest.mark.anyio
    @pytest.mark.parametrize("failure", ["cut off", "not SSE", "not written", "not retried"])
    async def test_no_message_shows_a_password_in_the_url(self, failure: str) -> None:
        class CutStream(httpx.AsyncByteStream):
            async def __aiter__(self) -> AsyncIterator[bytes]:
                yield b'data: {"choices": [{"index": 0, "delta": {"content": "Hi"}}]}\n\n'
                raise httpx.RemoteProtocolError("peer closed connection.")

        def answer(request: httpx.Request) -> httpx.Response:
            if failure == "cut off":
                return httpx.Response(
                    200, stream=CutStream(), headers={"content-type": "text/event-stream"}
                )
            if failure == "not SSE":
                return httpx.Response(200, json={"choices": []})
            if failure == "not written":
                raise httpx.WriteError("broken pipe", request=request)
            raise httpx.UnsupportedProtocol("no such scheme", request=request)

        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
            model = OpenAIChatModel(
                "m", base_url="http://bob:hunter2@api.test/v1", http_client=client, max_retries=0
            )
            with pytest.raises(ModelError) as info:
                await drain(model)
        assert "http://bob:***@api.test/v1/chat/completions" in str(info.value)
        assert "hunter2" not in str(info.value)

    @pytest.mark.anyio
    @pytest.mark.parametrize("streamed", [False, True])
    async def test_an_error_body_nested_too_deep_is_quoted_not_raised(
        self, harness: Harness, streamed: bool
    ) -> None:
        body = b"[" * 100_000  # more than Python's JSON reader can nest

        def answer() -> httpx.Response:
            return httpx.Response(500, content=body)

        async with httpx.AsyncClient(transport=httpx.MockTransport(Calls(answer))) as client:
            model = harness.model(client, max_retries=0)
            with pytest.raises(ModelAPIError) as info:
                await (drain(model) if streamed else model.complete(REQUEST))
        assert info.value.status_code == 500

    @pytest.mark.anyio
    async def test_cut_off_streams_read_as_sentences(self, harness: Harness) -> None:
        class CutStream(httpx.AsyncByteStream):
            async def __aiter__(self) -> AsyncIterator[bytes]:
                yield b'data: {"choices": [{"index": 0, "delta": {"content": "Hi"}}]}\n\n'
                raise httpx.RemoteProtocolError("peer closed connection.")

        def cut(request: httpx.Request) -> httpx.Response:
            return httpx.Response(
                200, stream=CutStream(), headers={"content-type": "text/event-stream"}
            )

        async with httpx.AsyncClient(transport=httpx.MockTransport(cut)) as client:
            with pytest.raises(ModelConnectionError) as info:
                await drain(harness.model(client))
        assert str(info.value) == (
            "The OpenAI Chat Completions stream from http://api.test/v1/chat/completions was "
            "cut off: RemoteProtocolError: peer closed connection. The partial answer was "
            "dropped; run again."
        )
