"""Background fine-tuning jobs that survive a page reload (and report a crash as a failure).

A job is a directory ``<jobs root>/<job id>/`` (root: ``$ARITHLAB_JOBS``, default ``.cache/jobs``):

* ``request.json`` -- the CLI arguments of the ``finetune`` run;
* ``status.json``  -- written atomically by the worker: state (``running`` / ``finished`` /
  ``failed`` / ``stopped``), pid, step / total, last loss, message, output directory;
* ``progress.jsonl`` -- one line per optimizer step (the live loss curve);
* ``log.txt`` -- the worker's stdout / stderr;  ``STOP`` -- present once a stop was asked for.

The worker is a separate process (``python -m engine finetune ... --job-dir DIR``) started in its
own session, so it outlives the browser tab and the Streamlit script run that started it.  A job
whose status still says ``running`` but whose process is gone (killed, out of memory, machine
restarted) is reported as ``failed``, never as finished.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import psutil

from engine.paths import REPO_ROOT

if TYPE_CHECKING:
    from engine.finetune.run import FinetuneRequest

STATES = ("starting", "running", "finished", "failed", "stopped")


def jobs_root() -> Path:
    return Path(os.environ.get("ARITHLAB_JOBS") or REPO_ROOT / ".cache" / "jobs")


@dataclass
class JobStatus:
    job_id: str
    state: str
    pid: int | None = None
    step: int = 0
    total_steps: int = 0
    loss: float | None = None
    message: str = ""
    out_dir: str = ""
    started: float = 0.0
    updated: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def done(self) -> bool:
        return self.state in ("finished", "failed", "stopped")


def _write_json(path: Path, obj) -> None:
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


def _alive(pid: int | None, job_dir: Path, *, spawned_after: float | None = None) -> bool:
    """Is ``pid`` a live (non-zombie) worker of this job?

    A worker's command line names the job dir -- except between ``fork`` and ``exec``, when it still
    carries its parent's.  So while the job is ``starting`` (``spawned_after`` = its creation time), a
    process created after the job was is taken as its worker; an older one is a reused pid."""
    if not pid:
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
            return False
        if str(job_dir) in " ".join(proc.cmdline()):
            return True
        return spawned_after is not None and proc.create_time() >= spawned_after - 1.0
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


class JobWriter:
    """Used by the worker process to record its progress."""

    def __init__(self, job_dir: str | Path) -> None:
        self.dir = Path(job_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.status = JobStatus(job_id=self.dir.name, state="running", pid=os.getpid(), started=time.time(),
                                updated=time.time())
        self._progress = (self.dir / "progress.jsonl").open("a", buffering=1)
        self._last_write = 0.0
        self.write()

    def write(self) -> None:
        self.status.updated = time.time()
        _write_json(self.dir / "status.json", self.status.to_dict())

    def progress(self, p) -> None:  # engine.finetune.train.TrainProgress
        self._progress.write(json.dumps({"step": p.step, "loss": p.loss, "lr": p.lr,
                                         "elapsed_s": round(p.elapsed_s, 3)}) + "\n")
        self.status.step, self.status.total_steps, self.status.loss = p.step, p.total_steps, p.loss
        now = time.time()
        if now - self._last_write > 0.5 or p.step == p.total_steps:
            self._last_write = now
            self.write()

    def should_stop(self) -> bool:
        return (self.dir / "STOP").exists()

    def finish(self, state: str, message: str = "", out_dir: str = "") -> None:
        self.status.state, self.status.message = state, message
        if out_dir:
            self.status.out_dir = out_dir
        self._progress.close()
        self.write()


def start_job(cli_args: Sequence[str], *, root: Path | None = None) -> str:
    """Start ``python -m engine finetune <cli_args> --job-dir <dir>`` in the background; returns its id."""
    root = root or jobs_root()
    root.mkdir(parents=True, exist_ok=True)
    job_id = time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)
    job_dir = root / job_id
    job_dir.mkdir()
    args = [sys.executable, "-m", "engine", "finetune", *cli_args, "--job-dir", str(job_dir)]
    _write_json(job_dir / "request.json", {"args": list(cli_args), "created": time.time()})
    _write_json(job_dir / "status.json", JobStatus(job_id, "starting", started=time.time(),
                                                   updated=time.time()).to_dict())
    log = (job_dir / "log.txt").open("ab")
    proc = subprocess.Popen(args, cwd=str(REPO_ROOT), stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()
    st = read_job(job_dir)
    if st.state == "starting":
        st.pid = proc.pid
        _write_json(job_dir / "status.json", st.to_dict())
    return job_id


def start_finetune(request: "FinetuneRequest", *, root: Path | None = None) -> str:
    """Start a background job that runs ``request`` (``engine.finetune.run.FinetuneRequest``); returns its id."""
    return start_job(request.cli_args(), root=root)


def request_args(job_dir: str | Path) -> list[str]:
    """The ``python -m engine finetune`` arguments the job ran (its ``request.json``)."""
    return list(json.loads((Path(job_dir) / "request.json").read_text())["args"])


def read_job(job_dir: str | Path) -> JobStatus:
    """The job's status; a 'running' job whose process died is reported as failed."""
    job_dir = Path(job_dir)
    try:
        raw = json.loads((job_dir / "status.json").read_text())
        st = JobStatus(**raw)
    except (OSError, json.JSONDecodeError, TypeError) as e:
        return JobStatus(job_dir.name, "failed", message=f"unreadable job status ({e})")
    spawned_after = st.started if st.state == "starting" else None
    if st.state in ("running", "starting") and st.pid and not _alive(st.pid, job_dir, spawned_after=spawned_after):
        # the worker may have finished between our two reads: look once more
        try:
            st = JobStatus(**json.loads((job_dir / "status.json").read_text()))
        except (OSError, json.JSONDecodeError, TypeError):
            pass
        if not st.done:
            st.state = "failed"
            st.message = (f"the worker process ({st.pid}) ended without finishing at step "
                          f"{st.step}/{st.total_steps or '?'} -- killed or crashed; see log.txt")
    elif st.state == "starting" and time.time() - st.started > 120:
        st.state, st.message = "failed", "the worker never started; see log.txt"
    return st


def job_dir(job_id: str, *, root: Path | None = None) -> Path:
    if not job_id or "/" in job_id or job_id.startswith("."):
        raise ValueError(f"bad job id {job_id!r}")
    return (root or jobs_root()) / job_id


def job_eta(status: JobStatus) -> float | None:
    """Seconds left of a running job at its pace so far (None before its first step or once it is done)."""
    if status.done or status.step <= 0 or status.total_steps <= status.step or status.updated <= status.started:
        return None
    return (status.updated - status.started) / status.step * (status.total_steps - status.step)


def list_jobs(*, root: Path | None = None) -> list[JobStatus]:
    root = root or jobs_root()
    if not root.is_dir():
        return []
    return [read_job(d) for d in sorted(root.iterdir(), reverse=True) if (d / "status.json").exists()]


def finished_jobs_of(fingerprint: str, *, root: Path | None = None) -> list[tuple[JobStatus, dict]]:
    """(job status, fine-tuning record) of every finished (or stopped) job that tuned the model with this
    fingerprint, newest first (an unreadable record is skipped)."""
    from engine.finetune.errors import FinetuneError
    from engine.finetune.run import read_record
    out = []
    for job in list_jobs(root=root):
        if job.state not in ("finished", "stopped") or not job.out_dir:
            continue
        try:
            record = read_record(job.out_dir)
        except FinetuneError:
            continue
        if record is not None and record.get("base_fingerprint") == fingerprint:
            out.append((job, record))
    return sorted(out, key=lambda jr: -jr[0].updated)


def losses(job_dir: str | Path) -> list[dict]:
    p = Path(job_dir) / "progress.jsonl"
    if not p.exists():
        return []
    out = []
    for line in p.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line being written
    return out


def stop_job(job_dir: str | Path) -> None:
    (Path(job_dir) / "STOP").touch()


def log_tail(job_dir: str | Path, n: int = 20) -> str:
    p = Path(job_dir) / "log.txt"
    if not p.exists():
        return ""
    return "\n".join(p.read_text(errors="replace").splitlines()[-n:])
