"""engine.finetune.jobs: how a job's state is read from its directory and its worker's process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from engine.finetune.jobs import JobStatus, read_job

pytestmark = pytest.mark.unit


def _job(tmp_path, state: str, pid: int | None, started: float):
    d = tmp_path / "20261205-000000-abcdef"
    d.mkdir()
    (d / "status.json").write_text(json.dumps(JobStatus(d.name, state, pid=pid, started=started,
                                                        updated=started).to_dict()))
    return d


@pytest.fixture
def fresh_process():
    """A process that does not name any job dir, as a worker between fork and exec does not."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_starting_job_whose_worker_has_not_exec_d_yet_is_still_starting(tmp_path, fresh_process):
    # the race CI hit on 2026-12-05: read right after Popen, the child still had pytest's command line
    d = _job(tmp_path, "starting", fresh_process.pid, started=time.time() - 2)
    assert read_job(d).state == "starting"


def test_a_starting_job_on_a_reused_pid_is_failed(tmp_path):
    # this test process existed long before the job was created: not its worker
    d = _job(tmp_path, "starting", os.getpid(), started=time.time() + 60)
    st = read_job(d)
    assert st.state == "failed" and "killed or crashed" in st.message


def test_a_running_job_needs_its_worker_to_name_the_job_dir(tmp_path, fresh_process):
    d = _job(tmp_path, "running", fresh_process.pid, started=time.time() - 2)
    assert read_job(d).state == "failed"


def test_a_job_whose_worker_ended_without_a_final_state_is_failed(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    d = _job(tmp_path, "starting", proc.pid, started=time.time() - 2)
    assert read_job(d).state == "failed"


def test_a_job_that_never_got_a_worker_fails_after_two_minutes(tmp_path):
    d = _job(tmp_path, "starting", None, started=time.time() - 121)
    st = read_job(d)
    assert st.state == "failed" and "never started" in st.message
    (tmp_path / "young").mkdir()
    assert read_job(_job(tmp_path / "young", "starting", None, started=time.time())).state == "starting"
