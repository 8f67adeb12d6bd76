"""Run a function over the parts of a corpus in `num_proc` spawned worker processes, with progress.

Why not `concurrent.futures` or `Pool.map`: the main process must (1) hear about progress while a part is
being encoded (a part can be minutes of work), (2) get each part's result as soon as it is done, in any
order, and (3) stop every worker at once on Ctrl-C or on the first error, instead of waiting for the
parts in flight. A worker killed from outside (out of memory) is noticed, not waited for.

Workers are spawned (not forked): the caller may be a training process with threads and a process
group, which fork would copy into the children half-alive. They ignore SIGINT; the main process decides,
and terminates them. A worker whose main process died (SIGKILL) notices at its next progress report
and exits: nobody would read its part.

`fn(part, index, report, **common)` runs in a worker for each task `(index, part)` (`part` may be None:
fn then finds the part from `index` and `common` itself); `report(docs, tokens)` sends progress. Exceptions
come back to the caller: a UserError as itself, anything else as a RuntimeError carrying the worker's traceback.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import threading
import traceback
from typing import Any, Callable, Iterable

from common.errors import UserError

POLL_SECONDS = 0.5


def _worker(fn: Callable, tasks: Any, results: Any, common: dict[str, Any], parent: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process handles Ctrl-C and terminates us
    # tqdm's bars (datasets makes some) share a multiprocessing lock, a named semaphore the resource tracker
    # records; a worker that is terminated (another one failed) never releases its record, and the tracker then
    # prints "leaked semaphore" warnings after the run's one-line error. A worker has no children of its own:
    # a thread lock serves it
    from tqdm import tqdm
    tqdm.set_lock(threading.RLock())
    # workers read and encode text: keep `datasets` (imported later, by fn) from importing torch, which
    # costs each worker ~200 MB and seconds of start-up for nothing
    os.environ["USE_TORCH"] = "0"

    def report(docs: int, tokens: int) -> None:
        if os.getppid() != parent:  # the main process was killed: nobody will read this part
            os._exit(1)
        results.put(("progress", docs, tokens))

    while True:
        try:
            task = tasks.get(timeout=POLL_SECONDS)
        except queue.Empty:
            if os.getppid() != parent:
                return
            continue
        if task is None:
            return
        index, part = task
        try:
            results.put(("done", index, fn(part, index, report, **common)))
        except BaseException as e:  # sent back whole: the main process raises it
            results.put(("error", index, _picklable(e)))
            return


def _picklable(e: BaseException) -> BaseException:
    if isinstance(e, UserError):
        return UserError(str(e))
    # not every exception pickles (datasets' and pyarrow's may not): send its traceback as text
    text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    return RuntimeError(f"a worker process failed:\n{text}")


def run_parts(fn: Callable, parts: list[Any], todo: Iterable[int], common: dict[str, Any], num_proc: int,
              on_progress: Callable[[int, int], None], on_done: Callable[[int, Any], None]) -> None:
    """Call fn on the parts numbered `todo`, in `num_proc` processes (in this one when num_proc is 1, with
    the part itself; a worker gets None and finds it by its index); on_done(index, result) is called in
    this process as each part finishes, on_progress(docs, tokens) as workers report."""
    tasks = list(todo)
    if num_proc <= 1 or len(tasks) <= 1:
        for index in tasks:
            on_done(index, fn(parts[index], index, on_progress, **common))
        return
    ctx = mp.get_context("spawn")
    task_queue, results = ctx.Queue(), ctx.Queue()
    for index in tasks:
        task_queue.put((index, None))  # a part does not travel: datasets' objects may hold torch tensors
    workers = [ctx.Process(target=_worker, args=(fn, task_queue, results, common, os.getpid()), daemon=True)
               for _ in range(min(num_proc, len(tasks)))]
    for _ in workers:
        task_queue.put(None)  # one stop sign each, after the tasks
    for worker in workers:
        worker.start()
    remaining = len(tasks)
    try:
        while remaining:
            try:
                message = results.get(timeout=POLL_SECONDS)
            except queue.Empty:
                dead = [w for w in workers if not w.is_alive() and w.exitcode not in (0, None)]
                if dead:
                    raise RuntimeError(f"a worker process died (exit code {dead[0].exitcode}; -9 is SIGKILL, "
                                       f"e.g. out of memory): lower data.num_proc, then run the same command "
                                       f"to resume") from None
                continue
            if message[0] == "progress":
                on_progress(message[1], message[2])
            elif message[0] == "done":
                remaining -= 1
                on_done(message[1], message[2])
            else:
                raise message[2]
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.terminate()
        for worker in workers:
            worker.join(timeout=10)
        task_queue.cancel_join_thread()
        results.cancel_join_thread()
