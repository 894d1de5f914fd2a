"""Running test code in threads that each may run an event loop, with a bound on how long
they may take: a thread still alive after ``JOIN`` seconds is a hang of the code under
test, not a slow machine."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

JOIN = 60.0  # seconds a thread gets before the test calls it a hang (a loaded CI machine)


def in_threads(*targets: Callable[[], None]) -> list[BaseException]:
    """Run each target in its own thread; return what they raised. A thread still alive
    after JOIN seconds fails the test (the code under test hung)."""
    errors: list[BaseException] = []

    def guarded(target: Callable[[], None]) -> None:
        try:
            target()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(t,), daemon=True) for t in targets]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + JOIN
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    hung = [thread.name for thread in threads if thread.is_alive()]
    assert not hung, f"threads {hung} hung"
    return errors
