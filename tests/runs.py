"""The one analysis path (``analyzer.runtime.driver``) with the keyword arguments tests use.

Every test that analyses a trace file goes through :func:`analyzer.runtime.driver.analyze`, as the
CLI and the Python API do; these wrappers only spell its :class:`RunPolicy` as keywords.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from analyzer.model import Trace
from analyzer.options import Options
from analyzer.pipeline import Analysis
from analyzer.runtime import driver


def analyze_paths(paths: Sequence[str], options: Options | None = None, progress: Any = None) -> Analysis:
    """The run of ``paths``, read in this process, host ops kept (tests look at them)."""
    return driver.analyze(paths, options, driver.RunPolicy(keep_host_ops=True, progress=progress))


def analyze_run(paths: Sequence[str], options: Options | None = None, **policy: Any) -> Analysis:
    """The run of ``paths`` as the CLI analyses it (workers for several inputs, host ops dropped)."""
    return driver.analyze(paths, options, driver.RunPolicy(**policy))


def load_inputs(paths: Sequence[str], progress: Any = None, **policy: Any) -> Trace:
    """The joined trace of ``paths``, as :func:`analyze` loads it."""
    return driver.load_inputs(paths, driver.RunPolicy(progress=progress, **policy))
