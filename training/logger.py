"""What the user sees and what stays on disk: a tqdm bar, eval lines, Weights & Biases, metrics.jsonl.

W&B is optional at run time: `wandb.mode` online | offline | disabled, or auto (online when credentials
exist, else offline with a line on how to `wandb sync`). Never an interactive prompt. When the wandb
package is missing (some GPU images lack it), or online mode cannot reach the server within
`wandb.init_timeout` seconds (the run says it is waiting), the run goes on with a warning. Ctrl-C or SIGTERM
while it waits stop the run at once (exit 130 / 143): only wandb's own errors are caught, never those.
A write to metrics.jsonl that fails (a full disk) stops the run with one line (training/run_dir.py).
"""
from __future__ import annotations

import json
import netrc
import os
import re
import secrets
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from tqdm.auto import tqdm

from common.errors import UserError
from common.json_file import read_bounded
from common.writes import append_text, write_file
from training.config import RunConfig, config_as_dict
from training.run_dir import could_not_write

RUN_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")  # what wandb makes (8 lowercase letters and digits), and ours
RUN_ID_LIMIT = 4096  # bytes: an id is a few dozen


def resolve_wandb_mode(mode: str) -> str:
    if mode != "auto":
        return mode
    env_mode = os.environ.get("WANDB_MODE")
    if env_mode in ("online", "offline", "disabled"):
        return env_mode
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    try:
        return "online" if netrc.netrc().authenticators("api.wandb.ai") is not None else "offline"
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return "offline"


def call_interruptibly(fn: Callable[[], Any], poll_s: float = 0.1) -> Any:
    """fn() in a helper thread while this one waits in short steps, so that Ctrl-C or SIGTERM during fn is
    raised here within poll_s. wandb.init blocks its caller on a lock for up to wandb.init_timeout; POSIX
    lets the kernel hand a process's signal to any of its threads (wandb's, torch's), and one caught there
    only sets Python's flag: it does not wake that wait, so Ctrl-C would wait out the timeout
    (tests/training/test_logger_wandb.py shows both). Interrupted, fn goes on in its daemon thread until it returns
    or the process exits."""
    outcome: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as e:  # handed to the caller's thread below
            outcome["error"] = e
        finally:
            done.set()

    helper = threading.Thread(target=run, name="attngpt-wandb-init", daemon=True)
    helper.start()
    # back in Python every poll_s: a pending signal's handler runs here. An Event, not helper.join(): on
    # Python <= 3.11 a join that a handler interrupts marks the still-running thread as stopped
    while not done.wait(poll_s):
        pass
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def read_run_id(path: Path) -> str | None:
    """The W&B run id an out_dir logs to (its wandb_run_id.txt), or None before its first W&B run. The id goes
    to wandb and into printed lines, so a damaged file (binary, or text that is not an id) is refused here."""
    if not path.exists():
        return None
    text = read_bounded(path, RUN_ID_LIMIT, path.name).decode("utf-8", "replace").strip()
    if text and not RUN_ID.fullmatch(text):
        raise UserError(f"'{path}' holds {ascii(text[:40])}, not a W&B run id (letters, digits, - and _): delete "
                        f"it to log to a new W&B run, or write into it the id of the run to go on with")
    return text or None


class RunLogger:
    """Only the main process logs; the others get a logger that does nothing."""

    def __init__(self, cfg: RunConfig, is_main: bool, start_step: int, resumed: bool, started: float | None = None):
        self.enabled = is_main
        # metrics rows carry time_s: seconds since `started` (time.perf_counter()), the moment this process began
        # the run, so that what it waited for before the first step (data preparation, auto's timing) counts
        self.t0 = time.perf_counter() if started is None else started
        self.out_dir = Path(cfg.out_dir)
        self.wandb = None
        self.bar = None
        if not is_main:
            return
        self.metrics_path = self.out_dir / "metrics.jsonl"  # appended to row by row (common/writes.py: append_text)
        mode = resolve_wandb_mode(cfg.wandb.mode)
        if mode != "disabled":
            self.wandb = self._start_wandb(cfg, mode, resumed)
        self.bar = tqdm(total=cfg.train.max_iters, initial=start_step, desc="train", unit="step",
                        dynamic_ncols=True, file=sys.stderr, mininterval=0.5)

    def _start_wandb(self, cfg: RunConfig, mode: str, resumed: bool):
        try:
            import wandb
        except ImportError:
            self.write("warning: wandb is not installed; logging to metrics.jsonl only (pip install wandb)")
            return None
        run_id_file = self.out_dir / "wandb_run_id.txt"
        run_id = read_run_id(run_id_file)
        if not run_id:
            run_id = secrets.token_hex(4)  # one W&B run per out_dir, resumed with it
            with could_not_write(run_id_file, self.out_dir):
                write_file(run_id_file, run_id)
        timeout = cfg.wandb.init_timeout
        if mode == "online":
            self.write(f"wandb: connecting to {os.environ.get('WANDB_BASE_URL', 'https://api.wandb.ai')} (waiting up "
                       f"to {timeout:g} s: wandb.init_timeout; wandb.mode=offline runs without the server)")
        try:
            run = call_interruptibly(lambda: wandb.init(
                project=cfg.wandb.project, entity=cfg.wandb.entity, name=cfg.wandb.run_name or self.out_dir.name,
                config=config_as_dict(cfg), dir=str(self.out_dir), mode=mode, id=run_id, resume="allow",
                settings=wandb.Settings(silent=True, console="off", init_timeout=timeout)))
        except Exception as e:  # wandb's own errors (auth, network, its timeout) must not kill the run
            self.write(f"warning: wandb could not start ({type(e).__name__}: {str(e).splitlines()[0][:160]}); "
                       f"logging to metrics.jsonl only")
            return None
        if mode == "offline":
            self.write(f"wandb: offline run in {run.dir.rsplit('/files', 1)[0]}; "
                       f"upload it later with: wandb sync {self.out_dir / 'wandb'}/offline-run-*")
        return run

    # ----------------------------------------------------------------------------------------------
    def write(self, line: str) -> None:
        """A line that survives the progress bar."""
        if self.enabled:
            (self.bar.write if self.bar is not None else print)(line, file=sys.stderr)

    def record(self, step: int, values: dict[str, Any]) -> None:
        """One line of metrics.jsonl (flushed: crash tests read it) and one W&B log call."""
        if not self.enabled:
            return
        row = {"step": step, "time_s": round(time.perf_counter() - self.t0, 3), **values}
        with could_not_write(self.metrics_path, self.out_dir):
            append_text(self.metrics_path, json.dumps(row))
        self.log_wandb(step, values)

    def log_wandb(self, step: int, values: dict[str, Any]) -> None:
        if self.wandb is not None:  # None on the other processes
            self.wandb.log(values, step=step)

    def progress(self, n: int, postfix: dict[str, str]) -> None:
        if self.bar is not None:
            self.bar.set_postfix(postfix, refresh=False)
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:  # bar and wandb: None on the other processes
            self.bar.close()
        if self.wandb is not None:
            self.wandb.finish()
