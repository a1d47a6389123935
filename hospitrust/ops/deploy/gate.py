"""The hospital's gate in each forked ClientApp: approval, signature and site policy before any bundle code runs,
and what the audit log of every message records.

Flower's ``run_clientapp`` (``flwr/supernode/runtime/run_clientapp.py``) pulls the task's inputs
(``pull_task_input``: the message, the run's context and config, the app bundle), installs the bundle
(``install_from_fab``), imports and runs the ClientApp, and pushes the reply (``push_message``). The warm
launcher's child wraps those three module-level functions before it calls ``run_clientapp``:

- ``pull_task_input``: remembers the message type and round, the run config and the bundle;
- ``install_from_fab``: recomputes the bundle's SHA-256 from its bytes (never from the message) and checks it
  against the hospital's approvals, a trusted signature, and the site policy. A refusal is raised *here*, so
  nothing of the bundle is installed or imported, and Flower's own error path sends the server an error reply
  with the reason (raised earlier, no reply would go and the server would wait out ``reply-timeout``);
- ``push_message``: reports what the reply carries (names, shapes, bytes; no values) on the claim pipe.

The audit log is written by the launcher (``hospitrust.supervision.launcher``), not here: ``install_from_fab``
sends the decision on the decision pipe and closes it before Flower installs and imports the bundle, so what the
log records as decided was decided before any of the bundle's code ran; what ``push_message`` reports comes
after the bundle's code ran in this process, and the log marks it as the app's own claim. The child removes
the gate's paths (approvals, signers, policy, audit log and key) from its environment before the bundle is
imported (:func:`scrub_environment`).

This module is the hospital's own installed hospitrust, imported by the launcher before it forks: the bundle's
code cannot change it. Everything it needs is imported at module level for that reason (the child removes the
launcher's hospitrust modules so that the ClientApp imports the bundle's).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hospitrust.ops.deploy import audit
from hospitrust.ops.deploy.approval import SIGNATURE_KEY, Approvals, load_trusted, short, verify
from hospitrust.errors import DeployError
from hospitrust.ops.deploy.policy import SECAGG_CONFIGS, load_policy, message_kind, refusal

APPROVALS_ENV = "HOSPITRUST_APPROVED_APPS"
TRUSTED_ENV = "HOSPITRUST_TRUSTED_SIGNERS"
POLICY_ENV = "HOSPITRUST_SITE_POLICY"
AUDIT_ENV = "HOSPITRUST_AUDIT_LOG"
AUDIT_KEY_ENV = "HOSPITRUST_AUDIT_KEY"  # the audit log's HMAC key file (default: the log's path + .key)
IMAGES_ENV = "HOSPITRUST_HOSPITAL_IMAGES"  # this hospital's image count, from the data check before it started
#: What a ClientApp must not see: where the hospital's approvals, signers, policy, audit log and its key are.
PRIVATE_ENV = (APPROVALS_ENV, TRUSTED_ENV, POLICY_ENV, AUDIT_ENV, AUDIT_KEY_ENV)


class Refused(Exception):
    """A message this hospital will not run; its text is the reason the server records."""


@dataclass(frozen=True)
class GateConfig:
    approvals: Path | None = None
    trusted: Path | None = None
    policy: Path | None = None
    audit_log: Path | None = None
    hospital_images: int | None = None
    audit_key: Path | None = None

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> GateConfig:
        env = dict(os.environ if env is None else env)

        def path(key: str) -> Path | None:
            return Path(env[key]).expanduser().resolve() if env.get(key) else None

        images = env.get(IMAGES_ENV, "")
        return cls(path(APPROVALS_ENV), path(TRUSTED_ENV), path(POLICY_ENV), path(AUDIT_ENV),
                   int(images) if images.isdigit() else None, path(AUDIT_KEY_ENV))

    @property
    def active(self) -> bool:
        return any((self.approvals, self.trusted, self.policy, self.audit_log))

    def check_files(self) -> None:
        """At the launcher's start: a broken policy or signers file stops the SuperNode, not the first message."""
        if self.policy is not None:
            load_policy(self.policy)
        if self.trusted is not None:
            load_trusted(self.trusted)
        if self.approvals is not None:
            Approvals(self.approvals).load()
        if self.audit_log is not None:
            audit.check(self.audit_log, self.audit_key)  # the key (created 0600 if it is the default), format, head


def scrub_environment(environ: Any = None) -> list[str]:
    """Remove the gate's paths from this process's environment (a ClientApp child's, before the bundle is
    imported); returns the names removed.
    """
    environ = os.environ if environ is None else environ
    return [name for name in PRIVATE_ENV if environ.pop(name, None) is not None]


def decide(config: GateConfig, content: bytes, message_type: str, msg_config: dict[str, Any],
           run_config: dict[str, Any], secagg: dict[str, Any] | None = None) -> str | None:
    """None when this hospital runs the message, else the reason (a str starting ``refused``)."""
    sha = hashlib.sha256(content).hexdigest()
    max_age = None
    try:
        policy = load_policy(config.policy) if config.policy is not None else None
        if policy is not None and policy.max_signature_age_days is not None:
            max_age = policy.max_signature_age_days * 86400
        if config.approvals is not None or config.trusted is not None:
            signature = str(run_config.get(SIGNATURE_KEY, "") or "")
            approved = config.approvals is not None and Approvals(config.approvals).is_approved(sha)
            if not approved:
                if not signature or config.trusted is None:
                    return f"refused: app not approved (sha256 {sha})"
                why = verify(signature, sha, load_trusted(config.trusted), max_age_seconds=max_age)
                if why is not None:
                    return f"refused: {why}"
        if policy is not None:
            rule = refusal(policy, message_type, msg_config, run_config, hospital_images=config.hospital_images,
                           secagg=secagg)
            if rule is not None:
                return f"refused by site policy: {rule}"
    except DeployError as exc:  # the hospital's own files are broken: refuse, and say so in its log
        return f"refused: this hospital's gate configuration is broken ({exc})"
    return None


def _report(fds: dict[str, int | None], which: str, record: dict) -> None:
    """One JSON line to the launcher on the pipe ``fds[which]``, which is then closed and forgotten (a second
    report on it goes nowhere, never to a file that reused the number).
    """
    fd = fds.pop(which, None)
    if fd is None:
        return
    data = (json.dumps(record, sort_keys=True) + "\n").encode()
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError as exc:  # the launcher went away: the SuperNode is stopping
        print(f"hospitrust gate: could not report to the launcher's audit ({exc.strerror})", file=sys.stderr, flush=True)
    finally:
        os.close(fd)


def install(config: GateConfig, decision_fd: int | None = None, claim_fd: int | None = None) -> None:
    """Wrap Flower's ``pull_task_input``, ``install_from_fab`` and ``push_message`` in this (forked) process.

    ``decision_fd``: the pipe on which the decision goes to the launcher, closed before the bundle is installed;
    ``claim_fd``: the pipe on which what the reply carries goes (after the bundle's code ran: its claim).
    """
    from flwr.supernode.runtime import run_clientapp as rc

    seen: dict[str, Any] = {}
    fds = {"decision": decision_fd, "claim": claim_fd}
    pull, install_fab, push = rc.pull_task_input, rc.install_from_fab, rc.push_message

    def pull_task_input(client):
        message, context, run, fab = pull(client)
        records = message.content.config_records if message.has_content() else {}
        msg_config = dict(records.get("config", {}))
        secagg = records.get(SECAGG_CONFIGS)
        seen.update(message_type=str(message.metadata.message_type), run_id=int(run.run_id), fab=fab.content,
                    msg_config=msg_config, run_config=dict(context.run_config),
                    round=int(msg_config.get("server-round", 0) or 0),
                    hospital=str(dict(context.node_config).get("hospital", "") or ""),
                    secagg=dict(secagg) if secagg is not None else None)
        return message, context, run, fab

    def install_from_fab(content, *args, **kwargs):
        sha = hashlib.sha256(content).hexdigest()
        seen["sha256"] = sha
        reason = decide(config, content, seen.get("message_type", ""), seen.get("msg_config", {}), seen.get("run_config", {}),
                        seen.get("secagg"))
        # the decision leaves this process, and its pipe is closed, before any of the bundle is installed or imported
        _report(fds, "decision", {"app_sha256": sha, "message": message_kind(seen.get("message_type", ""), seen.get("msg_config", {})),
                              "round": seen.get("round"), "decision": "refused" if reason is not None else "accepted",
                              **({"reason": reason[:2000]} if reason is not None else {})})
        if reason is not None:
            seen["refused"] = reason
            hint = ""
            if reason.startswith("refused: app not approved") and config.approvals is not None:
                pending = config.approvals.with_name(config.approvals.stem + ".d") / "pending" / f"{sha}.fab"
                pending.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                pending.write_bytes(content)
                hint = (f"; review it: hospitrust app review {pending} --approvals {config.approvals}, then "
                        f"hospitrust app approve {pending} --approvals {config.approvals}")
            print(f"hospitrust gate: {reason} (run {seen.get('run_id')}, {seen.get('message_type')} message, bundle "
                  f"{short(sha)}){hint}", file=sys.stderr, flush=True)
            # at the query round the server learns who refused the way it learns who cannot join (discovery)
            query = message_kind(seen.get("message_type", ""), {}) == "query" and seen.get("hospital")
            raise Refused(f"hospital '{seen['hospital']}' cannot join: {reason}" if query else reason)
        return install_fab(content, *args, **kwargs)

    def push_message(client, message, context):
        _report(fds, "claim", audit.describe_reply(message))  # after the bundle's code ran: its claim
        return push(client, message, context)

    rc.pull_task_input, rc.push_message = pull_task_input, push_message
    rc.install_from_fab = install_from_fab  # type: ignore[assignment]  # same call, wrapped
