"""A run's newest committed parameters loaded into a model without joining the run (``gm.align``).

For evaluation and inference jobs beside a run: they read what the syncer committed, verified as a
learner verifies it (records signed under the run key, blobs checked against their digest), and
write nothing: no lease, no contribution, no manifest. The model must match the run's parameters
(names, shapes, dtypes, order), as a joining learner must::

    versions = gm.align(model, mailbox="s3://bucket/runs/example?region=eu-west-1")
    evaluate(model)  # at versions[f] of each fragment f
"""

from __future__ import annotations

import logging
from typing import Any

from gradientmail.backends import Backend, backend_for, get_backend
from gradientmail.errors import GradientMailError, RunConfigMismatch
from gradientmail.mailbox import Mailbox, open_mailbox
from gradientmail.records import keys
from gradientmail.records.auth import RunKey
from gradientmail.session.group import unwrap_model
from gradientmail.session.join import checked_manifest, model_signature, newest_readable, parameter_differences
from gradientmail.store import RunSpec, RunStore

__all__ = ["align"]

log = logging.getLogger(__name__)


def align(
    model: Any,
    *,
    mailbox: Mailbox | str,
    run_key: str | RunKey | None = None,
    backend: str | Backend | None = None,
) -> tuple[int, ...]:
    """Load the run's newest committed parameters into ``model``; return the version loaded of
    each fragment, in fragment order.

    ``mailbox`` is a mailbox or its URL (one opened here is closed on return); ``run_key`` as for
    :class:`~gradientmail.Session` (else ``GRADIENTMAIL_RUN_KEY``/``_FILE``); ``backend`` overrides
    the framework guess. Every fragment is read and verified before any is written, so the model
    is either wholly at the returned versions or unchanged. A fragment whose newest version no
    longer reads (collected meanwhile) is loaded one version back, as a joining learner would be.

    Raises:
        GradientMailError: no run at ``mailbox``, or a fragment with no readable version.
        RunConfigMismatch: the model's parameters differ from the run's (each difference named),
            or the run key does not match the run's.
    """
    model = unwrap_model(model)
    chosen: Backend = get_backend(backend) if isinstance(backend, str) else backend or backend_for(model)
    box = open_mailbox(mailbox) if isinstance(mailbox, str) else mailbox
    try:
        store = RunStore(box, RunKey.given(run_key))
        manifest = checked_manifest(store)
        if manifest is None:
            raise GradientMailError(f"no run at {store.url}: {keys.MANIFEST} is missing")
        problems = parameter_differences(manifest, model_signature(chosen, model))
        if problems:
            raise RunConfigMismatch(problems)
        spec = RunSpec.from_manifest(manifest)
        versions: list[int] = []
        loaded: dict[str, Any] = {}
        for fragment in range(len(spec.fragments)):
            record, params = newest_readable(store, spec, fragment)
            versions.append(record.version)
            loaded.update({name: chosen.from_numpy(array) for name, array in params.items()})
    finally:
        if isinstance(mailbox, str):
            box.close()
    chosen.write_parameters(model, loaded)
    log.info("loaded versions %s of run %s", versions, manifest.run_id)
    return tuple(versions)
