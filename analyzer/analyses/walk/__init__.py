"""The layer walk: per-layer structure along each device's kernels in time order (GEMM roles, layer
numbers, region stages), as rule modules grouped by what they assume around an engine-neutral
grammar (:mod:`.grammar`); :mod:`analyzer.analyses.classify` runs it."""
