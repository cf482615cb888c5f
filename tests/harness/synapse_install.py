"""Installs ``matrix-synapse`` (the reference homeserver) for the tests that
federate with it, into its own virtualenv, once.

The version is :data:`SYNAPSE_VERSION` (the one current on PyPI when it was
last raised). The virtualenv is ``$SYNAPSE_LITE_CACHE/matrix-synapse-<version>``
(default ``~/.cache/synapse_lite``); a finished install is marked with a
``.installed`` file and reused; concurrent installers wait on a lock file, so
a test that needs Synapse while ``.ci/run`` installs it waits for that.
Standard library only: ``.ci/run`` runs it as ``python3
tests/harness/synapse_install.py`` before the project's virtualenv exists.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time

SYNAPSE_VERSION = "1.163.2"
#: How long an install may take (a cold cache downloads ~60 packages).
INSTALL_TIMEOUT_SECONDS = 900


class SynapseUnavailable(Exception):
    """Synapse could not be installed or started here."""


def cache_dir() -> str:
    return os.environ.get("SYNAPSE_LITE_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "synapse_lite"
    )


def venv_dir() -> str:
    return os.path.join(cache_dir(), f"matrix-synapse-{SYNAPSE_VERSION}")


def installed_python() -> str | None:
    """The virtualenv's python when the install is complete, else None."""
    venv = venv_dir()
    if os.path.exists(os.path.join(venv, ".installed")):
        return os.path.join(venv, "bin", "python")
    return None


def install_synapse() -> str:
    """Install (once) and return the virtualenv's python; blocking. Raises
    :class:`SynapseUnavailable` with pip's last words when it fails."""
    os.makedirs(cache_dir(), exist_ok=True)
    with open(os.path.join(cache_dir(), "install.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        python = installed_python()
        if python is not None:
            return python
        venv = venv_dir()
        partial = venv + ".partial"
        shutil.rmtree(partial, ignore_errors=True)
        started = time.monotonic()
        # pip must see the new virtualenv only, not the PYTHONPATH of a
        # trial worker (-j), or it takes our packages as installed.
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        try:
            subprocess.run(
                [sys.executable, "-m", "venv", partial],
                check=True,
                capture_output=True,
                timeout=120,
                env=env,
            )
            subprocess.run(
                [
                    os.path.join(partial, "bin", "python"),
                    "-m",
                    "pip",
                    "install",
                    "-q",
                    f"matrix-synapse=={SYNAPSE_VERSION}",
                ],
                check=True,
                capture_output=True,
                text=True,
                timeout=INSTALL_TIMEOUT_SECONDS,
                env=env,
            )
        except subprocess.CalledProcessError as e:
            # pip's last lines say why; its warnings about unused index
            # locations do not.
            lines = [
                line
                for line in (e.stderr or e.stdout or "").splitlines()
                if line.strip() and not line.startswith("WARNING: Location")
            ]
            tail = "\n".join(lines[-5:])[-2000:]
            raise SynapseUnavailable(
                f"installing matrix-synapse=={SYNAPSE_VERSION} failed: {tail}"
            ) from e
        except (OSError, subprocess.TimeoutExpired) as e:
            raise SynapseUnavailable(f"installing matrix-synapse failed: {e}") from e
        # The venv works from its new place: it is always run as
        # `<venv>/bin/python -m ...`, never through its scripts' shebangs.
        shutil.rmtree(venv, ignore_errors=True)
        os.rename(partial, venv)
        with open(os.path.join(venv, ".installed"), "w") as f:
            f.write(f"{SYNAPSE_VERSION} installed in {time.monotonic() - started:.0f}s\n")
        return os.path.join(venv, "bin", "python")


#: The reference's ``postgres`` and ``redis`` extras, which its workers
#: need (PostgreSQL only, replication over Redis); its own bounds.
WORKER_EXTRAS = ("psycopg2-binary>=2.8", "txredisapi>=1.4.12,<1.6.0", "hiredis")


def workers_venv_dir() -> str:
    return venv_dir() + "-workers"


def installed_workers_python() -> str | None:
    """The python of the workers' layer (:func:`install_synapse_workers`)
    when that install is complete, else None; installs nothing."""
    venv = workers_venv_dir()
    if os.path.exists(os.path.join(venv, ".installed")):
        return os.path.join(venv, "bin", "python")
    return None


def install_synapse_workers() -> str:
    """Install (once) and return the python of a virtualenv that runs the
    reference with workers: the base install (:func:`install_synapse`)
    seen through a ``.pth`` file, plus :data:`WORKER_EXTRAS`. A layer of
    its own, so that the base virtualenv, which tests may be running,
    is never changed. Blocking; raises :class:`SynapseUnavailable`."""
    base = install_synapse()
    venv = workers_venv_dir()
    python = os.path.join(venv, "bin", "python")
    with open(os.path.join(cache_dir(), "install.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if installed_workers_python() is not None:
            return python
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        try:
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run(
                [sys.executable, "-m", "venv", venv], check=True, capture_output=True, env=env
            )
            paths = [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
            purelib = subprocess.run(
                paths, check=True, capture_output=True, text=True, env=env
            ).stdout.strip()
            base_paths = [base, *paths[1:]]
            base_purelib = subprocess.run(
                base_paths, check=True, capture_output=True, text=True, env=env
            ).stdout.strip()
            with open(os.path.join(purelib, "matrix_synapse_base.pth"), "w") as f:
                f.write(base_purelib + "\n")
            # No dependencies: the base has them (Twisted, six).
            subprocess.run(
                [python, "-m", "pip", "install", "-q", "--no-deps", *WORKER_EXTRAS],
                check=True,
                capture_output=True,
                text=True,
                timeout=INSTALL_TIMEOUT_SECONDS,
                env=env,
            )
        except subprocess.CalledProcessError as e:
            raise SynapseUnavailable(
                f"installing the reference's worker extras failed: {(e.stderr or '')[-1500:]}"
            ) from e
        except (OSError, subprocess.TimeoutExpired) as e:
            raise SynapseUnavailable(f"installing the reference's worker extras failed: {e}") from e
        with open(os.path.join(venv, ".installed"), "w") as f:
            f.write(f"{SYNAPSE_VERSION} with {' '.join(WORKER_EXTRAS)}\n")
        return python


def main() -> None:
    """``--workers``: also the layer for the reference's workers
    (:func:`install_synapse_workers`), whose python is printed."""
    started = time.monotonic()
    try:
        python = install_synapse_workers() if "--workers" in sys.argv else install_synapse()
    except SynapseUnavailable as e:
        sys.exit(str(e))
    print(f"matrix-synapse {SYNAPSE_VERSION}: {python} ({time.monotonic() - started:.0f}s)")


if __name__ == "__main__":
    main()
