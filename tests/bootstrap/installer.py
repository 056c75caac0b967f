"""How the torch and venv steps install packages: with uv where the venv can have it, else with pip; the same pins
either way, and the same versions resolved (a fresh venv each way here: `pip freeze` identical, 129 lines).

Why uv: the venv step is the set-up's longest, and pip unpacks one wheel after another on one core, where uv
resolves and unpacks in parallel: several times faster here, for the few seconds pip takes to install uv itself
(docs/measuring.md).

uv reads none of pip's configuration, and a machine's pip may be set up to install from disk (a local wheel folder,
a package mirror, constraints): so pip's own settings (`pip config list`, its files and PIP_* variables alike) are
handed to uv as options, and uv takes the best version across all the indexes, as pip does. Where uv cannot be had
or one of its commands fails, pip runs that command: uv is a speed-up, never a requirement. STEPWISE_INSTALLER=pip
uses pip throughout.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from graph import StepFailed

UV = "uv==0.13.8"
PIP = ("install", "-q", "--disable-pip-version-check", "--no-compile")
OPTIONS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
           "constraint": "--constraint"}  # pip's setting -> uv's option (one option for each value)


def uv_options(pip_config: str) -> tuple[list[str], dict]:
    """uv's options and environment for what `pip config list` printed: ``key='value'`` lines, scoped
    (``global.find-links``, ``:env:.find-links``), a value holding one or more whitespace-separated items."""
    options, env, seen = ["--index-strategy", "unsafe-best-match"], {}, set()
    for line in pip_config.splitlines():
        m = re.match(r"^[^.]*\.([a-z-]+)='(.*)'$", line.strip())
        if not m:
            continue
        key, values = m.group(1), m.group(2).split()
        if key == "cert" and values:
            env["SSL_CERT_FILE"] = values[0]
        elif key == "no-index" and values and values[0].lower() in ("1", "true", "yes", "on"):
            seen.add("--no-index")
        for value in values if key in OPTIONS else []:
            if (key, value) not in seen:
                seen.add((key, value))
                options += [OPTIONS[key], value]
    return options + (["--no-index"] if "--no-index" in seen else []), env


class Installer:
    """``install(sh, *args)``: `pip install *args` into the venv of ``python``, through uv where it is had."""

    def __init__(self, python: Path):
        self.python = python
        self.uv = python.parent / "uv"

    def get_uv(self, sh) -> bool:
        """uv in the venv (pip installs it once, pinned); False, said once, where it cannot be had."""
        if os.environ.get("STEPWISE_INSTALLER", "uv") == "pip":
            return False
        if self.uv.exists():
            return True
        try:
            sh(str(self.python), "-m", "pip", *PIP, UV)
        except StepFailed as e:
            sh.say(f"no uv ({str(e)[-200:]}): pip installs")
            return False
        return self.uv.exists()

    def install(self, sh, *args: str) -> None:
        if self.get_uv(sh):
            config = subprocess.run([str(self.python), "-m", "pip", "config", "list"], capture_output=True,
                                    text=True).stdout
            options, env = uv_options(config)
            sh.say(f"uv pip install {' '.join(args)}")
            try:
                return sh(str(self.uv), "pip", "install", "-q", "--python", str(self.python), *options, *args, env=env)
            except StepFailed as e:
                sh.say(f"uv failed ({str(e)[-300:]}): pip installs instead")
        sh(str(self.python), "-m", "pip", *PIP, *args)


if __name__ == "__main__":  # `installer.py VENV_PYTHON ARGS...`: uv pip install ARGS with pip's settings (prepare.sh)
    python = Path(sys.argv[1])
    options, env = uv_options(subprocess.run([str(python), "-m", "pip", "config", "list"], capture_output=True,
                                             text=True).stdout)
    sys.exit(subprocess.run([str(python.parent / "uv"), "pip", "install", "-q", *options, *sys.argv[2:]],
                            env={**os.environ, **env}).returncode)
