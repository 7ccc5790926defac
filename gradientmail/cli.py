"""``gradientmail`` command line: look at a run, export its model, check a round replays.

gradientmail status <mailbox-url> [--rounds N]
gradientmail export <mailbox-url> <file.safetensors>
gradientmail replay <mailbox-url> --fragment F [--version V]
gradientmail audit <mailbox-url> [--digest-log FILE]   (chains, signatures, blobs, replays; exit 1 on any failure)
gradientmail keygen [--out FILE]    (a fresh run key, printed or written to FILE once)
gradientmail node        (a learner node configured by GRADIENTMAIL_* variables; see gradientmail/node.py;
                          `gradientmail node --help` lists every variable with its default)
gradientmail minio-setup [--mailbox URL] --out DIR   (bucket, lifecycle, a user scoped to the run's prefix
                          on MinIO, with its root keys from MINIO_ROOT_*; see gradientmail/minio_setup.py)
gradientmail seaweedfs-setup --identities FILE --out DIR | --bucket   (the same for SeaweedFS: its identity
                          file with a user scoped to the prefix, then bucket and lifecycle; gradientmail/seaweedfs_setup.py)
gradientmail health      (exit 0 when this node's metrics endpoint answers: the images' health check)
gradientmail simulate --table [--json] | --sweep M|H|fragments|quorum|latency|capacity [--out DIR]   (goodput
                          at scale and the largest run each syncer layout sustains, simulated; see docs/simulator.md)
gradientmail --version
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path

from gradientmail import minio_setup, seaweedfs_setup
from gradientmail._version import __version__
from gradientmail.audit import DigestLog, audit_run
from gradientmail.backends import get_backend, payload
from gradientmail.errors import GradientMailError, KeyNotFound
from gradientmail.mailbox import open_mailbox
from gradientmail.records import Lease, keys
from gradientmail.records.auth import RunKey, generate_run_key
from gradientmail.regime import RECENT_ROUNDS, carried_work_hint, link_hint, measure_work_loss, work_loss_hint
from gradientmail.session.ledger import ledger_lines
from gradientmail.session.progress import LEDGER
from gradientmail.session.transfer_meter import LINK, LinkReading
from gradientmail.settings import describe_variables
from gradientmail.simulate import command as simulate_command
from gradientmail.store import RunSpec, RunStore
from gradientmail.syncer import replay_round


@contextlib.contextmanager
def _open_run(url: str) -> Iterator[tuple[RunStore, RunSpec]]:
    """The run at ``url`` and its view, checked with the run key from ``GRADIENTMAIL_RUN_KEY``
    (or ``_FILE``) when set; the mailbox opened here is closed on the way out."""
    mailbox = open_mailbox(url)
    try:
        store = RunStore(mailbox, RunKey.from_env())
        yield store, store.read_spec()
    finally:
        mailbox.close()


def _age(lease: Lease) -> str:
    try:
        renewed = datetime.fromisoformat(lease.renewed_at)
    except ValueError:
        return "?"
    seconds = (datetime.now(timezone.utc) - renewed).total_seconds()
    return f"{seconds:.0f}s ago (writer's clock)"


def status(url: str, rounds: int) -> None:
    with _open_run(url) as (store, spec):
        _print_status(store, spec, rounds)


def _print_status(store: RunStore, spec: RunSpec, rounds: int) -> None:
    manifest = spec.manifest
    algorithm = spec.algorithm
    total = sum(1 for _ in manifest.parameters)
    print(f"run {manifest.run_id}  created by {manifest.created_by} at {manifest.created_at}")
    print(
        f"algorithm: sync_every={algorithm.sync_every} fragments={algorithm.fragments} merge={algorithm.merge.to_manifest()} "
        f"outer_lr={algorithm.outer_lr} outer_momentum={algorithm.outer_momentum} ({algorithm.momentum_rule}) "
        f"quorum_size={algorithm.quorum_size}"
    )
    print(f"model: {total} parameter tensors")
    if spec.manifest.key_id is not None and store.key is None:
        print(f"signed run (key id {spec.manifest.key_id}); no run key given, so nothing below is verified")
    found = store.leases.read(keys.SYNCER_LEASE)
    if found is None:
        print("syncer: no holder yet")
    elif found.lease is None:
        print(f"syncer: lease unusable, nodes replace it: {found.problem}")
    else:
        lease = found.lease
        state = "released" if lease.released else f"renewed {_age(lease)}"
        print(f"syncer: {lease.holder} (term {lease.term}, {state}, run ttl {spec.lease_ttl_s:g}s)")
    print("learners:")
    link_hints = []
    for key in store.leases.learner_keys():
        found = store.leases.read(key)
        if found is None:
            continue
        if found.lease is None:
            print(f"  {key}: unusable lease, not counted as live ({found.problem})")
            continue
        lease = found.lease
        state = "left" if lease.released else f"renewed {_age(lease)}"
        info = " ".join(f"{k}={v}" for k, v in sorted(lease.info.items()) if k not in (LEDGER, LINK))
        print(f"  {lease.holder:<24} {state}  {info}")
        for line in ledger_lines(lease.info.get(LEDGER)):
            print(f"    {line}")
        if LINK in lease.info:
            reading = LinkReading.from_info(lease.info[LINK])
            print(f"    {reading.describe() if reading is not None else 'link: unreadable'}")
            hint = link_hint(lease.holder, reading, spec) if reading is not None and not lease.released else None
            if hint is not None:
                link_hints.append(hint)
    for fragment, names in enumerate(spec.fragments):
        versions = store.committed_versions(fragment)
        newest = versions[-1] if versions else None
        print(f"fragment {fragment}: {len(names)} tensors, newest version {newest}")
        for version in versions[-rounds:]:
            if version == 0:
                continue
            try:
                record = store.read_round(fragment, version)
            except GradientMailError as exc:
                print(f"  v{version:<6} UNREADABLE: {exc}")
                continue
            who = ", ".join(f"{p.learner} w={p.weight:,.0f} ({p.steps} steps)" for p in record.participants)
            rejected = ", ".join(f"{r.learner}:{r.reason}" for r in record.rejected) or "-"
            print(
                f"  v{version:<6} by {record.committed_by} term {record.term}  [{who}]  rejected: {rejected}"
                f"  grace {record.timing.grace_s:.2f}s"
            )
    recent = []
    for fragment in range(len(spec.fragments)):
        for version in store.committed_versions(fragment)[-RECENT_ROUNDS:]:
            try:
                recent.append(store.read_round(fragment, version))
            except GradientMailError:
                continue  # shown as UNREADABLE above, or collected meanwhile
    loss = measure_work_loss(recent)
    for hint in (work_loss_hint(loss, algorithm), carried_work_hint(loss, algorithm), *link_hints):
        if hint is not None:
            print(hint)


def _held_version(store: RunStore, fragment: int, version: int, what: str) -> None:
    """Refuse ``version`` of ``fragment`` when it is not in the mailbox, saying why: never
    committed, or collected by retention (with the versions still held)."""
    held = store.committed_versions(fragment)
    if version in held:
        return
    newest = max(held, default=0)
    if version > newest:
        raise GradientMailError(f"fragment {fragment} has no {what} {version}: its newest is {newest}")
    kept = ", ".join(map(str, held[-12:])) + (" …" if len(held) > 12 else "")
    raise GradientMailError(
        f"retention collected {what} {version} of fragment {fragment} (the run keeps its newest versions and its "
        f"checkpoints, docs/operations.md); still held: {kept}"
    )


def export(url: str, path: str, version: int | None = None) -> None:
    """Write the newest committed model (or every fragment at ``version``) as one safetensors file."""
    target = Path(path)
    if target.is_dir():
        raise GradientMailError(f"export: {path} is a directory; give a file to write, e.g. {target / 'model.safetensors'}")
    with _open_run(url) as (store, spec):
        tensors = {}
        versions = {}
        for fragment in range(len(spec.fragments)):
            chosen = store.newest_version(fragment) if version is None else version
            if chosen is None:
                raise GradientMailError(f"fragment {fragment} has no committed version")
            if version is not None:
                _held_version(store, fragment, chosen, "version")
            tensors.update(store.load_version(spec, fragment, chosen).params)
            versions[str(fragment)] = str(chosen)
    ordered = {p.name: tensors[p.name] for p in spec.manifest.parameters}
    data = payload.encode(ordered, {"run_id": spec.manifest.run_id, **{f"fragment_{k}_version": v for k, v in versions.items()}})
    try:
        with open(target, "wb") as handle:
            handle.write(data)
    except OSError as exc:
        raise GradientMailError(f"export: cannot write {path}: {exc.strerror or exc}") from None
    print(f"wrote {len(ordered)} tensors ({len(data):,} bytes) from versions {versions} to {path}")


def replay(url: str, fragment: int, version: int | None) -> int:
    with _open_run(url) as (store, spec):
        version = version if version is not None else store.newest_version(fragment)
        if not version:
            raise GradientMailError(f"fragment {fragment} has no round to replay")
        _held_version(store, fragment, version, "round")
        record = store.read_round(fragment, version)
        backend = get_backend("numpy")
        try:
            arrays = replay_round(store, backend, spec, fragment, version)
        except KeyNotFound as exc:
            raise GradientMailError(
                f"round {version} of fragment {fragment} cannot be replayed: retention collected its inputs ({exc}); "
                f"a round replays while it is among the run's newest {spec.retention.audit_rounds} (audit_rounds)"
            ) from None
        replayed = payload.encode({n: backend.to_numpy(t) for n, t in arrays.items()})
        same = replayed == store.blobs.read(record.params)
    verdict = "matches the committed bytes" if same else "DIFFERS from the committed bytes"
    print(f"fragment {fragment} version {version}: replay {verdict}")
    return 0 if same else 1


def audit(url: str, digest_log: str | None = None) -> int:
    with _open_run(url) as (store, spec):
        print(f"auditing run {spec.manifest.run_id} at {store.url}")
        log_file = DigestLog(Path(digest_log), spec.manifest.run_id) if digest_log is not None else None
        report = audit_run(store, spec, say=print, digest_log=log_file)
    print(f"audit: {len(report.checked)} checks passed, {len(report.warnings)} warnings, {len(report.failures)} failures")
    return 0 if report.clean else 1


def keygen(out: str | None) -> int:
    """Print a fresh run key, or write it to ``out`` (mode 0600) unless that file exists."""
    key = generate_run_key()
    if out is None:
        print(key)
        return 0
    try:
        descriptor = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        print(f"gradientmail: {out} exists; keeping the key it holds")
        return 0
    with os.fdopen(descriptor, "w") as handle:
        handle.write(key + "\n")
    print(f"gradientmail: wrote a new run key to {out}")
    return 0


NODE_DESCRIPTION = """\
Run one learner node (and syncer candidate), configured only by the GRADIENTMAIL_* variables
below (gradientmail.settings.NodeSettings): what the container images and the Helm chart's pods
run. A GRADIENTMAIL_* variable that is not listed here is refused (exit 2), naming the nearest.
"""

NODE_EXIT_CODES = """\
exit codes:
  0    done: the training script or the default job finished
  1    anything else (a crash, the store unreachable after the node's own retries): retryable,
       a restart may help
  2    bad settings (InvalidConfig): fix the named variable; a restart does not help
  3    the run does not match this node (RunConfigMismatch: algorithm, model or run key);
       a restart does not help
  143  stopped by SIGTERM (docker stop, a pod's termination)
A training script's own exit code (sys.exit, an entry point's return value) is passed on.
"""


def node_help_epilog() -> str:
    """What ``gradientmail node --help`` prints below the usage: every variable, then the exit codes."""
    return f"variables (default in parentheses):\n{describe_variables()}\n\n{NODE_EXIT_CODES}"


EXIT_BROKEN_PIPE = 141
"""What a command whose output pipe closed exits with: a shell's code for a SIGPIPE'd tool."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gradientmail", description="Inspect and export GradientMail runs.")
    parser.add_argument("--version", action="version", version=f"gradientmail {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    status_parser = commands.add_parser("status", help="fragments, versions, last rounds, learners, syncer")
    status_parser.add_argument("mailbox")
    status_parser.add_argument("--rounds", type=int, default=3, help="rounds to show per fragment")
    export_parser = commands.add_parser("export", help="write the newest committed model (or a version) as safetensors")
    export_parser.add_argument("mailbox")
    export_parser.add_argument("file")
    export_parser.add_argument(
        "--version", type=int, default=None, help="every fragment at this committed version (a checkpoint) instead of the newest"
    )
    replay_parser = commands.add_parser("replay", help="recompute a round from its inputs and compare bytes")
    replay_parser.add_argument("mailbox")
    replay_parser.add_argument("--fragment", type=int, required=True)
    replay_parser.add_argument("--version", type=int, default=None)
    audit_parser = commands.add_parser("audit", help="check chains, signatures, blobs and replays from the mailbox alone")
    audit_parser.add_argument("mailbox")
    audit_parser.add_argument(
        "--digest-log",
        default=None,
        metavar="FILE",
        help="remember every record digest in FILE (outside the bucket) and fail on history that changed since",
    )
    keygen_parser = commands.add_parser("keygen", help="make a run key (GRADIENTMAIL_RUN_KEY)")
    keygen_parser.add_argument("--out", default=None, help="write it to this file (mode 0600) unless the file exists")
    commands.add_parser(
        "node",
        help="run a learner node configured by GRADIENTMAIL_* variables (what the images run)",
        description=NODE_DESCRIPTION,
        epilog=node_help_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    minio_parser = commands.add_parser(
        "minio-setup",
        help="create the run's bucket, lifecycle rule and a MinIO user scoped to its prefix; write that user's keys",
        description=minio_setup.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    minio_setup.add_arguments(minio_parser)
    seaweedfs_parser = commands.add_parser(
        "seaweedfs-setup",
        help="write SeaweedFS's identities (root, and a user scoped to the run's prefix) and that user's keys; "
        "or create the bucket and lifecycle rule",
        description=seaweedfs_setup.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    seaweedfs_setup.add_arguments(seaweedfs_parser)
    commands.add_parser("health", help="exit 0 when this node's metrics endpoint answers (the images' health check)")
    simulate_parser = commands.add_parser(
        "simulate",
        help="simulate goodput and S3 requests at scale (Decoupled DiLoCo's Table 1, sweeps)",
        description=simulate_command.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    simulate_command.add_arguments(simulate_parser)
    args = parser.parse_args(argv)
    if args.command in ("node", "health"):
        from gradientmail import node  # imports the training stack only when asked

        return node.main() if args.command == "node" else node.health_main()
    try:
        if args.command == "status":
            status(args.mailbox, args.rounds)
        elif args.command == "export":
            export(args.mailbox, args.file, args.version)
        elif args.command == "audit":
            return audit(args.mailbox, args.digest_log)
        elif args.command == "keygen":
            return keygen(args.out)
        elif args.command == "minio-setup":
            return minio_setup.run(args)
        elif args.command == "seaweedfs-setup":
            return seaweedfs_setup.run(args)
        elif args.command == "simulate":
            return simulate_command.run(args)
        else:
            return replay(args.mailbox, args.fragment, args.version)
    except GradientMailError as exc:
        print(f"gradientmail: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `gradientmail status | head`: the reader left; say nothing more
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's own flush at exit stays quiet
        return EXIT_BROKEN_PIPE
    return 0


if __name__ == "__main__":
    sys.exit(main())
