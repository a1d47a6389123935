"""The hospital's gate in each forked ClientApp: approval, signature and site policy before any bundle code runs,
and what the audit log of every message records.

Flower's ``run_clientapp`` (``flwr/supernode/runtime/run_clientapp.py``) pulls the task's inputs
(``pull_task_input``: the message, the run's context and config, the app bundle), installs the bundle
(``install_from_fab``), imports and runs the ClientApp, and pushes the reply (``push_message``). The warm
launcher's child wraps those three module-level functions before it calls ``run_clientapp``:

- ``pull_task_input``: remembers the message type and round, the run config and the bundle, and resolves the
  values the ClientApp will use (:func:`hospitrust.ops.deploy.policy.resolve`: task, classes, local epochs, batch
  size, images per epoch) into ``context.node_config["hospitrust-gate"]``; the policy is checked against those,
  and a bundle that declares ``[tool.hospitrust] gate-values = 1`` in its pyproject.toml uses them and nothing
  else (with a site policy, a bundle that does not declare it is refused); it also remembers the run id (Flower's
  ``Run``) and the message's ``server-round`` (its config), which ``max-images-per-round``'s count is kept by;
- ``install_from_fab``: recomputes the bundle's SHA-256 from its bytes (never from the message) and checks it
  against the hospital's revocation list, approvals, a trusted signature, and the site policy; then installs
  the accepted bundle (into a temporary folder, renamed into place) and checks that the folder Flower will
  import from holds exactly the bundle's files with their hashes (Flower skips the install when the folder
  exists, and imports whatever is in it). Then it counts a train message's images with the others of its run's round
  (:func:`charge_round`: ``max-images-per-round`` holds for a round, not per message). A refusal is raised *here*,
  so nothing of the bundle is imported,
  and Flower's own error path sends the server an error reply with the reason (raised earlier, no reply would
  go and the server would wait out ``reply-timeout``). A revoked bundle's install folders are removed;
- ``push_message``: reports what the reply carries (names, shapes, bytes; no values) on the claim pipe.

The audit log is written by the launcher (``hospitrust.supervision.launcher``), not here: ``install_from_fab``
sends the decision on the decision pipe and closes it before Flower imports the bundle (the gate's own install
copies and checks files, it runs none of them), so what the log records as decided was decided before any of the
bundle's code ran; what ``push_message`` reports comes after the bundle's code ran in this process, and the log
marks it as the app's own claim. The child removes the gate's paths (approvals, signers, policy, audit log and
key) from its environment before the bundle is imported (:func:`scrub_environment`).

This module is the hospital's own installed hospitrust, imported by the launcher before it forks: the bundle's
code cannot change it. Everything it needs is imported at module level for that reason (the child removes the
launcher's hospitrust modules so that the ClientApp imports the bundle's).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import sys
import tempfile
import tomllib
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from hospitrust.ops.deploy import audit
from hospitrust.ops.deploy.approval import (SIGNATURE_KEY, Approvals, check_installed, installed_files, load_trusted, short,
                                           verify)
from hospitrust.errors import DeployError
from hospitrust.ops.deploy.policy import (GATE_KEY, GATE_VALUES_VERSION, SECAGG_CONFIGS, Agreed, RoundLedger, count_refusal,
                                          load_policy, message_kind, refusal, resolve, trains)

APPROVALS_ENV = "HOSPITRUST_APPROVED_APPS"
TRUSTED_ENV = "HOSPITRUST_TRUSTED_SIGNERS"
POLICY_ENV = "HOSPITRUST_SITE_POLICY"
AUDIT_ENV = "HOSPITRUST_AUDIT_LOG"
AUDIT_KEY_ENV = "HOSPITRUST_AUDIT_KEY"  # the audit log's HMAC key file (default: the log's path + .key)
IMAGES_ENV = "HOSPITRUST_HOSPITAL_IMAGES"  # this hospital's image count, from the data check before it started
TASK_STATE = "hospitrust-gate-task"  # context.state: the task the gate accepted in this run (for task-less messages)
LEGACY_TRAIN_CONFIG = "fitins.config"  # a SecAgg+ train message's config (Flower's legacy FitIns record)


REVOKED_BUNDLE = "refused: app bundle revoked by this hospital"
REVOKED_KEY = "refused: app signed by a revoked key"
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

    @property
    def round_ledger(self) -> Path | None:
        """The site policy's round count (:class:`RoundLedger`), one per policy file: in the service user's state
        (``$XDG_STATE_HOME/hospitrust/gate/``, beside the audit log's state), named for the policy's full path.
        """
        if self.policy is None:
            return None
        full = str(Path(self.policy).expanduser().resolve())
        return audit.state_dir().parent / "gate" / f"images-per-round.{hashlib.sha256(full.encode()).hexdigest()[:16]}.json"

    def private_files(self) -> list[Path]:
        """The files a ClientApp must neither read nor write: approvals (with the revocation list), signers, site
        policy and its round count, audit log, its key, head and state (which records, outside the log's folder, that
        it was started).
        """
        files = [p for p in (self.approvals, self.trusted, self.policy) if p is not None]
        if self.round_ledger is not None:
            files += [self.round_ledger, RoundLedger(self.round_ledger).lock_path]
        if self.audit_log is not None:
            files += [self.audit_log, audit.key_path(self.audit_log, self.audit_key), audit.head_path(self.audit_log),
                      audit.state_path(self.audit_log)]
        return files

    def check_files(self) -> None:
        """At the launcher's start: a broken policy or signers file stops the SuperNode, not the first message."""
        if self.policy is not None:
            load_policy(self.policy)
            RoundLedger(cast(Path, self.round_ledger)).load()  # a damaged count stops it too (never begun afresh)
        if self.trusted is not None:
            load_trusted(self.trusted)
        if self.approvals is not None:
            Approvals(self.approvals).load()
        if self.audit_log is not None:
            audit.check(self.audit_log, self.audit_key)  # key (made 0600 if default), format, head, not wiped (state)


def scrub_environment(environ: Any = None) -> list[str]:
    """Remove the gate's paths from this process's environment (a ClientApp child's, before the bundle is
    imported); returns the names removed.
    """
    environ = os.environ if environ is None else environ
    return [name for name in PRIVATE_ENV if environ.pop(name, None) is not None]


def declared_gate_values(content: bytes) -> int:
    """The ``[tool.hospitrust] gate-values`` a bundle's pyproject.toml declares (0: none, or not readable)."""
    try:
        with zipfile.ZipFile(io.BytesIO(content)) as zf:
            raw = tomllib.loads(zf.read("pyproject.toml").decode())
        value = raw.get("tool", {}).get("hospitrust", {}).get("gate-values", 0)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0
    except (zipfile.BadZipFile, KeyError, UnicodeDecodeError, tomllib.TOMLDecodeError, AttributeError):
        return 0


def decide(config: GateConfig, content: bytes, message_type: str, msg_config: dict[str, Any],
           run_config: dict[str, Any], secagg: dict[str, Any] | None = None, agreed: Agreed | None = None) -> str | None:
    """None when this hospital runs the message, else the reason (a str starting ``refused``).

    ``agreed``: the values the ClientApp will use (:func:`resolve`, from the same message when not given).
    """
    sha = hashlib.sha256(content).hexdigest()
    if agreed is None:
        agreed = resolve(message_type, msg_config, run_config, hospital_images=config.hospital_images)
    max_age = None
    try:
        policy = load_policy(config.policy) if config.policy is not None else None
        if policy is not None and policy.max_signature_age_days is not None:
            max_age = policy.max_signature_age_days * 86400
        store = Approvals(config.approvals) if config.approvals is not None else None
        revoked_keys: set[str] = set()
        if store is not None:  # the revocation list first: a revoked bundle is refused whatever approves or signs it
            if store.revoked_bundle(sha) is not None:
                return f"{REVOKED_BUNDLE} (sha256 {sha})"
            revoked_keys = {r.key for r in store.load_revoked() if r.key}
        if store is not None or config.trusted is not None:
            signature = str(run_config.get(SIGNATURE_KEY, "") or "")
            approved = store is not None and store.is_approved(sha)
            if not approved:
                if not signature or config.trusted is None:
                    return f"refused: app not approved (sha256 {sha})"
                why = verify(signature, sha, load_trusted(config.trusted), max_age_seconds=max_age,
                             revoked_keys=revoked_keys)
                if why is not None:
                    return f"refused: {why}"
        # a count that is none (NaN, inf, 0): refused with or without a policy, so the refusal is on the record
        if (bad := count_refusal(message_type, msg_config, run_config)) is not None:
            return f"refused: {bad}"
        if policy is not None:
            if declared_gate_values(content) < GATE_VALUES_VERSION:
                return ("refused: the bundle does not declare that it uses this hospital's gate values "
                        f"([tool.hospitrust] gate-values = {GATE_VALUES_VERSION} in its pyproject.toml), so the site "
                        "policy could not bind what it runs")
            rule = refusal(policy, message_type, msg_config, run_config, hospital_images=config.hospital_images,
                           secagg=secagg, agreed=agreed)
            if rule is not None:
                return f"refused by site policy: {rule}"
    except DeployError as exc:  # the hospital's own files are broken: refuse, and say so in its log
        return f"refused: this hospital's gate configuration is broken ({exc})"
    return None


def _purge_bytecode(folder: Path, expected: dict[str, str]) -> None:
    """Remove ``__pycache__`` folders the bundle does not have: Python would run their bytecode instead of the
    checked sources (they are caches; gated children write none, see :func:`install`).
    """
    keep = {Path(name).parent for name in expected}
    for root, dirs, _ in os.walk(folder):
        for d in list(dirs):
            path = Path(root) / d
            if d == "__pycache__" and not path.is_symlink() and path.relative_to(folder) not in keep:
                shutil.rmtree(path, ignore_errors=True)
                dirs.remove(d)


def install_verified(content: bytes, target: Path, install_fab: Callable[..., Path]) -> tuple[str, str] | None:
    """Install an accepted bundle into ``target`` (the folder Flower imports it from) unless it is there, then
    check the folder: None when it holds exactly the bundle's files with their hashes, else (public, detail).

    ``install_fab`` is Flower's ``install_from_fab``; it installs into a temporary folder beside ``target``, which
    is then renamed into place, so a concurrent message never sees a half-copied folder.
    """
    expected = installed_files(content)
    if target.is_dir() and not target.is_symlink():
        _purge_bytecode(target, expected)
    elif not target.exists() and not target.is_symlink():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".hospitrust-install-", dir=target.parent) as tmp:
            installed = Path(install_fab(content, install_dir=Path(tmp), skip_prompt=True))
            try:
                os.rename(installed, target)
            except OSError:
                pass  # another message's child installed it meanwhile: checked below like any existing folder
    return check_installed(target, expected)


def remove_installs(apps: Path, sha: str) -> list[Path]:
    """Remove the install folders of a (revoked) bundle: ``<publisher>.<name>.<version>.<first 8 hex>``."""
    gone = []
    for folder in apps.glob(f"*.{short(sha)}") if apps.is_dir() else []:
        if folder.is_symlink() or not folder.is_dir():
            folder.unlink(missing_ok=True)
        else:
            shutil.rmtree(folder, ignore_errors=True)
        gone.append(folder)
    return gone


def charge_round(config: GateConfig, seen: dict[str, Any]) -> tuple[str | None, Callable[[], None] | None]:
    """Count an accepted train message's images with those of its run's round (``max-images-per-round``, from the
    message as ``pull_task_input`` saw it: ``seen``): (None, a refund to call should the message not run after
    all), or (the refusal, None). Nothing to count (no such rule, no training): (None, None).
    """
    if config.policy is None:
        return None, None
    try:
        policy = load_policy(config.policy)
        limit, run_limit = policy.max_images_per_round, policy.max_images_per_run
        if (limit is None and run_limit is None) or not trains(seen.get("message_type", ""), seen.get("msg_config", {}),
                                                               seen.get("secagg")):
            return None, None
        agreed = seen.get("agreed")
        images = agreed.images_per_round if isinstance(agreed, Agreed) else None
        key = "max-images-per-round" if limit is not None else "max-images-per-run"
        if images is None:  # refusal() has refused it already
            return f"refused by site policy: {key}: the message's images are unknown", None
        server_round = seen.get("round")
        if server_round is None:
            return (f"refused by site policy: {key}: the message's server-round is not a number, so its "
                    "images cannot be counted with its round's"), None
        ledger = RoundLedger(cast(Path, config.round_ledger))
        who = {"hospital": str(seen.get("hospital", "")), "run_id": int(seen.get("run_id", 0)), "server_round": server_round}
        why, total = ledger.charge(**who, images=images, limit=limit, run_limit=run_limit)
    except DeployError as exc:
        return f"refused: this hospital's gate configuration is broken ({exc})", None
    if why is not None:
        return f"refused by site policy: {why}", None
    seen["images_this_round"] = total

    def refund() -> None:
        seen.pop("images_this_round", None)
        try:
            ledger.refund(**who, images=images)
        except (DeployError, OSError):  # no longer the service user: the count stays (it refuses more, never less)
            pass

    return None, refund


def _round(msg_config: dict[str, Any]) -> int | None:
    """The message's server round for the audit entry; None when it is no number (``int()`` of a NaN or text round
    raised in ``pull_task_input``, before the gate decided: no reply, and no decision on the record).
    """
    value = msg_config.get("server-round", 0)
    try:
        return int(value or 0)
    except (TypeError, ValueError, OverflowError):
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


def install(config: GateConfig, decision_fd: int | None = None, claim_fd: int | None = None,
            accepted: Callable[[Path], None] | None = None) -> None:
    """Wrap Flower's ``pull_task_input``, ``install_from_fab`` and ``push_message`` in this (forked) process.

    ``decision_fd``: the pipe on which the decision goes to the launcher, closed before the bundle is imported;
    ``claim_fd``: the pipe on which what the reply carries goes (after the bundle's code ran: its claim).
    ``accepted``: called with the install folder once the bundle is accepted, installed and checked, before the
    decision is sent and before any of the bundle is imported (the launcher's confinement: the site policy's CPU
    and memory limits, the ClientApp's own user); an exception from it refuses the message, with its reason.
    """
    from flwr.cli.config_utils import get_fab_metadata
    from flwr.common.config import get_flwr_home, get_project_dir
    from flwr.common.constant import APP_DIR
    from flwr.supernode.runtime import run_clientapp as rc

    sys.dont_write_bytecode = True  # no bytecode beside the checked sources: the next message checks the same folder
    apps = get_flwr_home() / APP_DIR
    seen: dict[str, Any] = {}
    fds = {"decision": decision_fd, "claim": claim_fd}
    pull, install_fab, push = rc.pull_task_input, rc.install_from_fab, rc.push_message

    def pull_task_input(client):
        from flwr.app import ConfigRecord

        message, context, run, fab = pull(client)
        records = message.content.config_records if message.has_content() else {}
        # a SecAgg+ train message carries its train config in Flower's legacy FitIns record
        msg_config = dict(records.get("config", records.get(LEGACY_TRAIN_CONFIG, {})))
        secagg = records.get(SECAGG_CONFIGS)
        remembered = context.state.config_records.get(TASK_STATE)
        message_type, run_config = str(message.metadata.message_type), dict(context.run_config)
        # what the ClientApp will use, resolved here by the hospital's own code and handed to it
        agreed = resolve(message_type, msg_config, run_config, hospital_images=config.hospital_images,
                         remembered_task=str(remembered["json"]) if remembered is not None and "json" in remembered else None)
        context.node_config[GATE_KEY] = agreed.to_json()
        seen.update(message_type=message_type, run_id=int(run.run_id), fab=fab.content,
                    msg_config=msg_config, run_config=run_config, agreed=agreed, context=context,
                    round=_round(msg_config),
                    hospital=str(dict(context.node_config).get("hospital", "") or ""),
                    secagg=dict(secagg) if secagg is not None else None,
                    fab_id=str(run.fab_id), fab_version=str(run.fab_version), fab_hash=str(fab.hash_str))
        if agreed.task and (remembered is None or remembered.get("json") != agreed.task):
            seen["remember"] = ConfigRecord({"json": agreed.task})  # kept once the message is accepted
        return message, context, run, fab

    def install_from_fab(content, *args, **kwargs):
        sha = hashlib.sha256(content).hexdigest()
        seen["sha256"] = sha
        reason = decide(config, content, seen.get("message_type", ""), seen.get("msg_config", {}), seen.get("run_config", {}),
                        seen.get("secagg"), seen.get("agreed"))
        detail = ""
        if config.approvals is not None:  # a revoked bundle's install folders go, whichever bundle this message runs
            try:
                for revoked in Approvals(config.approvals).load_revoked():
                    if revoked.sha256:
                        remove_installs(apps, revoked.sha256)
            except DeployError:
                pass  # decide() has refused already, naming the broken file
        target = None
        if reason is None:
            try:
                fab_id, fab_version = get_fab_metadata(content)
                target = get_project_dir(fab_id, fab_version, sha)
            except Exception as exc:  # noqa: BLE001 - Flower's own errors for a bundle without valid metadata
                reason = f"refused: the bundle's pyproject.toml has no valid app metadata ({type(exc).__name__})"
            else:
                run_says = (seen.get("fab_id"), seen.get("fab_version"), seen.get("fab_hash"))
                if run_says != (fab_id, fab_version, sha):  # else Flower would import from another folder than this
                    reason = (f"refused: the run names app {run_says[0]} {run_says[1]} ({short(str(run_says[2]))}), but "
                              f"the bundle sent is {fab_id} {fab_version} ({short(sha)})")
                elif target.parent != apps:
                    reason = f"refused: the bundle's app name or version does not make one folder under {APP_DIR}/"
        if reason is None and target is not None:
            problem = install_verified(content, target, install_fab)
            if problem is not None:
                reason, detail = f"refused: {problem[0]}", problem[1]
        refund = None
        if reason is None and target is not None:  # the last check: a message counted is one that runs
            reason, refund = charge_round(config, seen)
        if reason is None and target is not None and config.audit_log is not None and seen.get("secagg") is None and \
                trains(seen.get("message_type", ""), seen.get("msg_config", {})):  # SecAgg+'s stages: left as Flower makes them
            try:  # read now, as the service user (the ClientApp's user cannot): the reply carries it (push_message)
                seen["audit_head"] = audit.current_head(config.audit_log, config.audit_key)
            except DeployError:
                pass  # a head that does not verify: the launcher's entry for this message says so; nothing to anchor
        if reason is None and target is not None and accepted is not None:
            try:
                accepted(target)
            except Exception as exc:  # noqa: BLE001 - a ClientApp that cannot be confined does not run
                reason = f"refused: the ClientApp could not be confined ({type(exc).__name__}: {exc})"
                if refund is not None:
                    refund()
        # the decision leaves this process, and its pipe is closed, before any of the bundle is imported
        _report(fds, "decision", {"app_sha256": sha, "message": message_kind(seen.get("message_type", ""), seen.get("msg_config", {})),
                              "round": seen.get("round"), "decision": "refused" if reason is not None else "accepted",
                              **({"reason": reason[:2000]} if reason is not None else {}),
                              **({"agreed": seen["agreed"].summary()} if "agreed" in seen else {}),
                              **({"images_this_round": seen["images_this_round"]} if "images_this_round" in seen else {})})
        if reason is not None:
            seen["refused"] = reason
            if reason.startswith((REVOKED_BUNDLE, REVOKED_KEY)):
                remove_installs(apps, sha)
            hint = ""
            if reason.startswith("refused: app not approved") and config.approvals is not None:
                pending = Approvals(config.approvals).keep_pending(sha, content)
                hint = (f"; review it: hospitrust app review {pending} --approvals {config.approvals}, then "
                        f"hospitrust app approve {pending} --approvals {config.approvals}")
            print(f"hospitrust gate: {reason} (run {seen.get('run_id')}, {seen.get('message_type')} message, bundle "
                  f"{short(sha)}){hint}{f' [{detail}]' if detail else ''}", file=sys.stderr, flush=True)
            # at the query round the server learns who refused the way it learns who cannot join (discovery)
            query = message_kind(seen.get("message_type", ""), {}) == "query" and seen.get("hospital")
            raise Refused(f"hospital '{seen['hospital']}' cannot join: {reason}" if query else reason)
        if "remember" in seen:  # a later message of this run without a task (SecAgg+'s key stages) uses this one
            seen["context"].state.config_records[TASK_STATE] = seen["remember"]
        return target

    def push_message(client, message, context):
        _report(fds, "claim", audit.describe_reply(message))  # after the bundle's code ran: its claim
        head = seen.get("audit_head")
        if head is not None and message.has_content():  # the gate's, not the app's: the log's head at this message
            from flwr.app import ConfigRecord

            message.content[audit.ANCHOR_RECORD] = ConfigRecord({"entries": int(head[0]), "mac": str(head[1])})
        return push(client, message, context)

    rc.pull_task_input, rc.push_message = pull_task_input, push_message
    rc.install_from_fab = install_from_fab  # type: ignore[assignment]  # same call, wrapped
