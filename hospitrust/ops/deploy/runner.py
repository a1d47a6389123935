"""``hospitrust deploy run``: submit a run, watch it, and resume it by itself after a crash.

A ServerApp dies with its SuperLink (or is killed on its own): Flower then ends the run
``finished:failed``. hospitrust checkpoints the server's state after every round, so the same run
config with ``resume-from`` set to the run directory continues from the round after the checkpoint and
ends with the model an unbroken run would have given. This supervisor does that without a person:

- it submits the run (``flwr run``, through the operator's connection) and polls its status;
- while the SuperLink cannot be reached (restarting), it waits, up to ``unreachable_timeout``;
- ``finished:completed``: done, exit 0. ``finished:stopped``: the operator stopped it, exit 1, no resubmit;
- ``finished:failed``: it resubmits with ``resume-from="<output-dir>/<run-name>"``; if that finds no
  checkpoint (no round had finished), the next attempt starts the run again in the same directory;
- it gives up after ``attempts`` submissions, or when an attempt made no progress after the previous one
  also made none (a run that fails for its own reasons: a config the ServerApp refuses).

Progress is the last round in the run directory's ``checkpoint.pt`` (written since this supervisor started),
read where the run directory is visible (the supervisor on the SuperLink machine, or a shared folder). The
ServerApp's log is only the fallback when it is not: a log read after a crash can miss the rounds the run
finished (``flwr log`` of a run whose SuperLink died), and counting from it made two crashes in a row look
like two attempts without progress.

What is lost: the round in flight when the crash came (its replies and its work at the hospitals). Every
attempt is appended to a JSON-lines record (run id, resume or fresh, times, status, rounds reached).
"""

from __future__ import annotations

import json
import pickle
import re
import time
from collections.abc import Callable
from pathlib import Path

from hospitrust.errors import DeployError

ROUND_LINE = re.compile(r"round\s+(\d+)/(\d+)")  # the ServerApp's progress line, one per finished round
RESUMED_LINE = re.compile(r"hospitrust: resuming .* after round (\d+)")  # a resumed ServerApp's first line
NO_CHECKPOINT = "no checkpoint at"  # what resume-from says when the crash came before round 1 finished


def run_identity(values: dict[str, object]) -> tuple[Path, str]:
    """The run directory on the SuperLink machine, from the run config's ``output-dir`` and ``run-name``."""
    name, out = str(values.get("run-name", "") or ""), str(values.get("output-dir", "") or "")
    if not name:
        raise DeployError("hospitrust deploy run needs run-name in --run-config: it resumes the run by its directory")
    if not out or not Path(out).is_absolute():
        raise DeployError(f"hospitrust deploy run needs an absolute output-dir in --run-config (got {out!r}): the "
                          f"ServerApp runs on the SuperLink machine, in the SuperLink's working directory")
    if "resume-from" in values:
        raise DeployError("leave resume-from out of --run-config: hospitrust deploy run sets it when it resumes")
    return Path(out) / name, name


MTIME_SLACK_SECONDS = 1.0


class RunSupervisor:
    """Submit, watch and resume one run (see the module docstring)."""

    def __init__(self, app: Path, connection: str, run_config: str, *, record: Path, work: Path, attempts: int = 5,
                 poll: float = 5.0, unreachable_timeout: float = 3600.0, env: dict[str, str] | None = None,
                 say: Callable[[str], None] = print) -> None:
        from hospitrust.ops.simulate import parse_overrides

        if attempts < 1:
            raise DeployError(f"--attempts {attempts}: expected at least 1")
        self.app, self.connection, self.run_config = Path(app), connection, run_config.strip()
        self.run_dir, self.name = run_identity(parse_overrides([self.run_config]))
        self.record, self.work, self.attempts, self.poll = Path(record), Path(work), attempts, poll
        self.unreachable_timeout, self.env, self.say = unreachable_timeout, env, say
        self.since = time.time()  # a checkpoint older than this belongs to an earlier run of the same name

    def checkpointed(self) -> tuple[int, str] | None:
        """(rounds in the run directory's checkpoint, "checkpoint"); (0, "checkpoint") if it has none written
        since this supervisor started; None when the run directory's parent (output-dir) is not on this machine.
        """
        from hospitrust.server_app.checkpoint import CHECKPOINT_FILE

        if not self.run_dir.parent.is_dir():
            return None
        path = self.run_dir / CHECKPOINT_FILE
        try:
            # a file's mtime comes from the kernel's coarse clock, up to a tick behind time.time(): a checkpoint
            # written right after the supervisor started can look older than it without the slack
            if path.stat().st_mtime < self.since - MTIME_SLACK_SECONDS:
                return 0, "checkpoint"
            import torch

            return int(torch.load(path, map_location="cpu", weights_only=True)["round"]), "checkpoint"
        except FileNotFoundError:
            return 0, "checkpoint"
        except (OSError, RuntimeError, KeyError, TypeError, ValueError, pickle.UnpicklingError) as exc:  # unreadable: the log
            self.say(f"hospitrust deploy run: cannot read {path} ({type(exc).__name__}: {str(exc)[:200]}); "
                     f"counting rounds from the log")
            return None

    def _submit(self, resume: bool) -> int:
        from hospitrust.ops import flwr

        config = self.run_config + (f' resume-from="{self.run_dir}"' if resume else "")
        return flwr.submit_run(self.app, self.connection, run_config=config, env=self.env or flwr.flower_env(),
                               cwd=self.work)

    def _watch(self, run_id: int) -> tuple[str, str]:
        """Poll until the run has finished; ("unreachable", ...) if the SuperLink stays away too long."""
        from hospitrust.ops import flwr

        away_since: float | None = None
        while True:
            status, details = flwr.run_status(run_id, self.connection, env=self.env, cwd=self.work)
            if status.startswith("finished"):
                return status, details
            if status == "unknown":  # flwr could not reach the SuperLink (restarting) or read the answer
                away_since = away_since or time.monotonic()
                if time.monotonic() - away_since > self.unreachable_timeout:
                    return "unreachable", f"the SuperLink did not answer for {self.unreachable_timeout:.0f} s: {details[-300:]}"
            else:
                away_since = None
            time.sleep(self.poll)

    def _log(self, run_id: int) -> str:
        from hospitrust.ops import flwr

        res = flwr.flwr_cli(["log", str(run_id), self.connection, "--show"], env=self.env, cwd=self.work, timeout=120)
        return res.stdout + res.stderr

    def _write(self, entry: dict) -> None:
        self.record.parent.mkdir(parents=True, exist_ok=True)
        with self.record.open("a") as fh:
            fh.write(json.dumps(entry) + "\n")

    def run(self) -> int:
        resume, last_rounds, stalled = False, 0, 0
        for attempt in range(1, self.attempts + 1):
            run_id = self._submit(resume)
            started = time.time()
            self.say(f"hospitrust deploy run: attempt {attempt}/{self.attempts}: run {run_id}"
                     + (f", resuming {self.run_dir}" if resume else ""))
            status, details = self._watch(run_id)
            log = self._log(run_id) if status != "unreachable" else ""
            counted = self.checkpointed()
            if counted is not None:
                rounds, source = counted
                no_checkpoint = rounds == 0  # the crash came before any round finished: nothing to resume from
            else:
                found = [int(m.group(1)) for m in (*ROUND_LINE.finditer(log), *RESUMED_LINE.finditer(log))]
                rounds, source = max(found, default=last_rounds if resume else 0), "log"
                no_checkpoint = resume and NO_CHECKPOINT in log
            self._write({"attempt": attempt, "run_id": run_id, "resume_from": str(self.run_dir) if resume else "",
                         "submitted": round(started, 3), "ended": round(time.time(), 3), "status": status,
                         "details": details[-500:], "rounds_reached": rounds, "rounds_from": source})
            self.say(f"hospitrust deploy run: run {run_id} ended {status}" + (f" ({details.strip()[:200]})" if details.strip() else "")
                     + f"; rounds reached: {rounds}")
            if status == "finished:completed":
                return 0
            if status in ("finished:stopped", "unreachable"):
                return 1
            if not (resume and no_checkpoint):
                stalled = stalled + 1 if rounds <= last_rounds else 0
            if stalled >= 2:
                self.say("hospitrust deploy run: two attempts in a row made no progress: not resubmitting (see flwr log)")
                return 1
            last_rounds = max(last_rounds, rounds)
            resume = not no_checkpoint  # resume from the last checkpoint; start again if there was none
        self.say(f"hospitrust deploy run: {self.attempts} attempts used; the record is in {self.record}")
        return 1
