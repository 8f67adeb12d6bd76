"""Starting W&B: every wandb.* setting reaches wandb.init, online mode says it is waiting and waits at most
wandb.init_timeout, and Ctrl-C / SIGTERM while it waits end the run at once (130 / 143), without a traceback.

The server that never answers is a local socket that accepts connections and says nothing."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

from tests.helpers import REPO, default_sigint, prepared_shakespeare_dir, tiny_config
from training.logger import RunLogger, call_interruptibly


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return prepared_shakespeare_dir(tmp_path_factory.mktemp("data"))


class FakeWandb(types.ModuleType):
    """Records what wandb.init receives."""

    def __init__(self):
        super().__init__("wandb")
        self.calls: list[dict] = []

    def Settings(self, **kwargs):  # noqa: N802 - wandb's name
        return dict(kwargs)

    def init(self, **kwargs):
        self.calls.append(kwargs)
        return types.SimpleNamespace(dir=str(Path(kwargs["dir"]) / "wandb" / "offline-run-x" / "files"),
                                     log=lambda *a, **k: None, finish=lambda: None)


def test_wandb_settings_reach_wandb_init(tmp_path, monkeypatch, capsys):
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    cfg = tiny_config(tmp_path, "wandb.mode=online", "wandb.project=proj", "wandb.entity=team",
                      "wandb.run_name=first", "wandb.init_timeout=7.5")
    RunLogger(cfg, is_main=True, start_step=0, resumed=False).close()
    (call,) = fake.calls
    run_id = (tmp_path / "wandb_run_id.txt").read_text()
    assert {k: call[k] for k in ("project", "entity", "name", "dir", "mode", "id", "resume")} == {
        "project": "proj", "entity": "team", "name": "first", "dir": str(tmp_path), "mode": "online", "id": run_id,
        "resume": "allow"}
    assert call["settings"]["init_timeout"] == 7.5
    assert call["config"]["train"]["max_iters"] == cfg.train.max_iters
    assert "wandb: connecting to" in capsys.readouterr().err
    # the same out_dir continues the same W&B run; without run_name, the run is named after the out_dir
    cfg = tiny_config(tmp_path, "wandb.mode=offline")
    RunLogger(cfg, is_main=True, start_step=3, resumed=True).close()
    assert fake.calls[1]["id"] == run_id and fake.calls[1]["name"] == tmp_path.name
    assert fake.calls[1]["mode"] == "offline" and fake.calls[1]["entity"] is None


def test_disabled_and_non_main_loggers_never_start_wandb(tmp_path, monkeypatch):
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    (tmp_path / "a").mkdir()
    RunLogger(tiny_config(tmp_path / "a", "wandb.mode=disabled"), True, 0, False).close()
    RunLogger(tiny_config(tmp_path / "b", "wandb.mode=online"), False, 0, False).close()
    assert fake.calls == []
    assert not (tmp_path / "b" / "metrics.jsonl").exists()  # other ranks write nothing


def silent_server() -> tuple[socket.socket, int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)  # the kernel completes connections into the backlog; nobody ever answers
    return server, server.getsockname()[1]


def signal_state(pid: int) -> list[str]:
    """Each thread's signal lines from /proc (pending, blocked, ignored, caught), for a failure message."""
    try:
        return [f"{task}: " + " ".join(line.split()[1] for line in (Path(f"/proc/{pid}/task/{task}/status")
                                                                   .read_text().splitlines())
                                      if line.startswith(("SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")))
                for task in sorted(os.listdir(f"/proc/{pid}/task"))]
    except OSError as e:
        return [str(e)]


def online_train(out: Path, data_dir: Path, port: int, log: Path, timeout: float) -> subprocess.Popen:
    env = {**os.environ, "WANDB_BASE_URL": f"http://127.0.0.1:{port}", "WANDB_API_KEY": "k" * 40,
           "ATTNGPT_DATA_DIR": str(data_dir), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "WANDB_SILENT": "true",
           "PYTHONFAULTHANDLER": "1"}  # SIGABRT then prints the Python stack of every thread
    env.pop("WANDB_MODE", None)
    with open(log, "w") as err:
        return subprocess.Popen([sys.executable, "train.py", "configs/tiny.yaml", f"out_dir={out}", "wandb.mode=online",
                                 f"wandb.init_timeout={timeout}", "train.max_iters=2", "eval.interval=2",
                                 "attn.enabled=false", "train.peak_flops=1e12"],
                                cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err, preexec_fn=default_sigint)


class Interrupted(Exception):
    pass


def _raise_interrupted(signum, frame):
    raise Interrupted


@pytest.mark.skipif(not hasattr(signal, "pthread_kill"), reason="needs POSIX threads and signals")
def test_a_signal_another_thread_receives_interrupts_the_wait_for_wandb_init():
    """The kernel may hand a process's SIGINT to any of its threads (wandb's, torch's); Python then only
    flags it, for the main thread to notice when it next runs bytecode with reason to look. Here a bystander
    thread takes the signal 0.3 s into an init that takes 2 s (like wandb.init waiting for a silent server)
    and goes back to waiting. Called directly, the handler runs when the init returns; through
    call_interruptibly, at once."""
    bystander_may_end, init_may_return = threading.Event(), threading.Event()

    def bystander():  # catches the SIGINT itself, then blocks: nothing wakes the main thread for it
        time.sleep(0.3)
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)
        bystander_may_end.wait(30)

    def slow_init():
        init_may_return.wait(30)
        return "run"

    def seconds_to_interrupt(call) -> float:
        bystander_may_end.clear()
        init_may_return.clear()
        threading.Timer(2.0, init_may_return.set).start()
        thread = threading.Thread(target=bystander, daemon=True)
        start = time.monotonic()
        thread.start()
        try:
            call(slow_init)
            time.sleep(1.0)  # room for a handler still pending
        except Interrupted:
            return time.monotonic() - start
        finally:
            bystander_may_end.set()
            thread.join()
        pytest.fail("the signal never reached the main thread's handler")

    previous = signal.signal(signal.SIGINT, _raise_interrupted)
    try:
        assert seconds_to_interrupt(lambda fn: fn()) >= 1.9  # the control: hidden until the init returned
        assert seconds_to_interrupt(call_interruptibly) < 1.0
        # the interrupted init goes on, in a daemon thread: it cannot keep the process alive once it exits
        helpers = [t for t in threading.enumerate() if t.name == "attngpt-wandb-init"]
        assert len(helpers) == 1 and helpers[0].daemon and helpers[0].is_alive()
    finally:
        signal.signal(signal.SIGINT, previous)
        init_may_return.set()
    assert call_interruptibly(lambda: 7) == 7
    with pytest.raises(ZeroDivisionError):
        call_interruptibly(lambda: 1 / 0)


@pytest.mark.slow
@pytest.mark.parametrize("sig, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_an_interrupt_while_wandb_waits_for_its_server_ends_the_run_at_once(tmp_path, data_dir, sig, status):
    server, port = silent_server()
    log = tmp_path / "stderr.txt"
    proc = online_train(tmp_path / "run", data_dir, port, log, timeout=120)
    try:
        deadline = time.monotonic() + 120
        while "wandb: connecting to" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.05)
        time.sleep(1.0)  # well inside wandb.init's wait
        before = signal_state(proc.pid)
        sent = time.monotonic()
        proc.send_signal(sig)
        try:
            rc = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:  # make a hang diagnosable: faulthandler dumps every thread's stack
            after = signal_state(proc.pid)
            proc.send_signal(signal.SIGABRT)
            proc.wait(timeout=30)
            pytest.fail(f"still running 60 s after {sig.name}; signal masks before it: {before}; after: {after}; "
                        f"this process: {signal.getsignal(signal.SIGINT)}, blocked "
                        f"{signal.pthread_sigmask(signal.SIG_BLOCK, [])}; its stacks:\n{log.read_text()[-6000:]}")
        waited = time.monotonic() - sent
    finally:
        proc.kill()
        proc.wait()
        server.close()
    stderr = log.read_text()
    assert rc == status, (rc, stderr[-2000:])
    assert waited < 10, f"exited {waited:.1f} s after {sig.name}"  # wandb would wait out its 120 s
    assert "Traceback" not in stderr and "waiting up to 120 s: wandb.init_timeout" in stderr, stderr[-2000:]
    assert stderr.strip().splitlines()[-1] in ("train.py: interrupted",
                                               "train.py: terminated (SIGTERM) outside the training loop; "
                                               "checkpoints on disk are intact")


@pytest.mark.slow
def test_online_without_a_server_gives_up_after_init_timeout_and_trains(tmp_path, data_dir):
    server, port = silent_server()
    log = tmp_path / "stderr.txt"
    proc = online_train(tmp_path / "run", data_dir, port, log, timeout=2)
    try:
        rc = proc.wait(timeout=85)  # ignoring wandb.init_timeout=2 would wait out wandb's default 90 s
    finally:
        proc.kill()
        proc.wait()
        server.close()
    stderr = log.read_text()
    assert rc == 0, stderr[-2000:]
    assert "waiting up to 2 s: wandb.init_timeout" in stderr
    assert "warning: wandb could not start" in stderr and "logging to metrics.jsonl only" in stderr
    assert (tmp_path / "run" / "latest").is_dir()
